"""The ``farm.v1.Farm`` servicer: protos in, services called, protos out. No logic of its own."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc, trajectory_pb2

from farmd import domain
from farmd.agents import NamedEndpoint
from farmd.agents.registry import MAX_SPEC_CHARS, check_spec
from farmd.api import history
from farmd.api.budget import Budgets, Share
from farmd.api.errors import error_status, failure_status, guarded, guarded_stream
from farmd.api.limits import POLICY_CHUNK_BYTES
from farmd.api.names import NameGuard
from farmd.api.paging import make_token, page_size, read_token
from farmd.api.trajectories import batch_messages, fitting, fitting_changes, trajectory_pb
from farmd.atropos.records import is_atropos_env
from farmd.envs import VerifyContext, get
from farmd.envs.catalog import EnvLookup
from farmd.errors import BadRequest, FailedPrecondition, NotFound, Refused, TaskBankError
from farmd.flags import QUARANTINED, WITHDRAWN
from farmd.names import CONSUMER, POLICY_LINE, VERIFY_AGENT
from farmd.node import NodeInfo
from farmd.records import NODE_NAME, View
from farmd.rollout import rescore
from farmd.rollout.verify import (
    MAX_COMPLETION_CHARS,
    MAX_ITEMS,
    MAX_SAMPLED,
    Judged,
    Judges,
    TaskRef,
    agent_name,
)
from farmd.scheduler import PolicyChunk, Scheduler
from farmd.scheduler.delivery import ConsumerStatus, Subscription
from farmd.scheduler.history import History
from farmd.scheduler.nodes import Nodes, NodeStatus
from farmd.scheduler.policies import LINE_NAME
from farmd.scheduler.retention import Disk
from farmd.store import JobFailure, RunSummary, Standby, Store, StoreError
from farmd.store.names import NameRow
from farmd.store.retention import PolicyState
from farmd.taskbank import Standing

MAX_ROLLOUTS = 1_000_000
MAX_GROUP = 1024
MAX_BATCH = 4096
MAX_CONSUMER_CHARS = 200
MAX_VERDICT_CHANGES = 200
"""Verdict changes a page holds unless asked for fewer or more (at most 1000, and what fits a reply)."""
MAX_WITHDRAWALS_TOLD = 1000
"""Withdrawals one batch carries at most; the rest ride on the batches after it."""
MAX_POLICY_BYTES = 4 << 30
"""The default bound on one policy's content (the ``max_policy_bytes`` setting)."""


class FarmService(farm_pb2_grpc.FarmServiceServicer):
    def __init__(self, node: NodeInfo, store: Store, scheduler: Scheduler, verify_ctx: VerifyContext | None,
                 *, max_policy_bytes: int = MAX_POLICY_BYTES, endpoints: tuple[NamedEndpoint, ...] = (),
                 nodes: Nodes | None = None, envs: EnvLookup = get, history: History | None = None,
                 names: NameGuard | None = None,
                 budgets: Budgets | None = None, judges: Judges | None = None) -> None:
        self._judges = judges or Judges(verify_ctx, envs, node.name, max(1, node.workers))
        """Completions trainers send to be judged (Verify), in boxes of their own, a bounded number at once."""
        self._names = names or NameGuard(store, ())
        """Consumer names bound to the credential that made them (none bound on a farm without credentials)."""
        self._budgets = budgets or Budgets()
        """What each credential holds at once across its uploads and streams."""
        self._history = history
        """The farm's status sampled since farmd started (GetHistory)."""
        self._envs = envs
        """The environments this farm serves: the built-ins and approved contributed versions."""
        self._nodes = nodes
        """The fleet (``farmctl status`` lists its nodes)."""
        self._endpoints = endpoints
        """The config's model endpoints: the only ones a job's agent spec may name."""
        self._max_policy_bytes = max_policy_bytes
        self._node = node
        self._store = store
        self._scheduler = scheduler
        self._verify_ctx = verify_ctx

    async def GetStatus(self, request: farm_pb2.GetStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
                        ) -> farm_pb2.GetStatusResponse:
        async def call() -> farm_pb2.GetStatusResponse:
            node = self._node
            farm = await self._scheduler.status()
            pulse = farm.pulse
            reply = farm_pb2.GetStatusResponse(
                version=node.version, node=node.name, isolation_ok=node.isolation_ok,
                isolation=[farm_pb2.IsolationCheck(name=c.name, ok=c.ok, detail=c.detail, fix=c.fix)
                           for c in node.isolation],
                workers=node.workers, max_boxes=node.max_boxes, policy_version=self._scheduler.policy_version,
                queue=history.queue_pb(pulse.queue), throughput_per_s=pulse.throughput_per_s,
                pass_rates=[farm_pb2.PassRate(**dataclasses.asdict(row)) for row in farm.pass_rates],
                bank=[_bank_pb(name, entry) for name, entry in [*pulse.bank.envs.items(), ("", pulse.bank.totals)]],
                consumers=[_consumer_pb(c) for c in pulse.consumers], streams=pulse.streams,
                last_seq=pulse.last_seq, counters=pulse.counters,
                nodes=[_node_pb(n) for n in await self._nodes.status()] if self._nodes is not None else [],
                disk=_disk_pb(farm.disk),
                recent_failures=[_failure_pb(f) for f in farm.recent_failures], shared_store=farm.shared_store,
                standbys=[_standby_pb(s) for s in farm.standbys])
            reply.uptime.FromNanoseconds(round(node.uptime_s() * 1e9))
            return reply
        return await guarded(context, call)

    async def CreateRun(self, request: farm_pb2.CreateRunRequest, context: grpc.aio.ServicerContext[Any, Any]
                        ) -> farm_pb2.CreateRunResponse:
        async def call() -> farm_pb2.CreateRunResponse:
            if request.group_size > MAX_GROUP:
                raise BadRequest(f"group_size must be at most {MAX_GROUP}, got {request.group_size}")
            env = self._envs(request.env)  # an unknown environment is the caller's error, before anything is queued
            seeds = list(request.seeds)
            if seeds:
                _check_seeds(seeds, request.difficulty, env.max_difficulty, request.rollouts,
                             request.group_size or self._scheduler.config.group_size)
            elif request.difficulty:
                raise BadRequest("difficulty goes with seeds; without them the task bank chooses the level")
            elif not 1 <= request.rollouts <= MAX_ROLLOUTS:
                raise BadRequest(f"rollouts must be 1..{MAX_ROLLOUTS}, got {request.rollouts}")
            policies = self._scheduler.policies
            # A URL, an unknown endpoint, a malformed torch spec: refused here, not by every job.
            check_spec(request.agent, endpoints=self._endpoints)
            line = policies.unpublished(request.agent)
            if line is not None:
                raise FailedPrecondition(f"no policy named {line!r} has been published: publish one first "
                                         f"(farm_client: publish_policy(blob, name={line!r}))")
            run_id = await self._scheduler.create_run(request.env, request.agent, request.rollouts,
                                                      request.group_size or None, seeds=seeds,
                                                      difficulty=request.difficulty)
            return farm_pb2.CreateRunResponse(run=await self._run(run_id))
        return await guarded(context, call)

    async def _run(self, run_id: int) -> farm_pb2.Run:
        run = await self._store.run(run_id)
        if run is None:
            raise NotFound(f"no run {run_id}")
        return run_pb(run)

    async def GetRun(self, request: farm_pb2.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]
                     ) -> farm_pb2.GetRunResponse:
        async def call() -> farm_pb2.GetRunResponse:
            return farm_pb2.GetRunResponse(run=await self._run(request.run_id))
        return await guarded(context, call)

    async def ListRuns(self, request: farm_pb2.ListRunsRequest, context: grpc.aio.ServicerContext[Any, Any]
                       ) -> farm_pb2.ListRunsResponse:
        async def call() -> farm_pb2.ListRunsResponse:
            size = page_size(request.page_size)
            before = read_token("runs", request.page_token)
            runs = await self._store.runs(before_id=before or 0, limit=size + 1) if before != 0 else []
            more = len(runs) > size
            runs = runs[:size]
            return farm_pb2.ListRunsResponse(runs=[run_pb(r) for r in runs],
                                             next_page_token=make_token("runs", runs[-1].id) if more else "",
                                             capped=request.page_size > size and more)
        return await guarded(context, call)

    async def CancelRun(self, request: farm_pb2.CancelRunRequest, context: grpc.aio.ServicerContext[Any, Any]
                        ) -> farm_pb2.CancelRunResponse:
        async def call() -> farm_pb2.CancelRunResponse:
            if not await self._store.cancel_run(request.run_id):
                raise NotFound(f"no run {request.run_id}")
            return farm_pb2.CancelRunResponse(run=await self._run(request.run_id))
        return await guarded(context, call)

    async def ListTrajectories(self, request: farm_pb2.ListTrajectoriesRequest,
                               context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ListTrajectoriesResponse:
        async def call() -> farm_pb2.ListTrajectoriesResponse:
            size = page_size(request.page_size)
            # A token names a place in one order: the other order's is refused, not read as a different place.
            kind = "trajectories-newest" if request.newest_first else "trajectories"
            position = read_token(kind, request.page_token)
            before, after = (position, 0) if request.newest_first else (None, position or 0)
            where = history.trajectory_filter(request)
            # Withdrawn is shown or absent, never live: absent unless asked for (by name, or by the flag they carry).
            withdrawn = request.include_withdrawn or where.flag in (QUARANTINED, WITHDRAWN)
            # Read before the page: whatever changes after it has a higher verdict_version than the mark.
            mark = await self._store.verdicts.mark()
            rows = await self._store.trajectories(limit=size + 1, env=request.env or None, run_id=request.run_id,
                                                  newest_first=request.newest_first,
                                                  view="full" if request.full else "summary",
                                                  before_seq=before, after_seq=after, where=where,
                                                  withdrawn=withdrawn)
            left_out = 0 if withdrawn or position is not None else await self._store.withdrawn_count(
                env=request.env or None, run_id=request.run_id, where=where)
            sent = await asyncio.to_thread(fitting, rows[:size])  # a page of whole records: tens of ms of protos
            more = len(rows) > len(sent)
            return farm_pb2.ListTrajectoriesResponse(
                trajectories=sent, next_page_token=make_token(kind, sent[-1].seq) if more else "",
                capped=len(sent) < min(size, len(rows)) or (request.page_size > size and more),
                withdrawn_left_out=left_out, verdict_mark=mark)
        return await guarded(context, call)

    async def GetTrajectory(self, request: farm_pb2.GetTrajectoryRequest,
                            context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.GetTrajectoryResponse:
        async def call() -> farm_pb2.GetTrajectoryResponse:
            traj = await self._store.trajectory(request.id)
            if traj is None:
                raise NotFound(f"no trajectory {request.id}")
            return farm_pb2.GetTrajectoryResponse(trajectory=trajectory_pb(traj))
        return await guarded(context, call)

    async def ListVerdictChanges(self, request: farm_pb2.ListVerdictChangesRequest,
                                 context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ListVerdictChangesResponse:
        async def call() -> farm_pb2.ListVerdictChangesResponse:
            size = page_size(request.page_size or MAX_VERDICT_CHANGES)
            position = read_token("verdicts", request.page_token)
            mark = await self._store.verdicts.mark()
            after = min(request.after_mark if position is None else position, domain.INT64_MAX)
            rows = await self._store.verdicts.changed(after, size + 1)
            sent = await asyncio.to_thread(fitting_changes, rows[:size])
            more = len(rows) > len(sent)
            return farm_pb2.ListVerdictChangesResponse(
                changes=sent, next_page_token=make_token("verdicts", sent[-1].verdict_version) if more else "",
                verdict_mark=mark)
        return await guarded(context, call)

    async def GetHistory(self, request: farm_pb2.GetHistoryRequest, context: grpc.aio.ServicerContext[Any, Any]
                         ) -> farm_pb2.GetHistoryResponse:
        async def call() -> farm_pb2.GetHistoryResponse:
            window, count = history.window_s(request), history.buckets(request)
            since = time.time() - window
            bucket_s = window / count
            activity = await self._store.activity.buckets(since, bucket_s)
            samples = self._history.since(since) if self._history is not None else []
            every = self._history.every_s if self._history is not None else 0.0
            # Thousands of samples are tens of milliseconds of protos: off the event loop.
            return await asyncio.to_thread(history.history_pb, samples, activity, since=since, bucket_s=bucket_s,
                                           sample_every_s=every)
        return await guarded(context, call)

    async def GetLearningCurve(self, request: farm_pb2.GetLearningCurveRequest,
                               context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.GetLearningCurveResponse:
        async def call() -> farm_pb2.GetLearningCurveResponse:
            agents = await self._store.activity.policy_agents()
            agent = request.agent or (agents[0] if agents else "")
            if len(agent) > MAX_SPEC_CHARS or len(request.env) > MAX_SPEC_CHARS:
                raise BadRequest(f"agent and env are at most {MAX_SPEC_CHARS} characters")
            curve = await self._store.activity.learning_curve(agent, request.env or None, history.points(request)) \
                if agent else []
            return history.curve_pb(agent, curve, agents)
        return await guarded(context, call)

    async def StreamTrajectories(self, request: farm_pb2.StreamTrajectoriesRequest,
                                 context: grpc.aio.ServicerContext[Any, Any]
                                 ) -> AsyncIterator[farm_pb2.StreamTrajectoriesResponse]:
        async for message in guarded_stream(context, self._stream(request, context)):
            yield message

    async def _stream(self, request: farm_pb2.StreamTrajectoriesRequest, context: grpc.aio.ServicerContext[Any, Any]
                      ) -> AsyncGenerator[farm_pb2.StreamTrajectoriesResponse, None]:
        consumer = _consumer(request.consumer)
        if consumer is None:
            raise BadRequest(f"a stream needs a consumer name (1-{MAX_CONSUMER_CHARS} characters)")
        subscription = _subscription(request, self._envs)
        if request.summary_only and request.tokens_only:
            raise BadRequest("a stream is summary_only or tokens_only, not both")
        view: View = "summary" if request.summary_only else "tokens" if request.tokens_only else "full"
        # Reading under another credential's cursor would take its batches and stall its demand: its maker's only.
        await self._names.use(CONSUMER, consumer, context)
        told = request.withdrawals_after
        async for batch in self._scheduler.delivery.batches(
                consumer, whole_groups=request.whole_groups, batch_size=min(request.batch_size or 64, MAX_BATCH),
                max_staleness=request.max_staleness, view=view, subscription=subscription):
            # What a quarantine took back rides on the next batch: a trainer hears of it in the stream it reads.
            withdrawn = await self._store.intake.withdrawals(told, MAX_WITHDRAWALS_TOLD, subscription.envs)
            if withdrawn:
                told = withdrawn[-1].seq
            first = True
            async for message in _built(batch_messages(batch.trajectories, batch.up_to)):
                if first:
                    message.withdrawals.extend(farm_pb2.Withdrawal(seq=w.seq, trajectory_id=w.trajectory_id, env=w.env,
                                                                   reason=w.reason) for w in withdrawn)
                    first = False
                yield message

    async def Ack(self, request: farm_pb2.AckRequest, context: grpc.aio.ServicerContext[Any, Any]
                  ) -> farm_pb2.AckResponse:
        async def call() -> farm_pb2.AckResponse:
            consumer = _consumer(request.consumer)
            if consumer is None:
                raise BadRequest(f"an ack needs a consumer name (1-{MAX_CONSUMER_CHARS} characters)")
            # Another's ack would move its cursor past trajectories it never had: its maker's only.
            await self._names.use(CONSUMER, consumer, context)
            cursor = await self._scheduler.delivery.ack(consumer, request.up_to, whole_groups=request.whole_groups)
            return farm_pb2.AckResponse(cursor=cursor)
        return await guarded(context, call)

    async def PublishPolicy(self, request_iterator: AsyncIterator[farm_pb2.PublishPolicyRequest],
                            context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.PublishPolicyResponse:
        async def call() -> farm_pb2.PublishPolicyResponse:
            async with self._budgets.stream(context, "PublishPolicy") as share:
                policy = await self._scheduler.policies.publish(self._policy_chunks_in(request_iterator, context,
                                                                                       share))
            return farm_pb2.PublishPolicyResponse(version=policy.version, sha256=policy.sha256, size=policy.size,
                                                  name=policy.name)
        return await guarded(context, call)

    async def _policy_chunks_in(self, requests: AsyncIterator[farm_pb2.PublishPolicyRequest],
                                context: grpc.aio.ServicerContext[Any, Any], share: Share
                                ) -> AsyncGenerator[PolicyChunk, None]:
        """The chunks as plain data, bounded as they arrive: the bound is on what one call may send, and
        a call over it ends before the chunk that would pass it is written (its upload then removed). The
        chunk being written counts against the caller's credential until it is."""
        size = 0
        line = ""
        async for chunk in requests:
            if chunk.name and not line:  # the line is the first name sent (``Policies.publish``)
                line = chunk.name
                if LINE_NAME.fullmatch(line):  # a malformed one is publish's to refuse
                    # Publishing to another credential's line would make its torch:NAME jobs run these weights.
                    await self._names.use(POLICY_LINE, line, context)
            size += len(chunk.data)
            if size > self._max_policy_bytes:
                raise Refused("RESOURCE_EXHAUSTED", f"a policy is at most "
                              f"{self._max_policy_bytes} bytes (max_policy_bytes)", "POLICY_TOO_LARGE")
            share.take(len(chunk.data))
            yield PolicyChunk(sha256=chunk.sha256, uri=chunk.uri, data=chunk.data, name=chunk.name)
            share.give(len(chunk.data))

    async def GetPolicy(self, request: farm_pb2.GetPolicyRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[farm_pb2.GetPolicyResponse]:
        """The policy in chunks read one at a time from where it is kept: farmd never holds it whole."""
        async for message in guarded_stream(context, self._policy_chunks(request)):
            yield message

    async def _policy_chunks(self, request: farm_pb2.GetPolicyRequest
                             ) -> AsyncGenerator[farm_pb2.GetPolicyResponse, None]:
        policies = self._scheduler.policies
        policy = await policies.find(request.sha256, request.name or None)
        header: farm_pb2.GetPolicyResponse | None = farm_pb2.GetPolicyResponse(
            sha256=policy.sha256, uri=policy.uri or "", version=policy.version, name=policy.name)
        try:
            async with contextlib.aclosing(policies.chunks(policy, POLICY_CHUNK_BYTES)) as content:
                async for data in content:
                    if header is not None:
                        header.data = data
                        yield header
                        header = None
                    else:
                        yield farm_pb2.GetPolicyResponse(data=data)
        except StoreError as exc:
            raise Refused("DATA_LOSS", str(exc), "POLICY_CONTENT_LOST") from exc
        if header is not None:  # a uri only: no content to carry it
            yield header

    async def ListPolicies(self, request: farm_pb2.ListPoliciesRequest,
                           context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ListPoliciesResponse:
        async def call() -> farm_pb2.ListPoliciesResponse:
            size = page_size(request.page_size)
            before = read_token("policies", request.page_token) or 0
            rows = await self._scheduler.policies.listing(before, size + 1)
            more = len(rows) > size
            rows = rows[:size]
            return farm_pb2.ListPoliciesResponse(policies=[_policy_pb(p) for p in rows],
                                                 next_page_token=make_token("policies", rows[-1].version) if more else "")
        return await guarded(context, call)

    async def PinPolicy(self, request: farm_pb2.PinPolicyRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.PinPolicyResponse:
        async def call() -> farm_pb2.PinPolicyResponse:
            if not 0 < request.version < 1 << 63:
                raise BadRequest("a policy version is a whole number from 1")
            state = await self._scheduler.policies.pin(request.version, request.pinned)
            return farm_pb2.PinPolicyResponse(policy=_policy_pb(state))
        return await guarded(context, call)

    async def ListNames(self, request: farm_pb2.ListNamesRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ListNamesResponse:
        async def call() -> farm_pb2.ListNamesResponse:
            size = page_size(request.page_size)
            after = read_token("names", request.page_token) or 0
            rows = await self._names.listing(request.kind, after, size + 1)
            more = len(rows) > size
            rows = rows[:size]
            return farm_pb2.ListNamesResponse(names=[_name_pb(row) for _, row in rows],
                                              next_page_token=make_token("names", rows[-1][0]) if more else "")
        return await guarded(context, call)

    async def ReassignName(self, request: farm_pb2.ReassignNameRequest,
                           context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ReassignNameResponse:
        async def call() -> farm_pb2.ReassignNameResponse:
            row, previous = await self._names.reassign(request.kind, request.name, request.credential, context)
            return farm_pb2.ReassignNameResponse(name=_name_pb(row), previous=previous)
        return await guarded(context, call)

    async def Rescore(self, request: farm_pb2.RescoreRequest,
                      context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.RescoreResponse:
        async def call() -> farm_pb2.RescoreResponse:
            done = await rescore(self._store, self._verify_ctx, request.env, request.limit or None,
                                 envs=self._envs)
            return farm_pb2.RescoreResponse(scored=done.scored, already=done.already, errors=done.errors,
                                            verifier_version=done.verifier_version)
        return await guarded(context, call)

    async def SampleTasks(self, request: farm_pb2.SampleTasksRequest,
                          context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.SampleTasksResponse:
        async def call() -> farm_pb2.SampleTasksResponse:
            if not 1 <= request.count <= MAX_SAMPLED:
                raise BadRequest(f"count must be 1..{MAX_SAMPLED}, got {request.count}")
            # The environment, and a level asked for, checked before the bank hands out a seed for them.
            self._judges.environment(TaskRef(request.env, 0, request.difficulty or 1))
            try:
                keys = await self._scheduler.draw_tasks(request.env, request.count, request.difficulty)
            except TaskBankError as exc:  # an environment the bank does not follow (yet)
                raise BadRequest(str(exc)) from exc
            posed = await asyncio.gather(*(self._judges.pose(TaskRef(k.env, k.seed, k.difficulty)) for k in keys))
            return farm_pb2.SampleTasksResponse(tasks=[farm_pb2.SampledTask(
                task=farm_pb2.TaskRef(env=p.ref.env, seed=p.ref.seed, difficulty=p.ref.difficulty),
                env_version=p.task.env_version, system=p.system, prompt=p.prompt, kind=trajectory_pb2.TASK_KIND_SUBMISSION,
                entry_point=p.task.entry_point or "", answer_format=p.task.answer_format or "") for p in posed])
        return await guarded(context, call)

    async def Verify(self, request: farm_pb2.VerifyRequest,
                     context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.VerifyResponse:
        async def call() -> farm_pb2.VerifyResponse:
            agent = agent_name(request.agent)
            if not 1 <= len(request.items) <= MAX_ITEMS:
                raise BadRequest(f"a call judges 1..{MAX_ITEMS} completions, got {len(request.items)}")
            items = []
            for i, item in enumerate(request.items):
                if len(item.completion) > MAX_COMPLETION_CHARS:
                    raise BadRequest(f"item {i}: a completion is at most {MAX_COMPLETION_CHARS} characters, got "
                                     f"{len(item.completion)}")
                items.append((TaskRef(item.task.env, item.task.seed, item.task.difficulty), item.completion))
            # Another credential's completions under this name would be its agent's trajectories, in its streams.
            await self._names.use(VERIFY_AGENT, request.agent, context)
            judged = await self._judges.judge(agent, items)
            # Stored together, a group per task: each record is given its id and group here.
            await self._scheduler.store_judged([j.record for j in judged if j.record is not None])
            return farm_pb2.VerifyResponse(agent=agent, results=[_verify_result(j) for j in judged])
        return await guarded(context, call)

    async def ClearNode(self, request: farm_pb2.ClearNodeRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> farm_pb2.ClearNodeResponse:
        async def call() -> farm_pb2.ClearNodeResponse:
            if self._nodes is None:
                raise FailedPrecondition("this farmd keeps no fleet")
            if not NODE_NAME.fullmatch(request.name):
                raise BadRequest("a node's name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
                                 "digit")
            reason = await self._nodes.clear(request.name)
            return farm_pb2.ClearNodeResponse(cleared=True, reason=reason)
        return await guarded(context, call)


def _verify_result(j: Judged) -> farm_pb2.VerifyResult:
    ref = farm_pb2.TaskRef(env=j.ref.env, seed=j.ref.seed, difficulty=j.ref.difficulty)
    if j.record is None:
        assert j.error is not None
        return farm_pb2.VerifyResult(task=ref, error=error_status(j.error))
    t = j.record
    return farm_pb2.VerifyResult(task=ref, verdict=farm_pb2.VerifyVerdict(
        reward=t.reward, passed=t.passed, flags=[_flag_pb(f) for f in t.flags], reasons=t.reasons,
        verifier_version=t.verifier_version, trajectory_id=t.id, group_id=t.group_id))


def _flag_pb(flag: str) -> trajectory_pb2.Flag.ValueType:
    try:
        return trajectory_pb2.Flag.Value(f"FLAG_{flag.upper()}")
    except ValueError:  # every flag farm raises is in the enum (``farmd.flags.ALL``); no verdict is lost for one
        return trajectory_pb2.FLAG_UNSPECIFIED


def run_pb(run: RunSummary) -> farm_pb2.Run:
    message = farm_pb2.Run(
        id=run.id, env=run.env, agent=run.agent, rollouts=run.rollouts, group_size=run.group_size,
        group_ids=run.group_ids, state=farm_pb2.RunState.Value(f"RUN_STATE_{run.state.upper()}"),
        jobs=run.jobs, done=run.done, failed=run.failed, cancelled=run.cancelled, passed=run.passed)
    message.created_at.FromNanoseconds(round(run.created_at * 1e9))
    if run.finished_at:
        message.finished_at.FromNanoseconds(round(run.finished_at * 1e9))
    if run.last_error:
        message.last_error.CopyFrom(failure_status(run.last_error))
    return message


def _failure_pb(f: JobFailure) -> farm_pb2.JobFailure:
    message = farm_pb2.JobFailure(job_id=f.job_id, run_id=f.run_id, attempt=f.attempt, final=f.final,
                                  error=failure_status(f.error))
    message.at.FromNanoseconds(round(f.at * 1e9))
    return message


def _bank_pb(env: str, s: Standing) -> farm_pb2.BankStatus:
    return farm_pb2.BankStatus(
        env=env, level=s.level or 0, max_difficulty=s.max_difficulty or 0, level_pass_rate=s.level_pass_rate,
        level_groups=s.level_groups or 0, tasks=s.tasks, in_band=s.in_band, easy=s.easy, hard=s.hard, retired=s.retired,
        groups=s.groups, sampled=s.sampled, band_occupancy=s.band_occupancy, fresh_share=s.fresh_share,
        informative_fraction=s.informative_fraction)


def _name_pb(row: NameRow) -> farm_pb2.BoundName:
    message = farm_pb2.BoundName(kind=row.kind, name=row.name, credential=row.credential, assigned_by=row.assigned_by)
    message.claimed_at.FromNanoseconds(round(row.claimed_at * 1e9))
    return message


def _policy_pb(p: PolicyState) -> farm_pb2.PolicyInfo:
    message = farm_pb2.PolicyInfo(version=p.version, name=p.name, sha256=p.sha256, size=p.size, uri=p.uri or "",
                                  kept=p.has_content, removed_reason=p.removed_why)
    message.created_at.FromNanoseconds(round(p.created_at * 1e9))
    if p.pinned_at is not None:
        message.pinned_at.FromNanoseconds(round(p.pinned_at * 1e9))
    if p.removed_at is not None:
        message.removed_at.FromNanoseconds(round(p.removed_at * 1e9))
    return message


def _standby_pb(standby: Standby) -> farm_pb2.Standby:
    message = farm_pb2.Standby(address=standby.address)
    message.since.FromNanoseconds(round(standby.since * 1e9))
    return message


def _disk_pb(disk: Disk) -> farm_pb2.DiskStatus:
    u = disk.usage
    message = farm_pb2.DiskStatus(
        store_bytes=u.store_bytes, policy_bytes=u.policy_bytes, policy_files=u.policy_files, policies_kept=u.kept,
        policies_removed=u.removed, policies_pinned=u.pinned, policy_bytes_removed=u.removed_bytes,
        policy_keep_newest=disk.keep_newest)
    if disk.store_growth_per_h is not None:
        message.store_growth_bytes_per_hour = disk.store_growth_per_h
    if disk.policy_growth_per_h is not None:
        message.policy_growth_bytes_per_hour = disk.policy_growth_per_h
    message.growth_window.FromNanoseconds(round(disk.window_s * 1e9))
    return message


async def _built(messages: Iterator[farm_pb2.StreamTrajectoriesResponse]
                 ) -> AsyncIterator[farm_pb2.StreamTrajectoriesResponse]:
    """``messages``, each built in a thread while the one before it goes out: building a batch's protos takes
    tens of milliseconds for hundreds of whole records, which the event loop (every box's timer, every other
    call) must not wait on, and which the reader, decoding the message before, need not wait on either."""
    building = asyncio.ensure_future(asyncio.to_thread(next, messages, None))
    try:
        while (message := await building) is not None:
            building = asyncio.ensure_future(asyncio.to_thread(next, messages, None))
            yield message
    finally:
        building.cancel()


def _consumer_pb(c: ConsumerStatus) -> farm_pb2.ConsumerStatus:
    message = farm_pb2.ConsumerStatus(
        name=c.name, whole_groups=c.whole_groups, cursor=c.cursor, lag=max(0, c.lag), streams=c.streams,
        state=farm_pb2.ConsumerState.Value(f"CONSUMER_STATE_{c.state.upper()}"))
    if c.acked_at:
        message.acked_at.FromNanoseconds(round(c.acked_at * 1e9))
    if c.staleness is not None:
        message.staleness = c.staleness
    return message


MAX_SEEDS = 100_000
MAX_SUBSCRIBED_ENVS = 64


def _check_seeds(seeds: list[int], difficulty: int, max_difficulty: int, rollouts: int, group_size: int) -> None:
    if len(seeds) > MAX_SEEDS:
        raise BadRequest(f"a run names at most {MAX_SEEDS} seeds, got {len(seeds)}")
    if len(set(seeds)) != len(seeds):
        raise BadRequest("a run's seeds must be distinct (ask for a larger group_size to repeat a task)")
    if any(seed >= 1 << 63 for seed in seeds):
        raise BadRequest("seeds must be below 2**63")
    if not 1 <= difficulty <= max_difficulty:
        raise BadRequest(f"with seeds, difficulty must be 1..{max_difficulty}, got {difficulty}")
    if rollouts and rollouts != len(seeds) * group_size:
        raise BadRequest(f"with seeds, a run is one group of {group_size} per seed ({len(seeds) * group_size} "
                         f"rollouts); rollouts says {rollouts} (0: leave it to the seeds)")


def _subscription(request: farm_pb2.StreamTrajectoriesRequest, envs: EnvLookup) -> Subscription:
    if len(request.agent) > MAX_SPEC_CHARS:
        raise BadRequest(f"a subscription's agent is an agent spec, at most {MAX_SPEC_CHARS} characters")
    if len(request.envs) > MAX_SUBSCRIBED_ENVS:
        raise BadRequest(f"a subscription names at most {MAX_SUBSCRIBED_ENVS} environments")
    for env in request.envs:
        if not is_atropos_env(env):  # those are named by whoever pushes to the Atropos API, not by the catalog
            envs(env)  # an unknown environment is a typo that would stream nothing, for ever
    return Subscription(agent=request.agent.strip(), envs=tuple(dict.fromkeys(request.envs)))


def _consumer(name: str) -> str | None:
    name = name.strip()
    return name if 0 < len(name) <= MAX_CONSUMER_CHARS else None


_NODE_STATES = {"connected": farm_pb2.NODE_STATE_CONNECTED, "disconnected": farm_pb2.NODE_STATE_DISCONNECTED,
                "lost": farm_pb2.NODE_STATE_LOST, "quarantined": farm_pb2.NODE_STATE_QUARANTINED}


def _node_pb(row: NodeStatus) -> farm_pb2.NodeStatus:
    node = farm_pb2.NodeStatus(
        name=row.name, address=row.address, state=_NODE_STATES.get(row.state, farm_pb2.NODE_STATE_UNSPECIFIED),
        capacity=row.capacity, in_flight=row.in_flight, done=row.done, failed=row.failed,
        policy_versions=row.policy_versions, isolation_ok=row.isolation_ok, version=row.version, facts=row.facts,
        refused=row.refused, checked=row.checked, disagreed=row.disagreed, canaries=row.canaries,
        quarantine_reason=row.quarantine_reason)
    if row.quarantined_at is not None:
        node.quarantined_at.FromNanoseconds(round(row.quarantined_at * 1e9))
    if row.last_heartbeat is not None:
        node.last_heartbeat.FromNanoseconds(round(row.last_heartbeat * 1e9))
    node.last_seen.FromNanoseconds(round(row.last_seen * 1e9))
    return node
