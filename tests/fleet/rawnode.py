"""A node's credential speaking ``NodeService.Work`` itself: what a node that lies can send, byte for byte, with
no farmd in between to keep it honest."""

from __future__ import annotations

import itertools
import queue
from collections.abc import Iterator
from typing import Any

import grpc
from farm.v1 import farm_pb2, node_pb2, node_pb2_grpc, trajectory_pb2
from farm_client.convert import duration, to_message

from farmd.records import Trajectory

ISOLATED = [farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="bubblewrap 0.11")]


class RawNode:
    """Joins ``addr`` as ``name`` (its hello says the host isolates) and makes one request at a time."""

    def __init__(self, addr: str, name: str, *, token: str | None = None, capacity: int = 64) -> None:
        self.name = name
        self.owner = f"{name}:1:raw"
        self._ids = itertools.count(1)
        self._requests: queue.Queue[node_pb2.WorkRequest | None] = queue.Queue()
        self._channel = grpc.insecure_channel(addr)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._replies: Iterator[node_pb2.WorkResponse] = node_pb2_grpc.NodeServiceStub(self._channel).Work(
            self._outgoing(), metadata=metadata)
        self.welcome = self.call(hello=node_pb2.NodeHello(name=name, owner=self.owner, capacity=capacity, version="0",
                                                          isolation=ISOLATED)).welcome

    def _outgoing(self) -> Iterator[node_pb2.WorkRequest]:
        while (message := self._requests.get()) is not None:
            yield message

    def call(self, **kind: Any) -> node_pb2.WorkResponse:
        """One request and its reply (one at a time, so replies come in order); grpc.RpcError if the stream ended."""
        message_id = next(self._ids)
        self._requests.put(node_pb2.WorkRequest(id=message_id, **kind))
        reply = next(self._replies)
        assert reply.reply_to == message_id, (reply.reply_to, message_id)
        assert not reply.error, reply.error
        return reply

    def lease(self, n: int = 64, wait_s: float = 1.0) -> list[node_pb2.LeasedJob]:
        return list(self.call(lease=node_pb2.LeaseRequest(n=n, wait=duration(wait_s))).leased.jobs)

    def report(self, records: list[Trajectory]) -> node_pb2.ResultsReply:
        parts = [node_pb2.ResultPart(job_id=t.id, owner=self.owner, last=True,
                                     data=to_message(t, trajectory_pb2.Trajectory()).SerializeToString())
                 for t in records]
        return self.call(results=node_pb2.ResultsRequest(parts=parts)).results

    def close(self) -> None:
        self._requests.put(None)
        self._channel.close()


def record(job: node_pb2.LeasedJob, final: str, *, passed: bool, reward: float, **changed: Any) -> Trajectory:
    """The record an honest node's runner would build for ``job``, with ``final`` and the given verdict;
    ``changed`` overrides any field (what a lying node sends)."""
    fields: dict[str, Any] = {
        "id": job.id, "group_id": job.group_id, "env": job.env, "env_version": "1", "seed": job.seed,
        "difficulty": job.difficulty, "agent": job.agent, "policy_version": job.policy_version, "reward": reward,
        "passed": passed, "status": "ok", "reasons": [], "flags": [], "verifier_version": "1", "final": final}
    fields.update(changed)
    return Trajectory(**fields)
