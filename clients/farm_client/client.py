"""A small gRPC client for trainers and scripts. It speaks only the wire contract (``farm.v1``).

    with FarmClient("127.0.0.1:7431") as farm:
        for batch in farm.batches("grpo-trainer", batch_size=64, whole_groups=True, tensors=True):
            loss = ... batch.advantages ...            # torch tensors, one row per trajectory
            farm.ack(batch)                            # at least once: un-acked batches come again
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc

_CHUNK = 1 << 20
_RETRY_S = 0.2


@dataclass
class Batch:
    """Scored trajectories from the stream; ``up_to`` is what ``ack`` moves the cursor to."""

    consumer: str
    whole_groups: bool
    up_to: int
    trajectories: list[dict[str, Any]]
    rewards: Any = None
    """torch.FloatTensor of rewards, with ``tensors=True``."""
    advantages: Any = None
    """torch.FloatTensor of group-relative advantages (reward minus its group's mean, over the
    group's standard deviation), with ``tensors=True``."""
    group_ids: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.trajectories)


def _trajectory(t: farm_pb2.Trajectory) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": t.id, "seq": t.seq, "group_id": t.group_id, "env": t.env, "env_version": t.env_version,
        "seed": t.seed, "difficulty": t.difficulty, "agent": t.agent, "policy_version": t.policy_version,
        "reward": t.reward, "passed": t.passed, "status": t.status, "reasons": list(t.reasons),
        "flags": list(t.flags), "verifier_version": t.verifier_version, "node": t.node, "finished_at": t.finished_at,
    }
    if t.steps_json:
        out["steps"] = json.loads(t.steps_json)
        out["final"] = t.final
    return out


def advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """Group-relative advantages (GRPO): each reward against its group's mean and spread."""
    by_group: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        by_group.setdefault(g, []).append(r)
    stats = {}
    for g, rs in by_group.items():
        mean = sum(rs) / len(rs)
        std = (sum((r - mean) ** 2 for r in rs) / len(rs)) ** 0.5
        stats[g] = (mean, std)
    return [(r - stats[g][0]) / (stats[g][1] + 1e-6) for r, g in zip(rewards, groups, strict=True)]


class FarmClient:
    """``FarmClient("host:port", token=None)``; use as a context manager or call ``close()``."""

    def __init__(self, addr: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.addr = addr
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout_s
        self._channel = grpc.insecure_channel(addr, options=[
            ("grpc.max_receive_message_length", 64 << 20),
            # A farmd that restarts is back in seconds; grpc's default backoff (up to two minutes)
            # would keep a trainer waiting long after, and a subchannel shared with other clients
            # in the process would fail this one's first call with their stale error.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
            ("grpc.use_local_subchannel_pool", 1),
        ])
        self._stub = farm_pb2_grpc.FarmStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the farm ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        reply = self._stub.Status(farm_pb2.StatusRequest(), metadata=self._metadata, timeout=self._timeout)
        return {
            "version": reply.version, "node": reply.node, "uptime_s": reply.uptime_s,
            "isolation_ok": reply.isolation_ok,
            "isolation": [{"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix} for c in reply.isolation],
            "workers": reply.workers, "max_boxes": reply.max_boxes, "policy_version": reply.policy_version,
            **(json.loads(reply.farm_json) if reply.farm_json else {}),
        }

    def run(self, env: str, agent: str, rollouts: int, group_size: int = 0) -> dict[str, Any]:
        reply = self._stub.Run(farm_pb2.RunRequest(env=env, agent=agent, rollouts=rollouts, group_size=group_size),
                               metadata=self._metadata, timeout=self._timeout)
        return {"group_ids": list(reply.group_ids), "jobs": reply.jobs}

    def progress(self, group_ids: list[int]) -> dict[str, int]:
        totals = {"jobs": 0, "done": 0, "failed": 0, "passed": 0}
        per_call = 100_000  # ids a call carries: farmd takes request messages of about a megabyte
        for start in range(0, max(1, len(group_ids)), per_call):
            reply = self._stub.Progress(farm_pb2.ProgressRequest(group_ids=group_ids[start:start + per_call]),
                                        metadata=self._metadata, timeout=self._timeout)
            for key in totals:
                totals[key] += getattr(reply, key)
        return totals

    def trajectories(self, env: str = "", limit: int = 50, after_seq: int = 0, newest_first: bool = False,
                     include_steps: bool = False) -> list[dict[str, Any]]:
        reply = self._stub.ListTrajectories(
            farm_pb2.ListTrajectoriesRequest(env=env, limit=limit, after_seq=after_seq, newest_first=newest_first,
                                             include_steps=include_steps),
            metadata=self._metadata, timeout=self._timeout)
        return [_trajectory(t) for t in reply.trajectories]

    def trajectory(self, traj_id: int) -> dict[str, Any]:
        return _trajectory(self._stub.GetTrajectory(farm_pb2.GetTrajectoryRequest(id=traj_id),
                                                    metadata=self._metadata, timeout=self._timeout))

    def rescore(self, env: str, limit: int = 0) -> dict[str, Any]:
        reply = self._stub.Rescore(farm_pb2.RescoreRequest(env=env, limit=limit), metadata=self._metadata)
        return {"scored": reply.scored, "already": reply.already, "errors": reply.errors,
                "verifier_version": reply.verifier_version}

    # -- the trainer's side -----------------------------------------------------------------------

    def batches(self, consumer: str, batch_size: int = 64, *, whole_groups: bool = False, max_staleness: int = 0,
                include_steps: bool = False, tensors: bool = False, reconnect_s: float = 0.0) -> Iterator[Batch]:
        """Scored trajectories, batch by batch, from just after ``consumer``'s last ack; blocks for more.

        At least once: what was not acked comes again when the stream is reopened. With
        ``reconnect_s`` the stream survives a farmd restart, reopening for up to that many
        seconds; ack each batch before taking the next and none is received twice.
        """
        request = farm_pb2.StreamRequest(consumer=consumer, batch_size=batch_size, whole_groups=whole_groups,
                                         max_staleness=max_staleness, include_steps=include_steps)
        down_since: float | None = None
        while True:
            stream = self._stub.StreamTrajectories(request, metadata=self._metadata)
            try:
                parts: list[farm_pb2.Trajectory] = []
                for reply in stream:
                    down_since = None
                    parts.extend(reply.trajectories)
                    if reply.more:  # a batch too big for one message continues in the next
                        continue
                    whole, parts = parts, []
                    if not whole:
                        continue  # only stale ones: the next batch's up_to covers them
                    yield self._batch(whole, reply.up_to, consumer, whole_groups, tensors)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or not reconnect_s:
                    raise
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > reconnect_s:
                    raise
                time.sleep(_RETRY_S)
            finally:
                stream.cancel()  # type: ignore[no-untyped-call]

    @staticmethod
    def _batch(trajectories: list[farm_pb2.Trajectory], up_to: int, consumer: str, whole_groups: bool,
               tensors: bool) -> Batch:
        rows = [_trajectory(t) for t in trajectories]
        batch = Batch(consumer=consumer, whole_groups=whole_groups, up_to=up_to, trajectories=rows,
                      group_ids=[r["group_id"] for r in rows])
        if tensors:
            import torch  # optional: only trainers that ask for tensors need it

            rewards = [r["reward"] for r in rows]
            batch.rewards = torch.tensor(rewards, dtype=torch.float32)
            batch.advantages = torch.tensor(advantages(rewards, batch.group_ids), dtype=torch.float32)
        return batch

    def ack(self, batch_or_consumer: Batch | str, up_to: int | None = None, whole_groups: bool = False,
            retry_s: float = 0.0) -> int:
        """Acknowledge a batch (or ``consumer`` up to ``up_to``); returns the consumer's cursor.

        With ``retry_s`` an unreachable farmd is retried for that long: acks are idempotent.
        """
        if isinstance(batch_or_consumer, Batch):
            consumer, up_to, whole_groups = (batch_or_consumer.consumer, batch_or_consumer.up_to,
                                             batch_or_consumer.whole_groups)
        else:
            consumer = batch_or_consumer
        request = farm_pb2.AckRequest(consumer=consumer, up_to=up_to or 0, whole_groups=whole_groups)
        deadline = time.monotonic() + retry_s
        while True:
            try:
                reply = self._stub.Ack(request, metadata=self._metadata, timeout=self._timeout)
                return int(reply.cursor)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(_RETRY_S)

    def publish_policy(self, policy: Any = None, *, uri: str | None = None) -> dict[str, Any]:
        """Publish a policy: bytes, a torch state_dict (saved with torch.save), or a ``uri``."""
        if policy is None and uri is None:
            raise ValueError("publish bytes, a state_dict, or a uri")
        data = b""
        if policy is not None:
            if isinstance(policy, bytes | bytearray):
                data = bytes(policy)
            else:
                import torch

                buf = io.BytesIO()
                torch.save(policy, buf)
                data = buf.getvalue()
        digest = hashlib.sha256(data if data else (uri or "").encode()).hexdigest()

        def chunks() -> Iterator[farm_pb2.PolicyChunk]:
            yield farm_pb2.PolicyChunk(sha256=digest, uri=uri or "", data=data[:_CHUNK])
            for start in range(_CHUNK, len(data), _CHUNK):
                yield farm_pb2.PolicyChunk(data=data[start:start + _CHUNK])

        reply = self._stub.PublishPolicy(chunks(), metadata=self._metadata, timeout=self._timeout * 10)
        return {"version": reply.version, "sha256": reply.sha256, "size": reply.size}

    def get_policy(self, sha256: str = "") -> tuple[int, bytes, str]:
        """(version, content, uri) of a policy by hash, or of the latest one."""
        data = bytearray()
        version, uri = 0, ""
        for chunk in self._stub.GetPolicy(farm_pb2.GetPolicyRequest(sha256=sha256), metadata=self._metadata,
                                          timeout=self._timeout * 10):
            version = version or chunk.version
            uri = uri or chunk.uri
            data += chunk.data
        return version, bytes(data), uri
