"""The fleet, as the coordinator sees it: which worker nodes have joined, what each holds, which are lost.

A node (``farmd serve --join``) takes leases through the same scheduler calls a local worker makes; this
registry stands between them and adds what a remote machine needs: a name no other connected node holds,
a refusal for a host that cannot isolate, leases never beyond the node's declared capacity, and the
per-node figures ``farmctl status`` lists. A lease owner is ``<node>:<pid>:<nonce>``, so everything a
node holds is found by its name's prefix, and a node can only report for owners under its own name.

A node reports results; it does not decide what is true. Each result is stored under its lease's identity, and
one whose record says otherwise (another environment, agent, seed, group or policy version) is refused and counted
against the node. Its verdicts are checked (``farmd.scheduler.checks``): its first results after it joins and a
share of the rest are verified again on the coordinator's boxes, and known-answer canary jobs come to it unannounced,
shaped like its own work. A node whose verdict disagrees with the coordinator's, or that keeps reporting under other
leases, is quarantined: its stream ends with the reason, its leases go back to the queue, every result of its the
coordinator did not confirm is withdrawn from the streams (consumers are told), and it cannot join again until an
operator clears it (``farmctl nodes clear NAME``). Quarantines are kept in the store: a restart keeps them.

A node that says nothing for ``lost_after_s`` is marked lost and its leases go back to the queue at once
(they would anyway when they expire: this only stops the farm waiting out a lease for a machine that is
gone). A node whose connection dropped is silent too: it keeps its leases until it is lost or they expire,
whichever comes first, and if it reconnects before then it resends what it finished meanwhile. Whatever it sends late for a lease that
went elsewhere is dropped by the store, which stores a job only for the owner holding its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farmd.errors import BadRequest, Conflict, FailedPrecondition, NotFound
from farmd.records import KNOWN_ANSWER_AGENT, NODE_NAME, Job, JobState, Trajectory, evolve, verified_by_node
from farmd.scheduler.checks import AGREED, CANARY, DISAGREED, REVERIFY, Check, Checker, NodeChecks
from farmd.store.nodes import Completion
from farmd.tasks import cancel_and_wait
from farmd.unpredictable import Unpredictable

if TYPE_CHECKING:
    from farmd.scheduler.scheduler import Scheduler

log = logging.getLogger("farmd.nodes")

MAX_CAPACITY = 4096
MAX_FACTS = 32
MAX_FACT_CHARS = 256
MAX_CHECKS = 64
MAX_LEASE_WAIT_S = 5.0
MAX_MODEL_JOBS = 4096
"""Model endpoints' jobs one node holds at once (its endpoints' own caps are lower): they take no slot."""
MAX_EXCLUDED = 256
KEPT_GONE = 256
"""Nodes no longer connected still listed (lost ones first to go): a fleet that churns names must not
grow the registry without bound."""
QUARANTINED = "quarantined"
_TEMPLATES_KEPT = 64
"""A node's latest jobs, which its canaries are shaped after."""
_CANARY_GROUPS_KEPT = 4096
_CANARY_AGENTS = ("reference", "random")
"""What a canary's agent is when the node's own work has no agent whose answer is a function of the task."""


@dataclass(frozen=True, slots=True)
class IsolationCheck:
    """One check of a node's host as its hello reports it (``farmctl doctor``'s, bounded by the API)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Hello:
    """What a node says when it joins (parsed and bounded by the API)."""

    name: str
    owner: str
    capacity: int
    version: str
    address: str
    isolation: tuple[IsolationCheck, ...]
    """Its host's checks, as ``farmctl doctor`` reports them."""
    facts: dict[str, str] = field(default_factory=dict)
    held: frozenset[int] | None = None
    """On a rejoin, the jobs it holds (running, or results not yet delivered); None on a first hello."""


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as operators see it (``Nodes.status``): the coordinator's own worker, a joined node, or one
    kept out by a quarantine from before this coordinator ran."""

    name: str
    address: str
    """Where it joined from (``local``: the coordinator's own worker; "": not connected since it started)."""
    state: str
    """``connected``, ``disconnected``, ``lost`` or ``quarantined``."""
    capacity: int
    in_flight: int
    done: int
    failed: int
    last_heartbeat: float | None
    last_seen: float
    policy_versions: tuple[int, ...]
    """The published policy versions it holds."""
    isolation_ok: bool
    version: str
    facts: Mapping[str, str]
    refused: int = 0
    """Results it reported under an identity its lease does not have."""
    checked: int = 0
    """Its results the coordinator checked and could judge."""
    disagreed: int = 0
    canaries: int = 0
    quarantine_reason: str = ""
    quarantined_at: float | None = None


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
    model_jobs: set[int] = field(default_factory=set)
    """Of ``in_flight``, jobs leased for a model endpoint: they hold none of its capacity."""
    done: int = 0
    failed: int = 0
    policies: tuple[str, ...] = ()
    connection: int = 0
    """Which of the name's connections this is (a rejoin replaces the record's connection)."""
    refused: int = 0
    """Results it reported under an identity its lease does not have."""
    checked: int = 0
    """Its results the coordinator checked and could judge (re-verified, or canaries)."""
    disagreed: int = 0
    canaries: int = 0
    """Canary results of its that were checked."""
    first_checked: int = 0
    """Of its first results since it joined, how many were picked to be verified again (all, up to a number)."""
    leased: int = 0
    """Ordinary jobs it leased (canaries not counted)."""
    canaries_sent: int = 0
    canary_owed: int = 0
    """Canary jobs it is owed (each ordinary job leased adds one with chance ``canary_share``)."""
    canary_wait: int = 1
    """What must be owed before a canary is drawn again: the size of the last template group too big to pay."""
    canary_due: int = 1
    """The first canary follows its ``canary_due``-th ordinary job (drawn when it first joins)."""
    recent: deque[Job] = field(default_factory=lambda: deque(maxlen=_TEMPLATES_KEPT))
    quarantine_reason: str = ""
    quarantined_at: float | None = None
    closer: Callable[[], None] | None = None
    """Ends its stream (set by the API while the stream is open): a quarantine does not wait for it to call."""
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set (and replaced) when jobs leave ``in_flight``: what a lease for slots the node has freed, but whose
    results are still on their way, waits on."""

    def free(self) -> None:
        self.freed.set()
        self.freed = asyncio.Event()

    @property
    def name(self) -> str:
        return self.hello.name

    @property
    def isolation_ok(self) -> bool:
        return bool(self.hello.isolation) and all(c.ok for c in self.hello.isolation)

    def owns(self, owner: str) -> bool:
        return owner.startswith(f"{self.name}:")


class Nodes:
    """``lost_after_s``: silence after which a node is lost. ``local``: the coordinator's own worker's node
    name, when it runs one (a remote node may not take it: its leases share the prefix). ``checker``: the
    coordinator's own judgement on its own boxes (None: it has none, and nodes' verdicts go unchecked, loudly)."""

    def __init__(self, scheduler: Scheduler, *, lost_after_s: float, local: str | None = None,
                 local_status: Callable[[], NodeStatus] | None = None, checker: Checker | None = None) -> None:
        self._scheduler = scheduler
        self._local_status = local_status
        """The coordinator's own worker, as a row of ``status`` (None: it runs none)."""
        self.lost_after_s = lost_after_s
        self._local = local
        self._nodes: dict[str, Node] = {}
        self._connections = 0
        self._task: asyncio.Task[None] | None = None
        self._policy_versions: dict[str, int] = {}
        self._quarantined: dict[str, tuple[str, float]] = {}
        """Quarantined names: why, since when (the store's, loaded at start)."""
        self._rng = Unpredictable()
        """Which results are checked and when canaries go: nothing a node could predict from what it sees."""
        self._canary_groups: deque[int] = deque(maxlen=_CANARY_GROUPS_KEPT)
        self._quarantining: set[asyncio.Task[None]] = set()
        config = scheduler.config
        self.checks = NodeChecks(scheduler.store, checker, tolerance=config.reverify_tolerance,
                                 concurrency=config.reverify_concurrency, outcome=self._checked,
                                 skip=self._quarantined.__contains__, metrics=scheduler.metrics)

    @property
    def heartbeat_s(self) -> float:
        """How often a node must speak: three chances before it is lost, and well inside a lease."""
        return min(self.lost_after_s / 3, self._scheduler.config.lease_s / 3)

    async def start(self) -> None:
        store = self._scheduler.store
        self._quarantined.update(await store.nodes.quarantined())
        # Canaries wait for nodes of an earlier run of this coordinator; each node gets its own once it works.
        await store.nodes.cancel_canaries()
        self._gauge()
        await self.checks.start()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="nodes-watch")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await self.checks.stop()
        await asyncio.gather(*self._quarantining, return_exceptions=True)  # a quarantine half-kept is no quarantine

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
        if hello.name in self._quarantined:
            reason, _ = self._quarantined[hello.name]
            raise FailedPrecondition(f"node {hello.name!r} is quarantined ({reason}); it gets no work until an operator "
                                     f"clears it: farmctl nodes clear {hello.name}", reason="NODE_QUARANTINED")
        held = self._nodes.get(hello.name)
        if held is not None and held.state == "connected":
            raise Conflict(f"a node named {hello.name!r} is connected already (from {held.hello.address}); "
                           f"give each node its own --node-name")
        gaps = [c for c in hello.isolation if not c.ok]
        if gaps or not hello.isolation:
            report = "; ".join(f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                               for c in gaps) or "it sent no isolation report"
            log.warning("refused node %s: its host cannot isolate untrusted code: %s", hello.name, report,
                        extra={"event": "node_refused", "node": hello.name})
            raise FailedPrecondition(f"node {hello.name!r} cannot isolate untrusted code, so it gets no work: {report}",
                                     reason="NODE_CANNOT_ISOLATE")
        self._connections += 1
        node = Node(hello, connection=self._connections)
        if held is not None:  # a rejoin: what it did before still counts
            for name in ("done", "failed", "refused", "checked", "disagreed", "canaries", "first_checked", "leased",
                         "canaries_sent", "canary_owed", "canary_due", "recent"):
                setattr(node, name, getattr(held, name))
        else:
            node.canary_due = self._rng.randint(1, self._scheduler.config.canary_first_within)
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
        return self._nodes.get(node.name) is node and node.state not in ("lost", QUARANTINED)

    def _seen(self, node: Node) -> None:
        node.last_seen = time.time()
        if node.state == "lost" and self._nodes.get(node.name) is node:
            node.state = "connected"  # it was only slow: its old leases went elsewhere, new ones are fine
            log.info("node %s is back", node.name, extra={"event": "node_back", "node": node.name})

    # -- the lease calls, for one node ----------------------------------------------------------------

    async def lease(self, node: Node, n: int, wait_s: float = 0.0, *, endpoint: str | None = None,
                    exclude: Sequence[str] = ()) -> list[Job]:
        """Up to ``n`` jobs, never past the node's capacity. With none queued, wait up to ``wait_s`` for some:
        an idle node then asks about once a second, not ten times. ``endpoint``: of that model endpoint's agents
        only, which hold no slot of the node's (they wait on a server): at most ``MAX_MODEL_JOBS`` of them at once;
        ``exclude``: none of those endpoints' jobs. ValueError for a name that is not an endpoint's."""
        self._seen(node)
        if len(exclude) > MAX_EXCLUDED:
            raise ValueError(f"at most {MAX_EXCLUDED} endpoints excluded, not {len(exclude)}")
        node.model_jobs &= node.in_flight
        asked = n
        if endpoint is None:
            n = min(n, node.hello.capacity - len(node.in_flight - node.model_jobs))
        else:
            n = min(n, MAX_MODEL_JOBS - len(node.model_jobs))
        if n <= 0 and endpoint is None and wait_s > 0 and self.current(node):
            # A node asks for the slots its finished rollouts freed as soon as they finish, and their results reach
            # here just after: the lease waits for them (up to its wait) rather than coming back empty and asked
            # again and again.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(node.freed.wait(), min(wait_s, MAX_LEASE_WAIT_S))
            n = min(asked, node.hello.capacity - len(node.in_flight - node.model_jobs))
        if n <= 0 or not self.current(node):
            return []
        jobs = await self._scheduler.lease(node.hello.owner, n, endpoint=endpoint, exclude=exclude)
        if not jobs and wait_s > 0:
            await self._scheduler.wait_for_work(min(wait_s, MAX_LEASE_WAIT_S))
            if not self.current(node):
                return []
            jobs = await self._scheduler.lease(node.hello.owner, n, endpoint=endpoint, exclude=exclude)
        node.in_flight.update(j.id for j in jobs)
        if endpoint is not None:
            node.model_jobs.update(j.id for j in jobs)
        if jobs:
            await self._maybe_canary(node, jobs)
        return jobs

    async def _maybe_canary(self, node: Node, jobs: list[Job]) -> None:
        """After ``node`` leased ``jobs``: now and then, a canary group for it alone, shaped as one of its own
        recent jobs' groups (environment, task, size, source: what the node sees of a job), acted by an agent
        whose answer is a function of the task (the job's own agent when it is one), queued as any job is. Its
        first comes after a random one of its first jobs; after that, about ``canary_share`` of the jobs it is
        leased are canaries, at moments drawn at random."""
        if not self.checks.enabled:
            return
        ordinary = [j for j in jobs if j.group_id not in self._canary_groups]
        node.leased += len(ordinary)
        node.recent.extend(ordinary)
        share = self._scheduler.config.canary_share
        node.canary_owed += sum(self._rng.random() < share for _ in ordinary)
        first = node.canaries_sent == 0 and node.leased >= node.canary_due
        if not (first or node.canary_owed >= node.canary_wait) or not node.recent:
            return
        template = self._rng.choice(list(node.recent))
        agent = template.agent if KNOWN_ANSWER_AGENT.fullmatch(template.agent) else self._rng.choice(_CANARY_AGENTS)
        made = await self._scheduler.store.nodes.enqueue_canary(node.name, template.id, agent,
                                                               max_size=None if first else node.canary_owed)
        if made is None:  # the template is gone: the next lease draws another
            return
        group, size = made
        if group is None:
            # Its group is bigger than what is owed: a later draw, once that much is owed, pays it. Drawn again at
            # every lease meanwhile, the same refusal cost a database round trip per lease (most of a fleet's).
            node.canary_wait = size
            return
        node.canary_wait = 1
        self._canary_groups.append(group)
        node.canaries_sent += 1
        node.canary_owed = max(0, node.canary_owed - size)
        self._scheduler.work_queued()
        log.debug("canary group %d (%s on %s) for node %s", group, agent, template.env, node.name,
                  extra={"event": "canary_sent", "node": node.name, "group": group})

    async def policy_sha256(self, version: int) -> str:
        return await self._scheduler.policies.sha256_of(version)

    async def vocab_size(self, version: int) -> int | None:
        return await self._scheduler.policies.vocab_size(version)

    async def heartbeat(self, node: Node, job_ids: list[int], policies: tuple[str, ...]) -> int:
        self._seen(node)
        node.last_heartbeat = time.time()
        node.policies = policies
        held = await self._scheduler.heartbeat(node.hello.owner, job_ids)
        # What it says it runs is what it holds: a lease it lost while slow stops counting against it.
        node.in_flight &= set(job_ids)
        node.free()
        return held

    async def complete(self, node: Node, items: list[tuple[str, Trajectory]]) -> list[int]:
        """``report``: the ids the node is told were stored."""
        return (await self.report(node, items)).reported

    async def report(self, node: Node, items: list[tuple[str, Trajectory]]) -> Completion:
        """Store what ``node`` finished, each under the owner that held its lease (this incarnation's, or an
        earlier one's it buffered) and under that lease's identity; an owner outside the node's name is dropped,
        a record that disagrees with its lease refused (and counted against the node). Then pick what of it the
        coordinator checks."""
        self._seen(node)
        if node.state == QUARANTINED:  # in flight when it was quarantined: its leases went back to the queue
            return Completion()
        foreign = [t.id for owner, t in items if not node.owns(owner)]
        if foreign:
            # Dropped, not refused: refusing would leave them in the node's outbox, sent again forever (a node
            # renamed over an old data dir holds its old name's results). Their leases run out as usual.
            log.warning("node %s reported %d results for leases under another name: not stored", node.name,
                        len(foreign), extra={"event": "foreign_results", "node": node.name, "jobs": foreign[:20]})
            items = [(owner, t) for owner, t in items if node.owns(owner)]
        # Its verdicts are its word until the coordinator checks them, whatever its records say of who verified them.
        items = [(owner, evolve(t, node=node.name, verified_by=verified_by_node(node.name)))
                 for owner, t in items]
        done = await self._scheduler.complete_for(items, refuse_mismatch=True) if items else Completion()
        node.in_flight.difference_update(t.id for _, t in items)
        node.free()
        node.done += len(done.stored)
        if done.refused:
            await self._refused(node, done.refused)
        if node.state != QUARANTINED:
            self._pick(node, done)
        return done

    async def _refused(self, node: Node, refused: dict[int, str]) -> None:
        node.refused += len(refused)
        metrics = self._scheduler.metrics
        if metrics is not None:
            metrics.node_results_refused.inc(len(refused))
        job, why = next(iter(refused.items()))
        log.warning("node %s reported %d results that disagree with their leases, refused (%d in all); job %d: %s",
                    node.name, len(refused), node.refused, job, why,
                    extra={"event": "results_refused", "node": node.name, "jobs": sorted(refused)[:20],
                           "refused": node.refused})
        if node.refused >= self._scheduler.config.node_refusals_quarantine:
            await self.quarantine(node.name, f"{node.refused} results reported under identities their leases do "
                                             f"not have; job {job}'s: {why}")

    def _pick(self, node: Node, done: Completion) -> None:
        """The checks of what ``node`` just reported: every canary, its first results since it joined, and a
        share of the rest picked now, after they arrived."""
        if not self.checks.enabled:
            return
        config = self._scheduler.config
        for job_id in done.stored:
            first = node.first_checked < config.reverify_first
            if first:
                node.first_checked += 1
            elif self._rng.random() >= config.reverify_share:
                continue
            self.checks.add(Check(REVERIFY, node.name, job_id), must=first)
        for job_id, record in done.canaries.items():
            self.checks.add(Check(CANARY, node.name, job_id, record), must=True)

    async def _checked(self, name: str, kind: str, job_id: int, outcome: str, detail: str) -> None:
        """A check of ``name``'s result came back: counted; a disagreement quarantines the node."""
        node = self._nodes.get(name)
        if node is not None and outcome in (AGREED, DISAGREED):
            node.checked += 1
            node.canaries += kind == CANARY
            node.disagreed += outcome == DISAGREED
        if outcome == DISAGREED:
            # A failed canary shows the node does not run its jobs as leased: then what the coordinator confirmed of
            # it (a verdict, never who produced the attempt) is withdrawn too. A wrong verdict withdraws what is
            # still only its word.
            what = "canary" if kind == CANARY else "result"
            await self.quarantine(name, f"its {what} for job {job_id} disagrees with the coordinator: {detail}",
                                  everything=kind == CANARY)

    async def quarantine(self, name: str, reason: str, *, everything: bool = False) -> None:
        """Take ``name`` out of the fleet until an operator clears it: no more work (its stream ends with
        ``reason``), its leases back to the queue, every result of its the coordinator did not confirm (with
        ``everything``, every result of its) withdrawn from the streams (consumers are told), the operator told
        (an error line, its row in status, a metric)."""
        if name in self._quarantined:
            return
        at = time.time()
        self._quarantined[name] = (reason, at)  # first: no lease or result of its is taken from here on
        node = self._nodes.get(name)
        if node is not None:
            node.state, node.quarantine_reason, node.quarantined_at = QUARANTINED, reason, at
            node.in_flight.clear()
        # Its own stream's reader may be the caller, and ending the stream cancels it: the rest runs as a task of
        # its own, which nothing but a stopping coordinator cancels.
        task = asyncio.get_running_loop().create_task(self._quarantine(name, reason, everything))
        self._quarantining.add(task)
        task.add_done_callback(self._quarantining.discard)
        await asyncio.shield(task)

    async def _quarantine(self, name: str, reason: str, everything: bool) -> None:
        done = await self._scheduler.store.nodes.quarantine(name, reason, everything=everything)
        log.error("node %s quarantined: %s; %d of its results withdrawn from the streams, %d of its jobs back in the "
                  "queue; it joins again only once an operator runs farmctl nodes clear %s", name, reason,
                  done.withdrawn, done.requeued, name,
                  extra={"event": "node_quarantined", "node": name, "reason": reason[:500], "withdrawn": done.withdrawn,
                         "requeued": done.requeued})
        metrics = self._scheduler.metrics
        if metrics is not None:
            metrics.node_quarantines.inc()
        self._gauge()
        self._scheduler.work_queued()
        self._scheduler.delivery.stored()  # streams read on, and carry the withdrawals on their next batch
        node = self._nodes.get(name)
        if node is not None and node.closer is not None:
            node.closer()  # last: its stream ends with the reason, once all of the above is done

    async def clear(self, name: str) -> str:
        """Let a quarantined node join again (on probation: its first results are all checked again). Returns why
        it had been quarantined; ``NotFound`` if it was not."""
        reason = await self._scheduler.store.nodes.clear(name)
        self._quarantined.pop(name, None)
        if reason is None:
            raise NotFound(f"no node named {name!r} is quarantined")
        node = self._nodes.get(name)
        if node is not None and node.state == QUARANTINED:
            node.state, node.first_checked = "disconnected", 0
        self._gauge()
        log.warning("node %s cleared by an operator: it may join again (it was quarantined: %s)", name, reason,
                    extra={"event": "node_cleared", "node": name})
        return reason

    def _gauge(self) -> None:
        if self._scheduler.metrics is not None:
            self._scheduler.metrics.nodes_quarantined.set(len(self._quarantined))

    async def fail(self, node: Node, job_id: int, error: str, transient: bool) -> JobState | None:
        self._seen(node)
        node.in_flight.discard(job_id)
        node.failed += 1
        node.free()
        return await self._scheduler.fail(node.hello.owner, job_id, error, transient=transient)

    async def release(self, node: Node) -> int:
        self._seen(node)
        node.in_flight.clear()
        node.free()
        return await self._scheduler.release(node.hello.owner)

    async def recover(self, node: Node) -> int:
        self._seen(node)
        return await self._scheduler.recover(node.name, node.hello.owner)

    async def take_back_undelivered(self, node: Node) -> int:
        """On a rejoin that names what the node holds (``Hello.held``): its other leases back to the queue."""
        if node.hello.held is None:
            return 0
        return await self._scheduler.take_back_undelivered(node.name, node.hello.owner, node.hello.held)

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
            if node.state in ("lost", QUARANTINED) or now - node.last_seen < self.lost_after_s:
                continue
            node.state = "lost"
            node.in_flight.clear()
            requeued = await self._scheduler.expire_node(node.name)
            await self._scheduler.store.nodes.cancel_canaries(node.name)  # it gets its own when it works again
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

    async def status(self) -> list[NodeStatus]:
        """One row per node: the coordinator's own worker first (address ``local``), then joined ones."""
        out = [self._local_status()] if self._local_status is not None else []
        for node in sorted(self._nodes.values(), key=lambda n: n.name):
            for sha in node.policies:
                if sha not in self._policy_versions:
                    policy = await self._scheduler.store.policy_by_hash(sha)
                    self._policy_versions[sha] = policy.version if policy is not None else 0
            reason, at = self._quarantined.get(node.name, ("", None))
            out.append(NodeStatus(
                name=node.name, address=node.hello.address,
                state=QUARANTINED if node.name in self._quarantined else node.state, capacity=node.hello.capacity,
                in_flight=len(node.in_flight), done=node.done, failed=node.failed, last_heartbeat=node.last_heartbeat,
                last_seen=node.last_seen, policy_versions=tuple(self.versions_of(node.policies)),
                isolation_ok=node.isolation_ok, version=node.hello.version, facts=dict(node.hello.facts),
                refused=node.refused, checked=node.checked, disagreed=node.disagreed, canaries=node.canaries,
                quarantine_reason=reason, quarantined_at=at))
        for name, (reason, at) in sorted(self._quarantined.items()):  # kept out since before this coordinator ran
            if name not in self._nodes:
                out.append(NodeStatus(name=name, address="", state=QUARANTINED, capacity=0, in_flight=0, done=0,
                                      failed=0, last_heartbeat=None, last_seen=at, policy_versions=(),
                                      isolation_ok=False, version="", facts={}, quarantine_reason=reason,
                                      quarantined_at=at))
        return out
