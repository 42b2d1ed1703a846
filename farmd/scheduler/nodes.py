"""The fleet, as the coordinator sees it: which worker nodes have joined, what each holds, which are lost.

A node (``farmd serve --join``) takes leases through the same scheduler calls a local worker makes; this
registry stands between them and adds what a remote machine needs: a name no other connected node holds,
a refusal for a host that cannot isolate, leases never beyond the node's declared capacity, and the
per-node figures ``farmctl status`` lists. A lease owner is ``<node>:<pid>:<nonce>``, so everything a
node holds is found by its name's prefix, and a node can only report for owners under its own name.

A node that says nothing for ``lost_after_s`` is marked lost and its leases go back to the queue at once
(they would anyway when they expire: this only stops the farm waiting out a lease for a machine that is
gone). A node whose connection dropped is silent too: it keeps its leases until it is lost or they expire,
whichever comes first, and if it reconnects before then it resends what it finished meanwhile. Whatever it sends late for a lease that
went elsewhere is dropped by the store, which stores a job only for the owner holding its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from farmd.errors import BadRequest, Conflict, FailedPrecondition
from farmd.records import NODE_NAME, Job, JobState, Trajectory
from farmd.tasks import cancel_and_wait

if TYPE_CHECKING:
    from farmd.scheduler.scheduler import Scheduler

log = logging.getLogger("farmd.nodes")

MAX_CAPACITY = 4096
MAX_FACTS = 32
MAX_FACT_CHARS = 256
MAX_CHECKS = 64
MAX_LEASE_WAIT_S = 5.0
KEPT_GONE = 256
"""Nodes no longer connected still listed (lost ones first to go): a fleet that churns names must not
grow the registry without bound."""


@dataclass(frozen=True, slots=True)
class Hello:
    """What a node says when it joins (parsed and bounded by the API)."""

    name: str
    owner: str
    capacity: int
    version: str
    address: str
    isolation: tuple[dict[str, Any], ...]
    """``{"name", "ok", "detail", "fix"}`` per check, as ``farmctl doctor`` reports them."""
    facts: dict[str, str] = field(default_factory=dict)


@dataclass
class Node:
    hello: Hello
    state: str = "connected"
    """``connected``; ``disconnected`` (its stream ended: leases kept until they expire); ``lost`` (silent
    past ``lost_after_s``: leases requeued)."""
    joined_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    last_heartbeat: float | None = None
    in_flight: set[int] = field(default_factory=set)
    done: int = 0
    failed: int = 0
    policies: tuple[str, ...] = ()
    connection: int = 0
    """Which of the name's connections this is (a rejoin replaces the record's connection)."""

    @property
    def name(self) -> str:
        return self.hello.name

    @property
    def isolation_ok(self) -> bool:
        return bool(self.hello.isolation) and all(c.get("ok") for c in self.hello.isolation)

    def owns(self, owner: str) -> bool:
        return owner.startswith(f"{self.name}:")


class Nodes:
    """``lost_after_s``: silence after which a node is lost. ``local``: the coordinator's own worker's node
    name, when it runs one (a remote node may not take it: its leases share the prefix)."""

    def __init__(self, scheduler: Scheduler, *, lost_after_s: float, local: str | None = None,
                 local_status: Callable[[], dict[str, Any]] | None = None) -> None:
        self._scheduler = scheduler
        self._local_status = local_status
        """The coordinator's own worker, as a row of ``status`` (None: it runs none)."""
        self.lost_after_s = lost_after_s
        self._local = local
        self._nodes: dict[str, Node] = {}
        self._connections = 0
        self._task: asyncio.Task[None] | None = None
        self._policy_versions: dict[str, int] = {}

    @property
    def heartbeat_s(self) -> float:
        """How often a node must speak: three chances before it is lost, and well inside a lease."""
        return min(self.lost_after_s / 3, self._scheduler.config.lease_s / 3)

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="nodes-watch")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    # -- joining and leaving ------------------------------------------------------------------------

    def join(self, hello: Hello) -> Node:
        """Admit a node, or refuse it: a bad name, a name another connected node holds, no capacity, or
        a host that cannot isolate (with what its own doctor found)."""
        if not NODE_NAME.fullmatch(hello.name):
            raise BadRequest("a node's name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        if not hello.owner.startswith(f"{hello.name}:") or len(hello.owner) > 200:
            raise BadRequest("a node's lease owner is '<name>:<pid>:<nonce>'")
        if not 1 <= hello.capacity <= MAX_CAPACITY:
            raise BadRequest(f"a node's capacity is 1 to {MAX_CAPACITY} rollouts")
        if hello.name == self._local:
            raise Conflict(f"{hello.name!r} is the coordinator's own worker: give the node its own --node-name")
        held = self._nodes.get(hello.name)
        if held is not None and held.state == "connected":
            raise Conflict(f"a node named {hello.name!r} is connected already (from {held.hello.address}); "
                           f"give each node its own --node-name")
        gaps = [c for c in hello.isolation if not c.get("ok")]
        if gaps or not hello.isolation:
            report = "; ".join(f"{c.get('name')}: {c.get('detail')}" + (f" (fix: {c['fix']})" if c.get("fix") else "")
                               for c in gaps) or "it sent no isolation report"
            log.warning("refused node %s: its host cannot isolate untrusted code: %s", hello.name, report,
                        extra={"event": "node_refused", "node": hello.name})
            raise FailedPrecondition(f"node {hello.name!r} cannot isolate untrusted code, so it gets no work: {report}",
                                     reason="NODE_CANNOT_ISOLATE")
        self._connections += 1
        node = Node(hello, connection=self._connections)
        if held is not None:  # a rejoin: what it did before still counts
            node.done, node.failed = held.done, held.failed
        self._nodes[hello.name] = node
        self._forget_gone()
        log.info("node %s joined from %s: %d slots, farmd %s", hello.name, hello.address, hello.capacity,
                 hello.version, extra={"event": "node_joined", "node": hello.name, "capacity": hello.capacity})
        return node

    def leave(self, node: Node) -> None:
        """``node``'s stream ended. Its leases stay its own until it is lost or they expire, unless it rejoins."""
        if self._nodes.get(node.name) is node and node.state == "connected":
            node.state = "disconnected"
            log.info("node %s disconnected (%d rollouts in flight keep their leases until it is lost or they expire)",
                     node.name, len(node.in_flight), extra={"event": "node_left", "node": node.name})

    def current(self, node: Node) -> bool:
        """Whether ``node`` is still the name's live connection (a stale stream must not act for it)."""
        return self._nodes.get(node.name) is node and node.state != "lost"

    def _seen(self, node: Node) -> None:
        node.last_seen = time.time()
        if node.state == "lost" and self._nodes.get(node.name) is node:
            node.state = "connected"  # it was only slow: its old leases went elsewhere, new ones are fine
            log.info("node %s is back", node.name, extra={"event": "node_back", "node": node.name})

    # -- the lease calls, for one node ----------------------------------------------------------------

    async def lease(self, node: Node, n: int, wait_s: float = 0.0) -> list[Job]:
        """Up to ``n`` jobs, never past the node's capacity. With none queued, wait up to ``wait_s`` for some:
        an idle node then asks about once a second, not ten times."""
        self._seen(node)
        n = min(n, node.hello.capacity - len(node.in_flight))
        if n <= 0 or not self.current(node):
            return []
        jobs = await self._scheduler.lease(node.hello.owner, n)
        if not jobs and wait_s > 0:
            await self._scheduler.wait_for_work(min(wait_s, MAX_LEASE_WAIT_S))
            if not self.current(node):
                return []
            jobs = await self._scheduler.lease(node.hello.owner, n)
        node.in_flight.update(j.id for j in jobs)
        return jobs

    async def policy_sha256(self, version: int) -> str:
        return await self._scheduler.policies.sha256_of(version)

    async def heartbeat(self, node: Node, job_ids: list[int], policies: tuple[str, ...]) -> int:
        self._seen(node)
        node.last_heartbeat = time.time()
        node.policies = policies
        held = await self._scheduler.heartbeat(node.hello.owner, job_ids)
        # What it says it runs is what it holds: a lease it lost while slow stops counting against it.
        node.in_flight &= set(job_ids)
        return held

    async def complete(self, node: Node, items: list[tuple[str, Trajectory]]) -> list[int]:
        """Store what ``node`` finished, each under the owner that held its lease (this incarnation's, or an
        earlier one's it buffered); an owner outside the node's name is refused."""
        self._seen(node)
        foreign = [t.id for owner, t in items if not node.owns(owner)]
        if foreign:
            # Dropped, not refused: refusing would leave them in the node's outbox, sent again forever (a node
            # renamed over an old data dir holds its old name's results). Their leases run out as usual.
            log.warning("node %s reported %d results for leases under another name: not stored", node.name,
                        len(foreign), extra={"event": "foreign_results", "node": node.name, "jobs": foreign[:20]})
            items = [(owner, t) for owner, t in items if node.owns(owner)]
        stored = await self._scheduler.complete_for(items) if items else []
        node.in_flight.difference_update(t.id for _, t in items)
        node.done += len(stored)
        return stored

    async def fail(self, node: Node, job_id: int, error: str, transient: bool) -> JobState | None:
        self._seen(node)
        node.in_flight.discard(job_id)
        node.failed += 1
        return await self._scheduler.fail(node.hello.owner, job_id, error, transient=transient)

    async def release(self, node: Node) -> int:
        self._seen(node)
        node.in_flight.clear()
        return await self._scheduler.release(node.hello.owner)

    async def recover(self, node: Node) -> int:
        self._seen(node)
        return await self._scheduler.recover(node.name, node.hello.owner)

    # -- upkeep and status ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.lost_after_s / 4))
            try:
                await self.mark_lost()
            except Exception:
                log.exception("checking nodes failed")

    async def mark_lost(self) -> list[str]:
        """Nodes silent for ``lost_after_s``: lost, and their leases requeued now. Returns their names."""
        now = time.time()
        lost = []
        for node in list(self._nodes.values()):
            if node.state == "lost" or now - node.last_seen < self.lost_after_s:
                continue
            node.state = "lost"
            node.in_flight.clear()
            requeued = await self._scheduler.expire_node(node.name)
            lost.append(node.name)
            log.warning("node %s lost: silent for %.0fs; %d of its rollouts went back to the queue", node.name,
                        now - node.last_seen, requeued,
                        extra={"event": "node_lost", "node": node.name, "requeued": requeued})
        return lost

    def _forget_gone(self) -> None:
        gone = [n for n in self._nodes.values() if n.state != "connected"]
        for node in sorted(gone, key=lambda n: (n.state != "lost", n.last_seen))[:max(0, len(gone) - KEPT_GONE)]:
            del self._nodes[node.name]

    def versions_of(self, hashes: tuple[str, ...]) -> list[int]:
        return sorted(v for v in (self._policy_versions.get(h) for h in hashes) if v)

    async def status(self) -> list[dict[str, Any]]:
        """One row per node: the coordinator's own worker first (address ``local``), then joined ones."""
        out = [self._local_status()] if self._local_status is not None else []
        for node in sorted(self._nodes.values(), key=lambda n: n.name):
            for sha in node.policies:
                if sha not in self._policy_versions:
                    policy = await self._scheduler.store.policy_by_hash(sha)
                    self._policy_versions[sha] = policy.version if policy is not None else 0
            out.append({"name": node.name, "address": node.hello.address, "state": node.state,
                        "capacity": node.hello.capacity, "in_flight": len(node.in_flight), "done": node.done,
                        "failed": node.failed, "last_heartbeat": node.last_heartbeat, "last_seen": node.last_seen,
                        "joined_at": node.joined_at, "policy_versions": self.versions_of(node.policies),
                        "isolation_ok": node.isolation_ok, "version": node.hello.version,
                        "facts": dict(node.hello.facts)})
        return out
