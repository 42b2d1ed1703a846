"""Trajectories on the wire: the record as a proto, and replies packed so that any batch fits.

A stored trajectory is bounded (``Trajectory.sealed``), so one always fits a message with room to
spare; a batch of many, or a whole group with its steps, may not. Batches go out as one message
or several in a row (``Batch.more``), each under ``MESSAGE_BUDGET_BYTES``; lists are cut to what
fits one reply and page on. A stream is never failed by what an attempt stored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from farm.v1 import farm_pb2, trajectory_pb2
from farm_client.convert import to_message

from farmd import domain
from farmd.records import Trajectory
from farmd.store.verdicts import VerdictChange

log = logging.getLogger("farmd.api.trajectories")

MESSAGE_BUDGET_BYTES = 8 << 20
"""Trajectories per message stop before this many bytes: well under the send limit, and small enough
that one message never holds a stream (or a trainer's memory) for long."""

MESSAGE_RECORDS = 64
"""Trajectories per message at most: a trainer reads one message while farmd builds the next, so a batch
of hundreds reaches its learner about one message's build after it was read, not after the whole batch's."""


def trajectory_pb(t: Trajectory) -> trajectory_pb2.Trajectory:
    return _sized(t)[0]


def _sized(t: Trajectory) -> tuple[trajectory_pb2.Trajectory, int]:
    """The message and its size (computing a size serializes the message: done once). A record the wire
    cannot carry goes as the stub that says so: the store serves every record it reads checked
    (``farmd.domain``), so this is the last guard, for what that check does not know of."""
    try:
        message = to_message(t, trajectory_pb2.Trajectory())
        size = message.ByteSize()
        if size > MESSAGE_BUDGET_BYTES:  # a record from before bounds were kept: cut it on the way out
            message = to_message(t.sealed(), trajectory_pb2.Trajectory())
            size = message.ByteSize()
    except Exception as exc:  # whatever a field's value makes protobuf raise (ValueError, TypeError, ...)
        log.error("trajectory %s cannot be sent as a record (%s: %s): sent as an unreadable stub", t.id,
                  type(exc).__name__, str(exc)[:300], extra={"event": "unreadable_trajectory", "trajectory": t.id})
        stub = domain.unreadable({name: getattr(t, name, None) for name in _STUB_FIELDS},
                                 f"the wire record refused it: {type(exc).__name__}: {str(exc)[:200]}")
        message = to_message(stub, trajectory_pb2.Trajectory())
        size = message.ByteSize()
    return message, size


_STUB_FIELDS = ("id", "seq", "group_id", "run_id", "env", "env_version", "seed", "difficulty", "agent",
                "policy_version", "verifier_version", "node", "finished_at", "verdict_version")


def batch_messages(trajectories: list[Trajectory], up_to: int) -> Iterator[farm_pb2.StreamTrajectoriesResponse]:
    """One batch as stream messages: as many trajectories per message as fit the budget, at least one and
    at most ``MESSAGE_RECORDS``; every message but the last says ``more``, and only the last carries ``up_to``."""
    chunk: list[trajectory_pb2.Trajectory] = []
    size = 0
    for t in trajectories:
        message, n = _sized(t)
        if chunk and (size + n > MESSAGE_BUDGET_BYTES or len(chunk) >= MESSAGE_RECORDS):
            yield farm_pb2.StreamTrajectoriesResponse(trajectories=chunk, more=True)
            chunk, size = [], 0
        chunk.append(message)
        size += n
    yield farm_pb2.StreamTrajectoriesResponse(trajectories=chunk, up_to=up_to)


def change_pb(c: VerdictChange) -> farm_pb2.VerdictChange:
    """A trajectory whose verdict changed, with every verdict it had (each score converts like a record's)."""
    message = farm_pb2.VerdictChange(trajectory_id=c.trajectory_id, env=c.env, verdict_version=c.verdict_version,
                                     withdrawn=c.withdrawn, withdrawal_reason=c.withdrawal_reason)
    for score in c.scores:
        to_message(score, message.scores.add())
    return message


def fitting_changes(changes: list[VerdictChange]) -> list[farm_pb2.VerdictChange]:
    """The leading changes that fit one reply (at least one); the caller pages on from the last."""
    out: list[farm_pb2.VerdictChange] = []
    size = 0
    for c in changes:
        message = change_pb(c)
        size += message.ByteSize()
        if out and size > MESSAGE_BUDGET_BYTES:
            break
        out.append(message)
    return out


def fitting(trajectories: list[Trajectory]) -> list[trajectory_pb2.Trajectory]:
    """The leading trajectories that fit one reply (at least one); the caller pages on from the last."""
    out: list[trajectory_pb2.Trajectory] = []
    size = 0
    for t in trajectories:
        message, n = _sized(t)
        size += n
        if out and size > MESSAGE_BUDGET_BYTES:
            break
        out.append(message)
    return out
