"""The scheduler: what to run (from the task bank), who runs it (leases), and how much (demand).

Jobs come in groups (n attempts at one task, for group-relative methods). Workers,
local or remote, take leases through the same interface (``lease``, ``heartbeat``,
``complete``, ``fail``, ``release``); a lease that expires goes back to the queue;
an infrastructure failure is retried up to ``max_attempts``, after a backoff, and then
recorded as a failure, apart from every score. This is farm's one retry policy: the store
only carries out what it decides. Each job carries the policy version current when
it was leased: the version of its own policy line that will produce its trajectory (``Policies``),
0 when it runs no farm policy. Finished groups of the policy the bank follows feed the task bank,
whose state is saved in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from farmd.flags import WITHDRAWN
from farmd.metrics import Metrics
from farmd.records import RED_TEAM_PREFIX, VERIFIED_LOCAL, Job, JobState, Score, Trajectory, evolve
from farmd.scheduler.commits import GroupCommit, GroupLease
from farmd.scheduler.config import SchedulerConfig
from farmd.scheduler.delivery import ConsumerStatus, Delivery
from farmd.scheduler.policies import Policies
from farmd.scheduler.retention import Disk, Retention
from farmd.store import JobFailure, PassRate, Standby, Store
from farmd.store.codec import pack_body
from farmd.store.jobs import LeaseAsk
from farmd.store.nodes import Completion
from farmd.taskbank import BankConfig, BankStatus, SeedSequence, TaskBank, TaskKey
from farmd.tasks import cancel_and_wait

log = logging.getLogger("farmd.scheduler")

_BANK_STATE = "taskbank"
_SERVING_WORKER = "serving_worker"
"""Saved state: the lease owner of the serving coordinator's own worker ("" when it runs none)."""
_LAG_SHOWN_S = 3600.0
_BANK_SAVE_EVERY_S = 5.0
"""The bank's state is a few hundred kB of JSON: saved this often while groups finish (and on stop), not at
every upkeep round. A crash loses at most this much of its evidence, never a trajectory."""
_DEMAND_DRY_S = 5.0
"""Under ``demand_per_version``, how long nothing on its way to the trainer and no new version may last before
demand queues a batch anyway (the last one's jobs failed, or the trainer publishes less often than a batch)."""
RECENT_FAILURES = 5
"""Job failures ``status`` shows, newest first: enough to see a cause repeat, few enough to read."""

CanaryPlan = Callable[[str, Sequence[tuple[int, int]], int], list[tuple[int, int, str]]]
"""Given an environment, the (seed, level) of the groups just queued on it and how many jobs they hold: the
canary jobs to queue beside them, as (seed, level, agent), one attempt each (intake's production canaries of
a contributed version; none for an environment it does not check). Handed in by the daemon."""


@dataclasses.dataclass(frozen=True, slots=True)
class QueueCounts:
    """Jobs by state (``JobState``), every job ever queued."""

    queued: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    """Infrastructure failures that exhausted their retries: never scored."""
    cancelled: int = 0
    """Dropped from the queue by a cancelled run."""

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> QueueCounts:
        """From the store's counts by state name (a state without jobs may be missing)."""
        return cls(**{state.value: counts.get(state.value, 0) for state in JobState})


@dataclasses.dataclass(frozen=True, slots=True)
class FarmPulse:
    """The farm now, from what is cheap to read (``Scheduler.pulse``)."""

    queue: QueueCounts
    throughput_per_s: float
    """Jobs finished over the last minute, per second."""
    bank: BankStatus
    consumers: tuple[ConsumerStatus, ...]
    streams: int
    """Trajectory streams open now."""
    policy_version: int
    last_seq: int
    """The newest stored trajectory's sequence number."""
    counters: Mapping[str, int]
    """The scheduler's counts since it started (completed, failed, retried, ...)."""


@dataclasses.dataclass(frozen=True, slots=True)
class FarmStatus:
    """The pulse, and what costs a read of every stored trajectory (``Scheduler.status``)."""

    pulse: FarmPulse
    pass_rates: list[PassRate]
    """By environment and level (``Store.pass_rates``)."""
    disk: Disk
    """The disk the store and the policies take, and how fast it grows."""
    recent_failures: list[JobFailure]
    """The newest job failures, newest first."""
    standbys: list[Standby]
    """The coordinators waiting to take over from this one (always none on SQLite: ``shared_store``)."""
    shared_store: bool
    """Whether the store is a server's, which other coordinators may serve the farm from."""


class Scheduler:
    def __init__(self, store: Store, bank: TaskBank, config: SchedulerConfig | None = None,
                 metrics: Metrics | None = None, endpoint_lines: Mapping[str, tuple[str, str]] | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.bank = bank
        self.config = config or SchedulerConfig()
        self.policy_version = 0
        self._rng = random.Random(self.config.seed)
        self._jitter = random.Random()  # apart from ``_rng``, whose seeded draws choose the tasks
        self._bank_cursor = 0
        self._verdict_mark = 0
        """The task bank counts each group it observed by the verdicts its trajectories held at this verdict mark;
        a verdict given later (a rescore, a withdrawal) moves the counts when the mark passes it."""
        self._bank_saved = 0.0
        self._task: asyncio.Task[None] | None = None
        self.policies = Policies(store, self.set_policy_version, endpoint_lines)
        self.delivery = Delivery(store, self.policies.behind, stall_s=self.config.consumer_stall_s,
                                 consumers=self.config.demand_consumers, line_for=self.policies.line_for)
        self.retention = Retention(store, self.policies, keep_newest=self.config.policy_keep_newest,
                                   every_s=self.config.policy_sweep_s)
        """Unused policy content removed in the background; the disk the store takes, and its growth."""
        self._submit_lock = asyncio.Lock()
        self._demand_version = 0
        self._demand_credit = self.config.demand_lag * self.config.demand_per_version
        """Demand rollouts that may still be queued (``demand_per_version``): ``demand_lag`` batches to start with, one
        more with each new version, ``demand_lag`` + 1 at most (lag 1: the batch the trainer learns from next and the
        one sampled meanwhile)."""
        self._demand_moved = 0.0
        self._upkeep_now = asyncio.Event()
        """Set when upkeep should not wait for its period: a new policy version (demand may queue for it)."""
        self._work = asyncio.Event()
        """Set (and replaced) whenever jobs may have become leasable: what a node's parked lease waits on."""
        self.on_work: list[Callable[[], None]] = []
        """Called whenever jobs may have become leasable: this node's own worker, which leases in-process."""
        self.counters: dict[str, int] = {"completed": 0, "failed": 0, "retried": 0, "requeued": 0, "enqueued": 0,
                                         "canaries": 0}
        self.canaries: CanaryPlan | None = None
        self.commits = GroupCommit(self._store_completed, self._completed)
        """Reports of finished jobs that arrive together are stored in one transaction (``complete_for``)."""
        self.leases = GroupLease(self._lease_many)
        """Lease requests that arrive together are served in one transaction (``lease``)."""

    @classmethod
    async def open(cls, store: Store, max_difficulty: dict[str, int], config: SchedulerConfig | None = None,
                   metrics: Metrics | None = None, *, bank_config: BankConfig | None = None,
                   endpoint_lines: Mapping[str, tuple[str, str]] | None = None, seeds: SeedSequence | None = None) -> Scheduler:
        """``seeds``: the farm's keyed sequence of fresh seeds (``farmd.taskbank.seeds``); without, 0, 1, 2, ..."""
        saved = await store.get_state(_BANK_STATE)
        bank = (TaskBank.from_json(saved["bank"], max_difficulty, bank_config, seeds) if saved
                else TaskBank(max_difficulty, bank_config, seeds))
        scheduler = cls(store, bank, config, metrics, endpoint_lines)
        await scheduler.policies.load()
        scheduler._bank_cursor = int(saved["cursor"]) if saved else 0
        # The verdicts the bank's counts hold: a bank saved before it kept this holds today's, near enough.
        scheduler._verdict_mark = int(saved["verdicts"]) if saved and "verdicts" in saved else \
            await store.verdicts.mark()
        scheduler.policy_version = scheduler.policies.newest()
        bank.set_policy_version(scheduler.policy_version)
        # Nodes kept running while this coordinator was down and buffered what they finished: their leases
        # get one lease period from now to reconnect and report, not an expiry they could not prevent.
        await store.extend_all_leases(time.time() + scheduler.config.lease_s)
        return scheduler

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._maintain(), name="scheduler-maintenance")
        await self.retention.start()

    async def stop(self) -> None:
        await self.leases.stop()
        await self.commits.stop()
        await self.retention.stop()
        await cancel_and_wait(self._task)
        await self._observe_finished()
        await self._save_bank()

    # -- demand -----------------------------------------------------------------------------------

    async def submit(self, env: str, agent: str, rollouts: int, group_size: int | None = None,
                     source: str = "request") -> tuple[list[int], int]:
        """Queue ``rollouts`` attempts at tasks the bank picks, in groups. Returns (group ids, jobs)."""
        _, ids, jobs = await self._queue(env, agent, rollouts, group_size, source, as_run=False)
        return ids, jobs

    async def create_run(self, env: str, agent: str, rollouts: int, group_size: int | None = None, *,
                         seeds: Sequence[int] = (), difficulty: int = 0) -> int:
        """``submit``, kept as a run (``Store.run`` says how far it has come). Returns the run's id.

        ``seeds``: these tasks at ``difficulty``, one group each, instead of the bank's picks (an evaluation
        set, a warm-up's references); ``rollouts`` is then ``len(seeds)`` groups' worth.
        """
        if not seeds:
            run_id, _, _ = await self._queue(env, agent, rollouts, group_size, "request", as_run=True)
            return run_id
        size = max(1, group_size or self.config.group_size)
        planned = [(env, int(seed), difficulty, agent, size) for seed in seeds]
        run_id, _ = await self.store.enqueue_run(env, agent, size * len(planned), size, planned)
        self.counters["enqueued"] += size * len(planned)
        await self._queue_canaries(env, agent, planned)
        self._work_queued()
        return run_id

    async def _queue(self, env: str, agent: str, rollouts: int, group_size: int | None, source: str, *,
                     as_run: bool) -> tuple[int, list[int], int]:
        size = max(1, group_size or self.config.group_size)
        groups = max(1, math.ceil(rollouts / size))
        async with self._submit_lock:  # the bank hands out fresh seeds: one caller at a time
            keys = self.bank.sample(env, groups, self._rng)
            while len(keys) < groups:  # a small bank may hand back fewer tasks than asked: reuse them
                keys.append(keys[len(keys) % max(1, len(keys))] if keys else TaskKey(env, 0, self.bank.level(env)))
            sizes = [size] * groups
            sizes[-1] = rollouts - size * (groups - 1) if rollouts >= size else rollouts
            planned = [(k.env, k.seed, k.difficulty, agent, n) for k, n in zip(keys, sizes, strict=True)]
            run_id = 0
            if as_run:
                run_id, ids = await self.store.enqueue_run(env, agent, rollouts, size, planned)
            else:
                ids = await self.store.enqueue(planned, source=source)
        self.counters["enqueued"] += sum(sizes)
        await self._queue_canaries(env, agent, planned)
        self._work_queued()
        return run_id, ids, sum(sizes)

    async def _queue_canaries(self, env: str, agent: str, planned: Sequence[tuple[str, int, int, str, int]]) -> None:
        """Intake's canary jobs for what was just queued on ``env``, on the same tasks (``CanaryPlan``). They are
        jobs like any other, leased in the same queue; their agents are a red team's, so the bank, pass rates
        and trainer streams leave them out. A red team's own jobs get none (canaries of canaries)."""
        if self.canaries is None or agent.startswith(RED_TEAM_PREFIX) or not planned:
            return
        canaries = self.canaries(env, [(seed, level) for _, seed, level, _, _ in planned],
                                 sum(size for *_, size in planned))
        if canaries:
            await self.store.enqueue([(env, seed, level, spec, 1) for seed, level, spec in canaries],
                                     source="canary")
            self.counters["canaries"] += len(canaries)

    async def _top_up_demand(self) -> None:
        cfg = self.config
        if not cfg.demand_agent or not cfg.demand_envs:
            return
        if self.policies.unpublished(cfg.demand_agent) is not None:
            return  # the policy demand runs has not been published yet: its jobs could not run
        unconsumed = await self.delivery.backlog()
        if unconsumed is None:  # no trainer is consuming: nobody to produce ahead of
            return
        counts = await self.store.open_job_counts()
        pending = counts.get(JobState.QUEUED, 0) + counts.get(JobState.LEASED, 0)
        want = cfg.demand_buffer - (unconsumed + pending)
        if cfg.demand_per_version:
            want = min(want, self._demand_credit_now(unconsumed + pending))
        want -= want % cfg.group_size  # whole groups: a short one carries less signal than it costs
        if want < cfg.group_size:
            return
        env = cfg.demand_envs[self._rng.randrange(len(cfg.demand_envs))]
        _, queued = await self.submit(env, cfg.demand_agent, want, source="demand")
        self._demand_credit -= queued

    def _demand_credit_now(self, in_flight: int) -> int:
        """What demand may queue now under ``demand_per_version``: a batch more for each version the demand agent's
        line has moved to, ``demand_lag`` + 1 at most, so that what the trainer learns from is at most that many
        versions old."""
        per, agent = self.config.demand_per_version, self.config.demand_agent
        assert agent is not None
        version = self.policies.version_for(agent)
        now = time.monotonic()
        if version != self._demand_version:
            self._demand_version, self._demand_moved = version, now
            self._demand_credit = min(self._demand_credit + per, (self.config.demand_lag + 1) * per)
        elif in_flight:
            self._demand_moved = now
        elif now - self._demand_moved >= _DEMAND_DRY_S:
            # Nothing on its way to the trainer and no new version for a while: its jobs failed, or it publishes
            # less often than a batch. Never leave it waiting for good.
            self._demand_credit = max(self._demand_credit, per)
        return self._demand_credit

    # -- judged for trainers that sample themselves (the Verify API) -------------------------------

    async def draw_tasks(self, env: str, n: int, difficulty: int = 0) -> list[TaskKey]:
        """``n`` tasks of ``env`` as the bank serves them to runs: its picks (``difficulty`` 0), or fresh tasks at
        ``difficulty``. Each is a draw the bank counts, as a run's would be."""
        async with self._submit_lock:  # the bank hands out fresh seeds: one caller at a time
            return self.bank.fresh(env, n, difficulty) if difficulty else self.bank.sample(env, n, self._rng)

    async def store_judged(self, records: Sequence[Trajectory]) -> None:
        """Completions the farm judged for a caller, stored in one transaction as finished groups, one per task
        (env, seed, difficulty) in the order they first appear (``Store.store_finished``; each record is given its
        id and group): the streams are woken, and the bank reads them as it reads every finished group."""
        by_task: dict[tuple[str, int, int], list[Trajectory]] = {}
        for t in records:
            by_task.setdefault((t.env, t.seed, t.difficulty), []).append(t)
        if not by_task:
            return
        groups = list(by_task.values())
        bodies = await asyncio.to_thread(lambda: [pack_body(t) for g in groups for t in g])  # ms per record
        await self.store.store_finished(groups, bodies, source="verify")
        self.counters["verified"] = self.counters.get("verified", 0) + sum(len(g) for g in groups)
        if self.metrics is not None:
            self.metrics.stored_trajectories(t for g in groups for t in g)
        self.delivery.stored()

    # -- leases (the interface local and remote workers share) ------------------------------------

    async def lease(self, owner: str, n: int, *, endpoint: str | None = None, exclude: Sequence[str] = ()
                    ) -> list[Job]:
        """Up to ``n`` jobs for ``owner``: of ``endpoint``'s agents only, or of none of ``exclude``'s. Requests that
        arrive together are served in one transaction (``GroupLease``), each in its turn."""
        return await self.leases.lease(LeaseAsk(owner, n, endpoint, tuple(exclude)))

    async def _lease_many(self, asks: list[LeaseAsk]) -> list[list[Job]]:
        return await self.store.lease_many(asks, self.config.lease_s, self.policies.version_for)

    def work_queued(self) -> None:
        """Jobs may have become leasable (requeued elsewhere than here): wake parked leases."""
        self._work_queued()

    def _work_queued(self) -> None:
        self._work.set()
        self._work = asyncio.Event()
        for wake in self.on_work:
            wake()

    async def wait_for_work(self, timeout_s: float) -> None:
        """Until jobs may have been queued (or requeued), or ``timeout_s``: an idle node's lease waits here
        rather than asking again and again. A job in its retry backoff wakes them once the backoff has passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._work.wait(), timeout_s)

    async def heartbeat(self, owner: str, job_ids: list[int]) -> int:
        return await self.store.extend(owner, job_ids, self.config.lease_s)

    async def complete(self, owner: str, trajectories: list[Trajectory]) -> list[int]:
        """The coordinator's own worker's results: its verdicts are the farm's own (``verified_by`` local), and
        its rollouts checked each record against its domain as they made it (``run_rollout``)."""
        done = await self.complete_for([(owner, evolve(t, verified_by=VERIFIED_LOCAL))
                                        for t in trajectories])
        return done.reported

    async def complete_for(self, items: list[tuple[str, Trajectory]], *, refuse_mismatch: bool = False
                           ) -> Completion:
        """Store (lease owner, trajectory) pairs: each only while its owner holds the job's lease, under the
        lease's identity (``refuse_mismatch``: a joined node's, and a record that disagrees with it is refused,
        its job requeued; else the farm's own worker's, whose records the store does not check again).
        Reports that arrive together share one transaction (``GroupCommit``); each is told of its own."""
        return await self.commits.submit(items, refuse_mismatch)

    async def _store_completed(self, items: list[tuple[str, Trajectory]], refuse_mismatch: bool) -> Completion:
        return await self.store.complete_leases(items, refuse_mismatch=refuse_mismatch, checked=not refuse_mismatch)

    def _completed(self, items: list[tuple[str, Trajectory]], done: Completion) -> None:
        """After each transaction of completions: counted, and the streams woken once."""
        self.counters["completed"] += len(done.reported)
        if self.metrics is not None:
            kept = set(done.stored)
            self.metrics.stored_trajectories(t for _, t in items if t.id in kept)
        if done.stored:
            self.delivery.stored()
        if done.refused:
            self._work_queued()

    async def fail(self, owner: str, job_id: int, error: str, *, transient: bool = True) -> JobState | None:
        """An infrastructure failure of ``owner``'s job: retried after a backoff while it has attempts
        left and ``transient``; else failed for good (never a score). None: ``owner`` lost the lease."""
        attempts = await self.store.leased_attempts(owner, job_id)
        if attempts is None:
            return None
        final = not transient or attempts >= self.config.max_attempts
        not_before = 0.0 if final else time.time() + self.backoff_s(attempts)
        state = await self.store.fail(owner, job_id, error, final=final, not_before=not_before)
        if state is JobState.FAILED:
            self.counters["failed"] += 1
            why = "for good" if transient else "at once: trying again cannot help"
            log.warning("job %d failed %s: %s", job_id, why, error,
                        extra={"job": job_id, "event": "job_failed", "error": error[:500], "transient": transient})
        elif state is JobState.QUEUED:
            self.counters["retried"] += 1
            # Idle workers sleep until told of work: told again once its backoff has passed.
            asyncio.get_running_loop().call_later(max(0.0, not_before - time.time()), self._work_queued)
        return state

    def backoff_s(self, attempts: int) -> float:
        """How long a job that failed on its ``attempts``-th lease waits before the next: exponential,
        with jitter in its upper half (never less than half the step, so the backoff still grows)."""
        cfg = self.config
        step = min(cfg.retry_backoff_max_s, cfg.retry_backoff_s * 2.0 ** max(0, attempts - 1))
        return step * self._jitter.uniform(0.5, 1.0)

    async def _requeue_expired(self) -> tuple[int, int]:
        """Expired leases back to the queue at once (the lease itself was the wait), or failed for good
        once out of attempts. Returns (requeued, failed)."""
        expired = await self.store.expired_leases()
        if not expired:
            return 0, 0
        requeued, failed = await self.store.requeue_expired(
            {job_id: attempts >= self.config.max_attempts for job_id, attempts in expired.items()})
        if requeued:
            self._work_queued()
        self.counters["requeued"] += requeued
        self.counters["failed"] += failed
        return requeued, failed

    async def release(self, owner: str) -> int:
        released = await self.store.requeue_owner(owner)
        if released:
            self._work_queued()
        return released

    async def recover(self, node: str, owner: str) -> int:
        """``owner`` starts on ``node``: leases that node's earlier incarnation held died with it.

        They go back to the queue now rather than when their leases run out, and the attempt
        counts (a rollout that kills its node must not be retried forever).
        """
        expired = await self.store.expire_leases_of(f"{node}:", keep=owner)
        if expired:
            await self._requeue_expired()
            log.info("%s restarted: %d rollouts it had leased before went back to the queue", node, expired)
        return expired

    async def take_back_undelivered(self, node: str, owner: str, held: Collection[int]) -> int:
        """``owner`` joins again holding ``held``: its other leases were granted in replies that never reached it
        (lost with its connection, or with the coordinator that granted them). They go back to the queue now
        rather than when their leases run out, the attempt not counted: no rollout of them ever ran."""
        taken = await self.store.requeue_unheld(owner, held)
        if taken:
            self._work_queued()
            log.info("node %s joined again: %d rollouts leased to it in replies it never received went back to "
                     "the queue", node, taken, extra={"event": "undelivered_leases", "node": node, "jobs": taken})
        return taken

    async def take_over(self, own_worker: str) -> int:
        """This process serves the farm now, and the one that served before it is gone: it held the database's lock or
        the data directory's, which are this one's now. The leases that one's own worker held died with it and go back
        to the queue now rather than when they run out (the attempt counts, as ``recover``'s do): the worker of a
        coordinator on another host is not found by its host's name. ``own_worker`` (this one's worker's lease owner,
        "" for none) is saved for the next to take over."""
        before = await self.store.get_state(_SERVING_WORKER)
        expired = 0
        if isinstance(before, str) and before and before != own_worker:
            expired = await self.store.expire_leases_of(before, keep="")  # the whole owner: that process's alone
            if expired:
                await self._requeue_expired()
                log.info("took over: %d rollouts the last coordinator's own worker had leased went back to the queue",
                         expired, extra={"event": "took_over", "jobs": expired})
        await self.store.put_state(_SERVING_WORKER, own_worker)
        return expired

    async def expire_node(self, node: str) -> int:
        """Every lease of ``node`` (all its incarnations) back to the queue now: it is lost. Returns how many
        went back (an attempt counts: a rollout that takes its node down must not be retried forever)."""
        if not await self.store.expire_leases_of(f"{node}:", keep=""):
            return 0
        requeued, _failed = await self._requeue_expired()
        return requeued

    # -- policies ---------------------------------------------------------------------------------

    def set_policy_version(self, version: int) -> None:
        if version > self.policy_version:
            self.policy_version = version
            self.bank.set_policy_version(version)
        self._upkeep_now.set()

    # -- upkeep -----------------------------------------------------------------------------------

    async def _maintain(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._upkeep_now.wait(), self.config.maintenance_every_s)
            self._upkeep_now.clear()
            try:
                await self._requeue_expired()
                if await self._observe_finished() and time.monotonic() - self._bank_saved >= _BANK_SAVE_EVERY_S:
                    await self._save_bank()
                await self._top_up_demand()
                await self._refresh_gauges()
            except Exception:  # upkeep must outlive a bad moment; the next round retries
                log.exception("scheduler upkeep failed")

    async def _refresh_gauges(self) -> None:
        """The figures a scrape reads but must not query the store for."""
        m = self.metrics
        if m is None:
            return
        counts = await self.store.open_job_counts()
        for state in (JobState.QUEUED, JobState.LEASED):
            m.queue.labels(state.value).set(counts.get(state.value, 0))
        # A series per consumer streaming now, acked within the last hour, or followed by name: names come
        # from clients, so a series for every name ever acked would grow without bound.
        recent = time.time() - _LAG_SHOWN_S
        m.set_consumer_lag({(c.name, "groups" if c.whole_groups else "trajectories"): c.lag
                            for c in await self.delivery.status()
                            if c.state != "closed" or (c.acked_at or 0) > recent
                            or c.name in self.config.demand_consumers})
        m.policy_version.set(self.policy_version)
        m.streams.set(self.delivery.open_streams())

    async def _observe_finished(self) -> int:
        seen = await self._amend_verdicts()
        while True:
            groups = await self.store.finished_groups(self._bank_cursor, 500, as_of=self._verdict_mark)
            if not groups:
                return seen
            for g in groups:
                self._bank_cursor = g.done_seq
                if g.rewards and g.env in self.bank.envs and self.bank_follows(g.agent):
                    with contextlib.suppress(ValueError):
                        self.bank.observe(TaskKey(g.env, g.seed, g.difficulty),
                                          [min(1.0, max(0.0, r)) for r in g.rewards], g.policy_version)
                    seen += 1

    async def _amend_verdicts(self) -> int:
        """Move the bank's counts for every trajectory it counted whose verdict changed since its mark: a rescore
        that turns a pass into a fail moves it, a withdrawal takes it back (a quarantined verdict says nothing of
        how hard the task is). Groups not observed yet are read later, as of the mark this leaves."""
        amended = 0
        while True:
            changed = await self.store.verdicts.changed(self._verdict_mark, 500)
            if not changed:
                return amended
            counted = [c for c in changed if c.group_done is not None and c.group_done <= self._bank_cursor
                       and c.env in self.bank.envs and self.bank_follows(c.agent)]
            held = await self.store.verdicts.at([c.trajectory_id for c in counted], self._verdict_mark)
            for c in counted:
                was = held.get(c.trajectory_id)
                if was is not None and c.current is not None and self.bank.amend(
                        TaskKey(c.env, c.seed, c.difficulty), self._counts_as(was), self._counts_as(c.current),
                        c.policy_version):
                    amended += 1
            self._verdict_mark = changed[-1].verdict_version

    def _counts_as(self, verdict: Score) -> bool | None:
        """How the bank counts a verdict: a pass, a fail, or (an error, a withdrawn one) neither."""
        if verdict.status != "ok" or WITHDRAWN in verdict.flags:
            return None
        return self.bank.passes(min(1.0, max(0.0, verdict.reward)))

    def bank_follows(self, agent: str) -> bool:
        """Whether ``agent``'s groups teach the task bank pass rates: the agents the config names
        (``bank_agents``), else the demand agent when there is one, else every agent but the controls
        (``reference`` must pass and ``random`` fail: neither says how hard a task is for a policy); never a
        red team's (``redteam:``)."""
        cfg = self.config
        if agent.startswith(RED_TEAM_PREFIX):
            return False  # adversaries, wrong on purpose: they say nothing of how hard a task is
        if cfg.bank_agents:
            return agent in cfg.bank_agents
        if cfg.demand_agent:
            return agent == cfg.demand_agent
        return agent != "reference" and agent.partition(":")[0] != "random"

    async def _save_bank(self) -> None:
        self._bank_saved = time.monotonic()
        await self.store.put_state(_BANK_STATE, {"cursor": self._bank_cursor, "verdicts": self._verdict_mark,
                                                 "bank": self.bank.to_json()})

    async def status(self) -> FarmStatus:
        """``pulse``, the pass rates by environment and level (each read counts what was stored since the last), the
        disk, the newest job failures and the coordinators standing by."""
        return FarmStatus(pulse=await self.pulse(), pass_rates=await self.store.pass_rates(),
                          disk=await self.retention.disk(), recent_failures=await self.store.failures(RECENT_FAILURES),
                          standbys=await self.store.db.standbys(), shared_store=self.store.db.shared)

    async def pulse(self) -> FarmPulse:
        """The farm now, from what is cheap to read: queue, throughput, task bank, consumers, versions."""
        counts = await self.store.job_counts()
        now = time.time()
        return FarmPulse(
            queue=QueueCounts.of(counts), throughput_per_s=await self.store.finished_since(now - 60) / 60.0,
            bank=self.bank.status(), consumers=tuple(await self.delivery.status()),
            streams=self.delivery.open_streams(), policy_version=self.policy_version,
            last_seq=await self.store.last_seq(), counters=dict(self.counters))
