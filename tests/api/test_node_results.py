"""A node's results are held to the record's domain on the coordinator: one out of it is refused (never stored,
its job runs again), and the records beside it in the same message are stored. The node here is a bare gRPC
client on a real farmd's NodeService, sending what a node that lies would send."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
from farm.v1 import farm_pb2, node_pb2, node_pb2_grpc, trajectory_pb2
from farm_client import FarmClient
from farm_client.convert import duration, to_message

from farmd.records import PosedTask, Timings, Trajectory, Turn

NAME = "liar"
OWNER = f"{NAME}:1:ab"


class BareNode:
    """One NodeService.Work stream: requests put on a queue, replies read in order."""

    def __init__(self, addr: str) -> None:
        self._channel = grpc.insecure_channel(addr)
        self._out: queue.Queue[node_pb2.WorkRequest | None] = queue.Queue()
        self._replies = node_pb2_grpc.NodeServiceStub(self._channel).Work(self._requests(), timeout=60)
        self._next = 0
        self._lock = threading.Lock()

    def _requests(self) -> Iterator[node_pb2.WorkRequest]:
        while (request := self._out.get()) is not None:
            yield request

    def ask(self, **kind: Any) -> node_pb2.WorkResponse:
        with self._lock:
            self._next += 1
            self._out.put(node_pb2.WorkRequest(id=self._next, **kind))
            reply: node_pb2.WorkResponse = next(self._replies)
            assert reply.reply_to == self._next and not reply.error, reply
            return reply

    def close(self) -> None:
        self._out.put(None)
        self._replies.cancel()
        self._channel.close()


def record(job: node_pb2.LeasedJob, **changes: Any) -> bytes:
    """A record of ``job`` as its lease says, with a wrong answer scored 0 (what any re-verification agrees
    with), changed by ``changes``."""
    t = Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                   difficulty=job.difficulty, agent=job.agent, policy_version=job.policy_version, reward=0.0,
                   passed=False, status="ok", reasons=["wrong"], flags=[], verifier_version="1", final="no",
                   task=PosedTask(prompt="1+2="),
                   turns=[Turn(message_index=1, prompt_messages=1, completion="no", prompt_token_ids=[1, 2],
                               token_ids=[3, 4], logprobs=[-0.5, -0.5], has_logprobs=True)])
    return to_message(replace(t, **changes), trajectory_pb2.Trajectory()).SerializeToString()


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


LIES: list[dict[str, Any]] = [
    {"reward": math.nan},
    {"reward": 5.0, "passed": True},
    {"reward": -1.0},
    {"reward": 0.0, "passed": True},
    {"turns": [Turn(message_index=1, prompt_messages=1, token_ids=[3, 2 ** 31], logprobs=[-0.5, -0.5],
                    has_logprobs=True)]},
    {"turns": [Turn(message_index=1, prompt_messages=1, token_ids=[3, 4], logprobs=[-0.5, 0.5], has_logprobs=True)]},
    {"turns": [Turn(message_index=1, prompt_messages=1, token_ids=[3, 4], logprobs=[math.nan, -0.5],
                    has_logprobs=True)]},
    {"verdict_details": deep(30)},
    {"timings": Timings(total=-5.0)},
    {"finished_at": 1e13},
]


def hello(node: BareNode) -> None:
    welcome = node.ask(hello=node_pb2.NodeHello(
        name=NAME, owner=OWNER, capacity=64, version="0",
        isolation=[farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="bubblewrap")]))
    assert welcome.welcome.name == NAME


def test_a_token_its_policy_cannot_sample_is_refused(running_farm) -> None:  # type: ignore[no-untyped-def]
    """The coordinator reads each tiny LM version's vocabulary once: a node saying its rollout of that version
    sampled a token past it (within int32, so only the vocabulary tells) is refused with why; one inside is stored."""
    from farm_client import tinylm

    farm = running_farm("--workers", "0")
    vocab = tinylm.LMConfig().vocab_size
    with FarmClient(farm.addr) as client:
        client.publish_policy(tinylm.save(tinylm.TinyLM(tinylm.LMConfig())), name="tiny")
        client.run("arith", "torch:tiny", rollouts=2, group_size=2)
    node = BareNode(farm.addr)
    try:
        hello(node)
        jobs = sorted(node.ask(lease=node_pb2.LeaseRequest(n=64, wait=duration(1.0))).leased.jobs, key=lambda j: j.id)
        assert len(jobs) == 2 and all(j.policy_version == 1 for j in jobs)
        inside, past = (Turn(message_index=1, prompt_messages=1, prompt_token_ids=[1, 2], token_ids=[3, token],
                             logprobs=[-0.5, -0.5], has_logprobs=True) for token in (vocab - 1, vocab))
        parts = [node_pb2.ResultPart(job_id=job.id, owner=OWNER, data=record(job, turns=[turn]), last=True)
                 for job, turn in zip(jobs, (inside, past), strict=True)]
        reply = node.ask(results=node_pb2.ResultsRequest(parts=parts)).results
    finally:
        node.close()
    assert list(reply.stored) == [jobs[0].id], reply
    (refused,) = reply.refused
    assert refused.job_id == jobs[1].id and f"the vocabulary has {vocab} tokens" in refused.reason, refused.reason


def test_a_node_s_records_out_of_their_domain_are_refused_and_the_rest_stored(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    with FarmClient(farm.addr) as client:
        client.run("arith", "reference", rollouts=2 * (len(LIES) + 1), group_size=2)
    node = BareNode(farm.addr)
    try:
        hello(node)
        jobs = sorted(node.ask(lease=node_pb2.LeaseRequest(n=64, wait=duration(1.0))).leased.jobs, key=lambda j: j.id)
        assert len(jobs) == 2 * (len(LIES) + 1)
        honest = jobs[:len(jobs) - len(LIES)]
        lying = jobs[len(honest):]
        parts = [node_pb2.ResultPart(job_id=j.id, owner=OWNER, data=record(j), last=True) for j in honest]
        parts += [node_pb2.ResultPart(job_id=j.id, owner=OWNER, data=record(j, **lie), last=True)
                  for j, lie in zip(lying, LIES, strict=True)]
        reply = node.ask(results=node_pb2.ResultsRequest(parts=parts)).results
    finally:
        node.close()
    assert sorted(reply.stored) == [j.id for j in honest], "the honest records beside the lies are stored"
    assert sorted(reply.handled) == [j.id for j in jobs], "every record was dealt with: a lie is not stored"
    told = {r.job_id: r.reason for r in reply.refused}
    assert sorted(told) == [j.id for j in lying] and all("out of its domain" in why for why in told.values()), told
    with FarmClient(farm.addr) as client:
        stored = client.trajectories(limit=100, full=True)
        assert sorted(t.id for t in stored) == [j.id for j in honest]
        assert all(math.isfinite(t.reward) and 0.0 <= t.reward <= 1.0 for t in stored)
    log = farm.log.read_text()
    assert "out of its domain" in log and "reward is nan" in log, log[-3000:]
