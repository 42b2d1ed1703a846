"""The ``farm.v1.Farm`` servicer: protos in, services called, protos out. No logic of its own."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc

from farmd.agents import make_agent
from farmd.api.errors import guarded
from farmd.envs import Attempt, VerifyContext, get, verify_safely
from farmd.errors import BadRequest, FarmError
from farmd.node import NodeInfo
from farmd.records import Trajectory
from farmd.scheduler import Scheduler
from farmd.store import Store

MAX_ROLLOUTS = 1_000_000
MAX_GROUP = 1024
MAX_BATCH = 4096
MAX_POLICY_BYTES = 4 << 30
_POLICY_CHUNK = 1 << 20
_STREAM_POLL_S = 1.0


def trajectory_pb(t: Trajectory, steps: bool = True) -> farm_pb2.Trajectory:
    return farm_pb2.Trajectory(
        id=t.id, seq=t.seq, group_id=t.group_id, env=t.env, env_version=t.env_version, seed=t.seed,
        difficulty=t.difficulty, agent=t.agent, policy_version=t.policy_version, reward=t.reward, passed=t.passed,
        status=t.status, reasons=t.reasons, flags=t.flags, verifier_version=t.verifier_version, node=t.node,
        finished_at=t.finished_at, steps_json=json.dumps(t.steps) if steps else "", final=t.final if steps else "")


class FarmService(farm_pb2_grpc.FarmServicer):
    def __init__(self, node: NodeInfo, store: Store, scheduler: Scheduler, verify_ctx: VerifyContext | None) -> None:
        self._node = node
        self._store = store
        self._scheduler = scheduler
        self._verify_ctx = verify_ctx

    async def Status(
        self, request: farm_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> farm_pb2.StatusReply:
        async def call() -> farm_pb2.StatusReply:
            node = self._node
            farm = await self._scheduler.status()
            return farm_pb2.StatusReply(
                version=node.version, node=node.name, uptime_s=node.uptime_s(), isolation_ok=node.isolation_ok,
                isolation=[farm_pb2.IsolationCheck(name=c.name, ok=c.ok, detail=c.detail, fix=c.fix)
                           for c in node.isolation],
                workers=node.workers, max_boxes=node.max_boxes, policy_version=self._scheduler.policy_version,
                farm_json=json.dumps(farm))
        return await guarded(context, call)

    async def Run(self, request: farm_pb2.RunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.RunReply:
        async def call() -> farm_pb2.RunReply:
            if not 1 <= request.rollouts <= MAX_ROLLOUTS:
                raise BadRequest(f"rollouts must be 1..{MAX_ROLLOUTS}, got {request.rollouts}")
            if request.group_size > MAX_GROUP:
                raise BadRequest(f"group_size must be at most {MAX_GROUP}, got {request.group_size}")
            get(request.env)  # an unknown environment is the caller's error, before anything is queued
            make_agent(request.agent)
            ids, jobs = await self._scheduler.submit(request.env, request.agent, request.rollouts,
                                                     request.group_size or None)
            return farm_pb2.RunReply(group_ids=ids, jobs=jobs)
        return await guarded(context, call)

    async def Progress(self, request: farm_pb2.ProgressRequest, context: grpc.aio.ServicerContext[Any, Any]
                       ) -> farm_pb2.ProgressReply:
        async def call() -> farm_pb2.ProgressReply:
            jobs, done, failed, passed = await self._store.group_progress(list(request.group_ids))
            return farm_pb2.ProgressReply(jobs=jobs, done=done, failed=failed, passed=passed)
        return await guarded(context, call)

    async def ListTrajectories(self, request: farm_pb2.ListTrajectoriesRequest,
                               context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ListTrajectoriesReply:
        async def call() -> farm_pb2.ListTrajectoriesReply:
            rows = await self._store.trajectories(after_seq=request.after_seq, limit=min(request.limit or 50, 1000),
                                                  env=request.env or None, newest_first=request.newest_first,
                                                  body=request.include_steps)
            return farm_pb2.ListTrajectoriesReply(trajectories=[trajectory_pb(t, steps=request.include_steps)
                                                                for t in rows])
        return await guarded(context, call)

    async def GetTrajectory(self, request: farm_pb2.GetTrajectoryRequest,
                            context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.Trajectory:
        traj = await self._store.trajectory(request.id)
        if traj is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no trajectory {request.id}")
        assert traj is not None
        return trajectory_pb(traj)

    async def StreamTrajectories(self, request: farm_pb2.StreamRequest,
                                 context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[farm_pb2.Batch]:
        consumer = request.consumer.strip()
        if not consumer or len(consumer) > 200:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a stream needs a consumer name (1-200 chars)")
        size = min(request.batch_size or 64, MAX_BATCH)
        key = _cursor_key(consumer, request.whole_groups)
        sent = await self._store.cursor(key)
        self._scheduler.stream_opened(consumer)
        try:
            while True:
                seen = self._scheduler.stored_generation  # before reading: a commit after it wakes the wait
                floor = (self._scheduler.policy_version - request.max_staleness) if request.max_staleness else None
                if request.whole_groups:
                    trajectories, up_to = await self._whole_groups(sent, size, request.include_steps)
                else:
                    trajectories = await self._store.trajectories(after_seq=sent, limit=size,
                                                                  body=request.include_steps)
                    up_to = trajectories[-1].seq if trajectories else sent
                if up_to == sent:
                    await self._scheduler.wait_for_more(seen, _STREAM_POLL_S)
                    continue
                fresh = _fresh(trajectories, floor, request.whole_groups)
                sent = up_to
                if fresh or request.max_staleness:  # a batch of only stale ones still moves the cursor along
                    yield farm_pb2.Batch(trajectories=[trajectory_pb(t, request.include_steps) for t in fresh],
                                         up_to=up_to)
        finally:
            self._scheduler.stream_closed(consumer)

    async def _whole_groups(self, after: int, size: int, body: bool) -> tuple[list[Trajectory], int]:
        groups = await self._store.finished_groups(after, max(1, size // 2))
        picked: list[dict[str, Any]] = []
        total = 0
        for g in groups:  # whole groups only: stop before one would overflow the batch (but take at least one)
            if picked and total + g["size"] > size:
                break
            picked.append(g)
            total += g["size"]
        if not picked:
            return [], after
        trajectories = await self._store.group_trajectories([g["id"] for g in picked], body)
        return trajectories, picked[-1]["done_seq"]

    async def Ack(self, request: farm_pb2.AckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.AckReply:
        async def call() -> farm_pb2.AckReply:
            consumer = request.consumer.strip()
            if not consumer or len(consumer) > 200:
                raise BadRequest("an ack needs a consumer name (1-200 chars)")
            cursor = await self._store.ack(_cursor_key(consumer, request.whole_groups), request.up_to,
                                           groups=request.whole_groups)
            return farm_pb2.AckReply(cursor=cursor)
        return await guarded(context, call)

    async def PublishPolicy(self, request_iterator: AsyncIterator[farm_pb2.PolicyChunk],
                            context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.PolicyReply:
        declared = uri = ""
        data = bytearray()
        async for chunk in request_iterator:
            declared = declared or chunk.sha256
            uri = uri or chunk.uri
            data += chunk.data
            if len(data) > MAX_POLICY_BYTES:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"a policy is at most {MAX_POLICY_BYTES} bytes")
        if not data and not uri:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a policy needs content or a uri")
        actual = hashlib.sha256(bytes(data) if data else uri.encode()).hexdigest()
        if declared and declared != actual:
            await context.abort(grpc.StatusCode.DATA_LOSS, f"content hashes to {actual}, not the declared {declared}")
        policy = await self._store.add_policy(actual, bytes(data) if data else None, uri or None)
        self._scheduler.set_policy_version(policy.version)
        return farm_pb2.PolicyReply(version=policy.version, sha256=policy.sha256, size=policy.size)

    async def GetPolicy(self, request: farm_pb2.GetPolicyRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[farm_pb2.PolicyChunk]:
        policy = await (self._store.policy_by_hash(request.sha256) if request.sha256 else self._store.latest_policy())
        if policy is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such policy")
        assert policy is not None
        blob = await self._store.policy_blob(policy.sha256) or b""
        yield farm_pb2.PolicyChunk(sha256=policy.sha256, uri=policy.uri or "", version=policy.version,
                                   data=blob[:_POLICY_CHUNK])
        for start in range(_POLICY_CHUNK, len(blob), _POLICY_CHUNK):
            yield farm_pb2.PolicyChunk(data=blob[start:start + _POLICY_CHUNK])

    async def Rescore(self, request: farm_pb2.RescoreRequest,
                      context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.RescoreReply:
        async def call() -> farm_pb2.RescoreReply:
            if self._verify_ctx is None:
                raise FarmError("this node runs no boxes (--workers 0), so it cannot verify: rescore on a worker node")
            env = get(request.env)
            done = await self._store.scored_versions(env.name)
            scored = already = errors = 0
            rows: list[tuple[int, str, float, bool, str, list[str], list[str]]] = []
            after = 0
            limit = request.limit or None
            while limit is None or scored + already + errors < limit:
                page = await self._store.trajectories(after_seq=after, limit=200, env=env.name)
                if not page:
                    break
                after = page[-1].seq
                for t in page:
                    if env.verifier_version in done.get(t.id, set()):
                        already += 1
                        continue
                    task = env.generate(t.seed, t.difficulty)
                    attempt = Attempt(final=t.final, actions=[s["action"] for s in t.steps] if task.kind == "actions"
                                      else [])
                    verdict = await verify_safely(env, task, attempt, self._verify_ctx)
                    if verdict.status == "error":
                        errors += 1
                        continue
                    rows.append((t.id, verdict.verifier_version, verdict.reward, verdict.passed, str(verdict.status),
                                 verdict.reasons, verdict.flags))
                    scored += 1
            await self._store.add_scores(rows)
            return farm_pb2.RescoreReply(scored=scored, already=already, errors=errors,
                                         verifier_version=env.verifier_version)
        return await guarded(context, call)


def _cursor_key(consumer: str, whole_groups: bool) -> str:
    # The two kinds of stream count in different sequences (trajectories, finished groups).
    return f"{consumer}#groups" if whole_groups else consumer


def _fresh(trajectories: list[Trajectory], floor: int | None, whole_groups: bool) -> list[Trajectory]:
    """Trajectories at policy version ``floor`` or newer; with ``whole_groups``, whole groups whose
    every attempt is (a group's jobs may be leased under different versions: it is kept or
    passed over as one, so a group-relative advantage never sees half a group)."""
    if floor is None:
        return trajectories
    if not whole_groups:
        return [t for t in trajectories if t.policy_version >= floor]
    stale = {t.group_id for t in trajectories if t.policy_version < floor}
    return [t for t in trajectories if t.group_id not in stale]

