"""NodeService.Work: one worker node's stream, translated to the fleet registry's calls.

The node's first message is its hello; farmd answers with a welcome (the lease period, how often to
heartbeat, the farm's verifier key) or ends the call with why it was refused. Every later message is
one request, answered in order by its id. A request that fails is answered with its error and the
stream goes on: the node decides whether to try again.

What a node sends is bounded before it is parsed (the per-method message limit) and its trajectories
are sealed here, off the event loop, as if they were a local worker's: a node runs untrusted code, so
what comes from it is held to the record's bounds again, whatever the node did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import grpc
from farm.v1 import node_pb2, node_pb2_grpc, trajectory_pb2
from farm_client.convert import duration, from_message, seconds

from farmd import domain
from farmd.api.budget import Budgets, Share
from farmd.api.errors import guarded_stream
from farmd.api.names import NameGuard
from farmd.errors import BadRequest, BudgetExhausted, FailedPrecondition, FarmError, Refused
from farmd.names import NODE
from farmd.records import MAX_HELD_JOBS, NODE_NAME, JobState, Trajectory
from farmd.scheduler.nodes import MAX_CHECKS, MAX_FACT_CHARS, MAX_FACTS, Hello, IsolationCheck, Node, Nodes
from farmd.store.nodes import Completion
from farmd.text import bounded

log = logging.getLogger("farmd.api.nodes")

HELLO_TIMEOUT_S = 30.0
MAX_RESULT_BYTES = 16 << 20
"""One trajectory's serialized record, whole: well above the largest a sealed record can be."""
MAX_PENDING_BYTES = 64 << 20
"""Partial records one stream may hold at once."""
MAX_JOB_IDS = 8192


def _text(value: str, limit: int) -> str:
    return bounded(value, limit)


def _hello(message: node_pb2.NodeHello, address: str) -> Hello:
    if len(message.facts) > MAX_FACTS or len(message.isolation) > MAX_CHECKS:
        raise BadRequest(f"a hello carries at most {MAX_FACTS} facts and {MAX_CHECKS} isolation checks")
    if len(message.held.job_ids) > MAX_HELD_JOBS:
        raise BadRequest(f"a hello names at most {MAX_HELD_JOBS} jobs held")
    return Hello(
        name=_text(message.name, 100), owner=_text(message.owner, 300), capacity=message.capacity,
        version=_text(message.version, 64), address=_text(address, 200),
        isolation=tuple(IsolationCheck(name=_text(c.name, 100), ok=c.ok, detail=_text(c.detail, 1000), fix=_text(c.fix, 1000))
                        for c in message.isolation),
        facts={_text(k, 64): _text(v, MAX_FACT_CHARS) for k, v in message.facts.items()},
        held=frozenset(message.held.job_ids) if message.HasField("held") else None)


def _trajectory(data: bytes, job_id: int, node: str) -> Trajectory:
    """Parse and seal one node's record (in a thread: a record is up to megabytes)."""
    message = trajectory_pb2.Trajectory()
    message.ParseFromString(data)
    trajectory = from_message(message, Trajectory)
    if trajectory.id != job_id:
        raise BadRequest(f"the record sent for job {job_id} is job {trajectory.id}'s")
    # Every number in its domain, the reward in farm's own (a node's verdict is never an outside score):
    # a record out of it is refused whole, with each problem named (OutOfDomain), and never stored.
    trajectory.node = node  # this parse's own object: no copy made for it
    return domain.check(trajectory.sealed(), external=False)


def _trajectories(whole: list[tuple[int, str, bytes]], node: str) -> list[Trajectory | Exception]:
    """``_trajectory`` for each record of one message, in one thread hop: each record's own failure its own."""
    out: list[Trajectory | Exception] = []
    for job_id, _, data in whole:
        try:
            out.append(_trajectory(data, job_id, node))
        except Exception as exc:
            out.append(exc)
    return out


def _outside_vocab(checks: list[tuple[Trajectory, int | None]]) -> list[str | None]:
    """For each (record, its policy's vocabulary size, None where unknown): the token ids the vocabulary does not
    hold, named; None. The records were checked whole already (``_trajectory``): only the ids are looked at again,
    all in one hop."""
    out: list[str | None] = []
    for trajectory, vocab in checks:
        found = domain.outside_vocab(trajectory, vocab) if vocab is not None else []
        out.append("; ".join(found[:3]) if found else None)
    return out


class _Parts:
    """Records arriving in pieces, per job, until their last piece: bounded per record, per stream, and with
    every other stream of the node's credential (``share``: what is held waiting for more counts there)."""

    def __init__(self, share: Share | None = None) -> None:
        self._open: dict[int, tuple[str, bytearray]] = {}
        self._bytes = 0
        self._share = share

    def add(self, part: node_pb2.ResultPart) -> tuple[int, str, bytes] | None:
        owner, data = self._open.get(part.job_id, (part.owner, bytearray()))
        if len(data) + len(part.data) > MAX_RESULT_BYTES or self._bytes + len(part.data) > MAX_PENDING_BYTES:
            self._drop(part.job_id)
            raise BadRequest(f"job {part.job_id}'s record is larger than {MAX_RESULT_BYTES} bytes")
        if part.last:
            self._drop(part.job_id)
            data += part.data
            return part.job_id, owner, bytes(data)
        if self._share is not None:
            try:  # RESOURCE_EXHAUSTED ends the stream, and with it what it held: the node sends it again
                self._share.take(len(part.data), pieces=0 if part.job_id in self._open else 1)
            except BudgetExhausted:
                self._drop(part.job_id)
                raise
        data += part.data
        self._bytes += len(part.data)
        self._open[part.job_id] = (owner, data)
        return None

    def _drop(self, job_id: int) -> None:
        found = self._open.pop(job_id, None)
        if found is not None:
            self._bytes -= len(found[1])
            if self._share is not None:
                self._share.give(len(found[1]), pieces=1)


class NodeService(node_pb2_grpc.NodeServiceServicer):
    """``verifier_key``: the farm's, handed to nodes that join. ``peer_name``: given when a CA is configured;
    it returns the common name of the certificate the call's peer showed (the CA signed it, or the handshake
    failed), and a node joins only under the name its certificate gives it: one node's certificate cannot
    take another node's place."""

    def __init__(self, nodes: Nodes, *, verifier_key: bytes, version: str, lease_s: float,
                 peer_name: Callable[[Any], str | None] | None = None, names: NameGuard | None = None,
                 budgets: Budgets | None = None) -> None:
        self._names = names
        """Node names bound to the node credential that first joined with each (None: bound to nobody)."""
        self._nodes = nodes
        self._budgets = budgets or Budgets()
        """What each credential holds at once across its streams: a node's unfinished records count there."""
        self._key = verifier_key
        self._version = version
        self._lease_s = lease_s
        self._peer_name = peer_name

    async def Work(self, request_iterator: AsyncIterator[node_pb2.WorkRequest],
                   context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[node_pb2.WorkResponse]:
        async for message in guarded_stream(context, self._budgeted(request_iterator, context)):
            yield message

    async def _budgeted(self, requests: AsyncIterator[node_pb2.WorkRequest], context: grpc.aio.ServicerContext[Any, Any]
                        ) -> AsyncGenerator[node_pb2.WorkResponse, None]:
        """The stream as one of its credential's (``farmd.api.budget``): a budget spent ends it."""
        async with self._budgets.stream(context, "Work") as share:
            async for message in self._work(requests, context, share):
                yield message

    async def _work(self, requests: AsyncIterator[node_pb2.WorkRequest], context: grpc.aio.ServicerContext[Any, Any],
                    share: Share | None = None) -> AsyncGenerator[node_pb2.WorkResponse, None]:
        certified = self._peer_name(context) if self._peer_name is not None else None
        if self._peer_name is not None and not certified:
            raise FailedPrecondition("this farm admits nodes with a certificate its CA signed, naming the node: pass "
                                     "--tls-cert and --tls-key to farmd serve --join", reason="NODE_CERTIFICATE_REQUIRED")
        try:
            first = await asyncio.wait_for(anext(requests), HELLO_TIMEOUT_S)
        except (StopAsyncIteration, TimeoutError):
            raise BadRequest(f"a node says hello within {HELLO_TIMEOUT_S:.0f}s of connecting") from None
        if first.WhichOneof("kind") != "hello":
            raise BadRequest("a node's first message is its hello")
        hello = _hello(first.hello, context.peer())
        if certified is not None and hello.name != certified:
            raise Refused("PERMISSION_DENIED", f"this node's certificate names it {certified!r}, not "
                          f"{hello.name!r}: a node joins under its certificate's name (--node-name)",
                          "NODE_NAME_NOT_CERTIFIED")
        if self._names is not None and NODE_NAME.fullmatch(hello.name):
            # Another credential's node cannot take this name, connected, disconnected or lost, nor so requeue
            # the holder's leases (``recover``): the name is the credential's that first joined with it.
            await self._names.use(NODE, hello.name, context)
        node = self._nodes.join(hello)
        try:
            # Before the welcome: no lease of this connection can be among those given back.
            await self._nodes.take_back_undelivered(node)
            yield node_pb2.WorkResponse(reply_to=first.id, welcome=node_pb2.Welcome(
                name=node.name, version=self._version, lease=duration(self._lease_s),
                heartbeat_every=duration(self._nodes.heartbeat_s), verifier_key=self._key))
            replies: asyncio.Queue[node_pb2.WorkResponse | None] = asyncio.Queue()
            node.closer = lambda: replies.put_nowait(None)  # a quarantine ends the stream at once
            reader = asyncio.get_running_loop().create_task(self._read(node, requests, replies, share))
            try:
                while (reply := await replies.get()) is not None:
                    yield reply
                spent = reader.exception() if reader.done() and not reader.cancelled() else None
                if isinstance(spent, BudgetExhausted):
                    raise spent
            finally:
                node.closer = None
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            if node.quarantine_reason:
                raise Refused("PERMISSION_DENIED", _text(
                    f"node {node.name!r} is quarantined: {node.quarantine_reason}. It gets no work until an operator "
                    f"clears it (farmctl nodes clear {node.name})", 2000), "NODE_QUARANTINED")
        finally:
            self._nodes.leave(node)

    async def _read(self, node: Node, requests: AsyncIterator[node_pb2.WorkRequest],
                    replies: asyncio.Queue[node_pb2.WorkResponse | None], share: Share | None = None) -> None:
        """Answer the node's requests in order, except leases: a lease may wait for work, and must not hold
        up the heartbeats and results behind it, so each is answered when it can be (by its id)."""
        parts = _Parts(share)
        leasing: set[asyncio.Task[None]] = set()
        try:
            async for request in requests:
                if node.quarantine_reason:  # its stream ends now, though its withdrawals may still be on the way
                    break
                if request.WhichOneof("kind") == "lease":
                    task = asyncio.get_running_loop().create_task(self._reply(node, request, parts, replies))
                    leasing.add(task)
                    task.add_done_callback(leasing.discard)
                else:
                    await self._reply(node, request, parts, replies)
        finally:
            for task in leasing:
                task.cancel()
            await asyncio.gather(*leasing, return_exceptions=True)
            replies.put_nowait(None)

    async def _reply(self, node: Node, request: node_pb2.WorkRequest, parts: _Parts,
                     replies: asyncio.Queue[node_pb2.WorkResponse | None]) -> None:
        try:
            reply = await self._answer(node, request, parts)
        except BudgetExhausted:
            raise  # the stream ends with RESOURCE_EXHAUSTED (``_work``)
        except FarmError as exc:
            reply = node_pb2.WorkResponse(error=_text(str(exc), 500))
        except Exception:
            log.exception("node %s: a request failed", node.name)
            reply = node_pb2.WorkResponse(error="the coordinator failed on this request; its log has the details")
        if reply is not None:
            reply.reply_to = request.id
            replies.put_nowait(reply)

    async def _answer(self, node: Node, request: node_pb2.WorkRequest, parts: _Parts
                      ) -> node_pb2.WorkResponse | None:
        kind = request.WhichOneof("kind")
        nodes = self._nodes
        if kind == "lease":
            try:
                leased = await self._lease(node, request.lease, seconds(request.lease.wait))
            except ValueError as exc:  # not an endpoint's name
                return node_pb2.WorkResponse(error=f"a lease request: {exc}"[:500])
            return node_pb2.WorkResponse(leased=leased)
        if kind == "heartbeat":
            beat = request.heartbeat
            if len(beat.job_ids) > MAX_JOB_IDS or len(beat.policies) > 1024:
                raise BadRequest(f"a heartbeat names at most {MAX_JOB_IDS} rollouts and 1024 policies")
            held = await nodes.heartbeat(node, list(beat.job_ids), tuple(_text(p, 64) for p in beat.policies))
            return node_pb2.WorkResponse(heartbeat=node_pb2.HeartbeatReply(held=held))
        if kind == "results":
            return await self._results(node, request.results, parts)
        if kind == "fail":
            fail = request.fail
            state = await nodes.fail(node, fail.job_id, _text(fail.error, 2000), fail.transient)
            return node_pb2.WorkResponse(count=node_pb2.CountReply(
                count=int(state is not None), state=state.value if isinstance(state, JobState) else ""))
        if kind == "release":
            return node_pb2.WorkResponse(count=node_pb2.CountReply(count=await nodes.release(node)))
        if kind == "recover":
            return node_pb2.WorkResponse(count=node_pb2.CountReply(count=await nodes.recover(node)))
        raise BadRequest(f"a node may not send {kind or 'an empty message'} here")

    async def _lease(self, node: Node, ask: node_pb2.LeaseRequest, wait_s: float) -> node_pb2.LeaseReply:
        """Up to ``ask.n`` jobs for ``node``, capped at its free capacity (``Nodes.lease``), as the wire has them.
        ValueError for an endpoint that is not an endpoint's name."""
        jobs = await self._nodes.lease(node, ask.n, wait_s, endpoint=ask.endpoint or None,
                                       exclude=tuple(ask.exclude_endpoints))
        leased = []
        for job in jobs:
            sha = await self._nodes.policy_sha256(job.policy_version) if job.policy_version else ""
            leased.append(node_pb2.LeasedJob(
                id=job.id, group_id=job.group_id, env=job.env, seed=job.seed, difficulty=job.difficulty,
                agent=job.agent, attempts=job.attempts, policy_version=job.policy_version, policy_sha256=sha,
                source=job.source))
        return node_pb2.LeaseReply(jobs=leased)

    async def _results(self, node: Node, results: node_pb2.ResultsRequest, parts: _Parts
                       ) -> node_pb2.WorkResponse:
        whole: list[tuple[int, str, bytes]] = []
        for part in results.parts:
            done = parts.add(part)
            if done is not None:
                whole.append(done)
        items: list[tuple[str, Trajectory]] = []
        handled: list[int] = []
        unreadable: dict[int, str] = {}
        parsed = await asyncio.to_thread(_trajectories, whole, node.name) if whole else []
        read: list[tuple[int, str, Trajectory]] = []
        for (job_id, owner, _), trajectory in zip(whole, parsed, strict=True):
            handled.append(job_id)
            if isinstance(trajectory, Exception):  # its lease runs out and the job runs again: never stored
                exc = trajectory
                unreadable[job_id] = _text(f"the record cannot be stored: {exc}", 1000)
                log.warning("node %s sent a record for job %d that cannot be read: %s", node.name, job_id,
                            _text(str(exc), 300), extra={"event": "bad_result", "node": node.name, "job": job_id})
                continue
            read.append((job_id, owner, trajectory))
        vocabs = {v: await self._nodes.vocab_size(v) for v in sorted({t.policy_version for _, _, t in read} - {0})}
        sized = [(t, vocabs.get(t.policy_version)) for _, _, t in read]
        outside = (await asyncio.to_thread(_outside_vocab, sized) if any(v is not None for _, v in sized)
                   else [None] * len(read))
        for (job_id, owner, trajectory), problem in zip(read, outside, strict=True):
            if problem is not None:  # a token its policy cannot sample: refused as any record out of its domain
                unreadable[job_id] = _text(f"the record cannot be stored: {problem}", 1000)
                log.warning("node %s sent a record for job %d out of its domain: %s", node.name, job_id, problem,
                            extra={"event": "bad_result", "node": node.name, "job": job_id})
                continue
            items.append((owner, trajectory))
        completed = await self._nodes.report(node, items) if items else Completion()
        # Told why (the node drops them from its outbox), not counted towards its quarantine: what one record
        # holds decides nothing beyond that record; lying about a lease or a verdict is what quarantines.
        refused = {**unreadable, **completed.refused}
        reply = node_pb2.ResultsReply(
            stored=completed.reported, handled=handled,
            refused=[node_pb2.Refusal(job_id=job, reason=_text(why, 1000)) for job, why in refused.items()])
        if results.HasField("lease") and not node.quarantine_reason:
            # Asked with the results (after them: the slots they held are free now), never waiting for work: the
            # reply to what the node finished is not held up. A lease that cannot be had is no failed report.
            try:
                reply.leased.CopyFrom(await self._lease(node, results.lease, 0.0))
            except ValueError as exc:
                log.info("node %s: the lease sent with its results was not served: %s", node.name, exc,
                         extra={"event": "bad_lease", "node": node.name})
            except Exception:
                log.exception("node %s: the lease sent with its results failed", node.name)
        return node_pb2.WorkResponse(results=reply)
