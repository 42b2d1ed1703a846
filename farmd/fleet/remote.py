"""The scheduler's lease calls, made over a node's link: what a local worker calls ``Leases``.

The worker cannot tell these from the scheduler's own. The differences are the network's: while the
link is down a lease call returns no jobs, a heartbeat holds nothing, and a finished rollout is written
to the outbox first and sent when it can be (``complete`` never loses one). Each (re)connection first
resends whatever the outbox holds, then, on this incarnation's first, tells the coordinator that leases
of the node's earlier incarnations died with them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

from farm.v1 import node_pb2, trajectory_pb2
from farm_client.convert import duration, to_message

from farmd.errors import LinkDown, RequestFailed
from farmd.fleet.link import Link
from farmd.fleet.outbox import Buffered, Outbox
from farmd.fleet.policy_cache import PolicyCache
from farmd.records import Job, JobState, Trajectory

log = logging.getLogger("farmd.fleet")

PART_BYTES = 512 << 10
MESSAGE_BYTES = 768 << 10
"""A results message carries at most about this much record data: under the coordinator's 1 MiB limit."""
_RESEND_BATCH = 64
_WAIT_FOR_LINK_S = 0.5
LEASE_WAIT_S = 1.0
"""With nothing queued, the coordinator holds a lease request this long for work to arrive: an idle node
asks about once a second, and a job queued meanwhile starts at once."""


def _serialize(owner: str, trajectories: list[Trajectory]) -> list[Buffered]:
    return [Buffered(t.id, owner, to_message(t, trajectory_pb2.Trajectory()).SerializeToString())
            for t in trajectories]


def _messages(items: list[Buffered]) -> Iterator[tuple[list[node_pb2.ResultPart], list[int]]]:
    """Results messages of at most about ``MESSAGE_BYTES``; a record larger than a part goes in pieces."""
    parts: list[node_pb2.ResultPart] = []
    size = 0
    for item in items:
        pieces = [item.data[i:i + PART_BYTES] for i in range(0, len(item.data), PART_BYTES)] or [b""]
        for index, piece in enumerate(pieces):
            if parts and size + len(piece) > MESSAGE_BYTES:
                yield parts, [p.job_id for p in parts if p.last]
                parts, size = [], 0
            parts.append(node_pb2.ResultPart(job_id=item.job_id, owner=item.owner, data=piece,
                                             last=index == len(pieces) - 1))
            size += len(piece)
    if parts:
        yield parts, [p.job_id for p in parts if p.last]


class RemoteLeases:
    def __init__(self, link: Link, outbox: Outbox, policies: PolicyCache) -> None:
        self._link = link
        self._outbox = outbox
        self._policies = policies
        self._recovered = False
        self._arriving: set[int] = set()
        """Jobs leased in a results reply that ``complete_and_lease`` has not yet handed to the worker."""
        self.counters = {"sent": 0, "stored": 0, "resent": 0, "refused": 0, "leased_with_results": 0}

    async def _connected(self) -> bool:
        if self._link.connected.is_set():
            return True
        try:
            await asyncio.wait_for(self._link.connected.wait(), _WAIT_FOR_LINK_S)
        except TimeoutError:
            return False
        return True

    async def lease(self, owner: str, n: int, *, endpoint: str | None = None, exclude: Sequence[str] = ()
                    ) -> list[Job]:
        if not await self._connected():
            return []
        try:
            reply = await self._link.request(lease=node_pb2.LeaseRequest(
                n=n, wait=duration(LEASE_WAIT_S), endpoint=endpoint or "", exclude_endpoints=list(exclude)))
        except (LinkDown, RequestFailed) as exc:
            log.debug("no lease: %s", exc)
            return []
        return self._jobs(owner, reply.leased)

    def _jobs(self, owner: str, reply: node_pb2.LeaseReply) -> list[Job]:
        jobs = []
        for leased in reply.jobs:
            self._policies.learn(leased.policy_version, leased.policy_sha256)
            jobs.append(Job(id=leased.id, group_id=leased.group_id, env=leased.env, seed=leased.seed,
                            difficulty=leased.difficulty, agent=leased.agent, state=JobState.LEASED,
                            attempts=leased.attempts, lease_owner=owner, policy_version=leased.policy_version,
                            source=leased.source or "request"))
        return jobs

    async def heartbeat(self, owner: str, job_ids: list[int]) -> int:
        cached = await asyncio.to_thread(self._policies.cached)  # a directory listing: off the event loop
        try:
            reply = await self._link.request(heartbeat=node_pb2.HeartbeatRequest(job_ids=job_ids, policies=cached))
        except (LinkDown, RequestFailed):
            return 0
        return int(reply.heartbeat.held)

    async def complete(self, owner: str, trajectories: list[Trajectory]) -> list[int]:
        stored, _ = await self.complete_and_lease(owner, trajectories, 0)
        return stored

    async def complete_and_lease(self, owner: str, trajectories: list[Trajectory], n: int, *,
                                 exclude: Sequence[str] = ()) -> tuple[list[int], list[Job]]:
        """``complete``, asking with the results for up to ``n`` jobs (none of ``exclude``'s endpoints) for the
        slots they free: one message, not a results message and a lease request. A coordinator from before
        ``ResultsRequest.lease`` answers none, and the worker leases as before."""
        items = await asyncio.to_thread(_serialize, owner, trajectories)
        await self._outbox.put(items)
        ask = node_pb2.LeaseRequest(n=n, exclude_endpoints=list(exclude)) if n > 0 else None
        leased: list[Job] = []
        try:
            stored = await self._send(items, ask, leased, owner)
        finally:  # the worker starts them as this returns, with no await between
            self._arriving.difference_update(j.id for j in leased)
        return stored, leased

    def holding(self) -> set[int]:
        """Jobs this node holds outside its worker: results not yet delivered, and leases on their way to it."""
        return self._arriving | set(self._outbox.ids())

    async def _send(self, items: list[Buffered], ask: node_pb2.LeaseRequest | None = None,
                    leased: list[Job] | None = None, owner: str = "") -> list[int]:
        """Send ``items`` in messages; what the coordinator dealt with leaves the outbox. Returns the ids it
        stored. On a dropped link the rest stay buffered for the next connection. ``ask``: a lease sent with the
        last message, its jobs added to ``leased``."""
        stored: list[int] = []
        messages = list(_messages(items))
        for index, (parts, _ids) in enumerate(messages):
            request = node_pb2.ResultsRequest(parts=parts)
            if ask is not None and index == len(messages) - 1:
                request.lease.CopyFrom(ask)
            try:
                reply = await self._link.request(results=request)
            except (LinkDown, RequestFailed) as exc:
                log.info("%d results stay buffered: %s", len(self._outbox), exc)
                break
            if leased is not None and reply.results.leased.jobs:
                jobs = self._jobs(owner, reply.results.leased)
                leased.extend(jobs)
                self._arriving.update(j.id for j in jobs)
                self.counters["leased_with_results"] += len(jobs)
            await self._outbox.remove(list(reply.results.handled))
            stored.extend(reply.results.stored)
            for refusal in reply.results.refused:  # dropped, as handled: sending it again cannot change it
                self.counters["refused"] += 1
                log.error("the coordinator refused job %d's result: %s", refusal.job_id, refusal.reason[:1000],
                          extra={"event": "result_refused", "job": refusal.job_id})
            self.counters["sent"] += len(reply.results.handled)
        self.counters["stored"] += len(stored)
        return stored

    async def resend(self) -> int:
        """Send everything the outbox holds (what earlier connections, or runs, could not deliver)."""
        ids = self._outbox.ids()
        for start in range(0, len(ids), _RESEND_BATCH):
            items = await self._outbox.read(ids[start:start + _RESEND_BATCH])
            await self._send(items)
            if not self._link.connected.is_set():
                break
        sent = len(ids) - len(self._outbox)
        if ids:
            self.counters["resent"] += sent
            log.info("resent %d buffered results (%d still buffered)", sent, len(self._outbox),
                     extra={"event": "resent", "results": sent})
        return sent

    async def on_connect(self, _welcome: node_pb2.Welcome, _first: bool) -> None:
        try:
            await self.resend()
            if not self._recovered and self._link.connected.is_set():
                reply = await self._link.request(recover=node_pb2.RecoverRequest())
                self._recovered = True
                if reply.count.count:
                    log.info("%d rollouts an earlier run of this node had leased went back to the queue",
                             reply.count.count)
        except (LinkDown, RequestFailed) as exc:
            log.info("after connecting: %s", exc)

    async def fail(self, owner: str, job_id: int, error: str, *, transient: bool = True) -> JobState | None:
        try:
            reply = await self._link.request(fail=node_pb2.FailRequest(job_id=job_id, error=error,
                                                                       transient=transient))
        except (LinkDown, RequestFailed) as exc:
            log.warning("job %d's failure was not reported (%s): its lease will run out", job_id, exc)
            return None
        return JobState(reply.count.state) if reply.count.state else None

    async def release(self, owner: str) -> int:
        try:
            await self.resend()
            reply = await self._link.request(release=node_pb2.ReleaseRequest())
        except (LinkDown, RequestFailed):
            return 0
        return int(reply.count.count)

    async def recover(self, node: str, owner: str) -> int:
        """Done on connecting (``on_connect``), after the outbox is resent: nothing to do when the worker starts."""
        return 0
