"""The ``farm.v1.Farm`` servicer: protos in, services called, protos out. No logic of its own."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc

from farmd.agents import NamedEndpoint, make_agent
from farmd.api.errors import guarded
from farmd.api.limits import POLICY_CHUNK_BYTES
from farmd.api.trajectories import batch_messages, fitting, trajectory_pb
from farmd.envs import Attempt, VerifyContext, get, verify_safely
from farmd.errors import BadRequest, FarmError, NotFound
from farmd.node import NodeInfo
from farmd.scheduler import Scheduler
from farmd.store import Store, StoreError

MAX_ROLLOUTS = 1_000_000
MAX_GROUP = 1024
MAX_BATCH = 4096
MAX_CONSUMER_CHARS = 200
MAX_POLICY_BYTES = 4 << 30
"""The default bound on one policy's content (the ``max_policy_bytes`` setting)."""
MAX_POLICY_URI_CHARS = 4096
_HEX = frozenset("0123456789abcdef")


class FarmService(farm_pb2_grpc.FarmServicer):
    def __init__(self, node: NodeInfo, store: Store, scheduler: Scheduler, verify_ctx: VerifyContext | None,
                 *, max_policy_bytes: int = MAX_POLICY_BYTES, endpoints: tuple[NamedEndpoint, ...] = ()) -> None:
        self._endpoints = endpoints
        """The config's model endpoints: the only ones a job's agent spec may name."""
        self._max_policy_bytes = max_policy_bytes
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
            make_agent(request.agent, endpoints=self._endpoints)  # a URL or an unknown endpoint: refused here
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
            return farm_pb2.ListTrajectoriesReply(trajectories=fitting(rows, steps=request.include_steps))
        return await guarded(context, call)

    async def GetTrajectory(self, request: farm_pb2.GetTrajectoryRequest,
                            context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.Trajectory:
        async def call() -> farm_pb2.Trajectory:
            traj = await self._store.trajectory(request.id)
            if traj is None:
                raise NotFound(f"no trajectory {request.id}")
            return trajectory_pb(traj)
        return await guarded(context, call)

    async def StreamTrajectories(self, request: farm_pb2.StreamRequest,
                                 context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[farm_pb2.Batch]:
        consumer = _consumer(request.consumer)
        if consumer is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"a stream needs a consumer name (1-{MAX_CONSUMER_CHARS} characters)")
        assert consumer is not None
        async for batch in self._scheduler.delivery.batches(
                consumer, whole_groups=request.whole_groups, batch_size=min(request.batch_size or 64, MAX_BATCH),
                max_staleness=request.max_staleness, body=request.include_steps):
            for message in batch_messages(batch.trajectories, batch.up_to, request.include_steps):
                yield message

    async def Ack(self, request: farm_pb2.AckRequest, context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.AckReply:
        async def call() -> farm_pb2.AckReply:
            consumer = _consumer(request.consumer)
            if consumer is None:
                raise BadRequest(f"an ack needs a consumer name (1-{MAX_CONSUMER_CHARS} characters)")
            cursor = await self._scheduler.delivery.ack(consumer, request.up_to, whole_groups=request.whole_groups)
            return farm_pb2.AckReply(cursor=cursor)
        return await guarded(context, call)

    async def PublishPolicy(self, request_iterator: AsyncIterator[farm_pb2.PolicyChunk],
                            context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.PolicyReply:
        """Content goes to a file as it arrives, hashed on the way: farmd holds a chunk, never a policy.
        Whatever ends the call before the policy is stored (a wrong hash, a cancel) removes the file."""
        declared = uri = ""
        upload = None

        async def refuse(code: grpc.StatusCode, detail: str) -> None:
            if upload is not None:
                await upload.discard()  # before the caller hears of it: by then nothing is left
            await context.abort(code, detail)

        try:
            async for chunk in request_iterator:
                declared = declared or chunk.sha256
                uri = uri or chunk.uri
                if not chunk.data:
                    continue
                upload = upload or await self._store.policy_upload()
                if upload.size + len(chunk.data) > self._max_policy_bytes:
                    await refuse(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"a policy is at most {self._max_policy_bytes} bytes (max_policy_bytes)")
                await upload.write(chunk.data)
            if declared and not _is_sha256(declared):
                await refuse(grpc.StatusCode.INVALID_ARGUMENT, "sha256 is 64 lowercase hex digits")
            if len(uri) > MAX_POLICY_URI_CHARS:
                await refuse(grpc.StatusCode.INVALID_ARGUMENT,
                             f"a policy uri is at most {MAX_POLICY_URI_CHARS} characters")
            if upload is None and not uri:
                await refuse(grpc.StatusCode.INVALID_ARGUMENT, "a policy needs content or a uri")
            actual = upload.sha256 if upload is not None else hashlib.sha256(uri.encode()).hexdigest()
            if declared and declared != actual:
                await refuse(grpc.StatusCode.DATA_LOSS, f"content hashes to {actual}, not the declared {declared}")
            policy = await self._store.add_policy(actual, upload, uri or None)
        finally:
            if upload is not None:
                await upload.discard()
        self._scheduler.set_policy_version(policy.version)
        return farm_pb2.PolicyReply(version=policy.version, sha256=policy.sha256, size=policy.size)

    async def GetPolicy(self, request: farm_pb2.GetPolicyRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[farm_pb2.PolicyChunk]:
        """The policy in chunks read one at a time from where it is kept: farmd never holds it whole."""
        if request.sha256 and not _is_sha256(request.sha256):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256 is 64 lowercase hex digits")
        policy = await (self._store.policy_by_hash(request.sha256) if request.sha256 else self._store.latest_policy())
        if policy is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such policy")
        assert policy is not None
        header: farm_pb2.PolicyChunk | None = farm_pb2.PolicyChunk(sha256=policy.sha256, uri=policy.uri or "",
                                                                  version=policy.version)
        try:
            async with contextlib.aclosing(self._store.policy_content(policy.sha256, POLICY_CHUNK_BYTES)) as content:
                async for data in content:
                    if header is not None:
                        header.data = data
                        yield header
                        header = None
                    else:
                        yield farm_pb2.PolicyChunk(data=data)
        except StoreError as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        if header is not None:  # a uri only: no content to carry it
            yield header

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
                    task = await asyncio.to_thread(env.generate, t.seed, t.difficulty)  # rg puzzles take time
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


def _consumer(name: str) -> str | None:
    name = name.strip()
    return name if 0 < len(name) <= MAX_CONSUMER_CHARS else None


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= _HEX
