"""Trajectories on the wire (``farmd/api/trajectories.py``): a batch's messages are bounded in count as well as
in bytes, and only the last can be acked."""

from __future__ import annotations

from farm.v1 import trajectory_pb2
from farm_client.convert import from_message

from farmd.api.trajectories import MESSAGE_RECORDS, batch_messages
from farmd.records import Trajectory


def _record(i: int) -> Trajectory:
    return Trajectory(id=i, group_id=i // 8, env="arith", env_version="1", seed=i, difficulty=1, agent="reference",
                      policy_version=0, reward=1.0, passed=True, status="ok", reasons=[], flags=[],
                      verifier_version="1", final=str(i), node="n1")


def test_a_batch_of_hundreds_goes_as_messages_of_at_most_message_records() -> None:
    records = [_record(i) for i in range(1, 2 * MESSAGE_RECORDS + 23)]
    messages = list(batch_messages(records, up_to=777))
    assert [len(m.trajectories) for m in messages] == [MESSAGE_RECORDS, MESSAGE_RECORDS, 22]
    assert [m.more for m in messages] == [True, True, False]
    assert [m.up_to for m in messages] == [0, 0, 777], "only the batch's last message can be acked"
    back = [from_message(t, Trajectory) for m in messages for t in m.trajectories]
    assert back == records


def test_a_batch_that_fits_one_message_is_one_message() -> None:
    messages = list(batch_messages([_record(i) for i in range(1, MESSAGE_RECORDS + 1)], up_to=5))
    assert [(len(m.trajectories), m.more, m.up_to) for m in messages] == [(MESSAGE_RECORDS, False, 5)]
    empty = list(batch_messages([], up_to=9))
    assert [(len(m.trajectories), m.more, m.up_to) for m in empty] == [(0, False, 9)]
    assert isinstance(messages[0].trajectories[0], trajectory_pb2.Trajectory)
