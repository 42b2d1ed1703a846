"""The scheduler: what to run (from the task bank), who runs it (leases), and how much (demand).

Jobs come in groups (n attempts at one task, for group-relative methods). Workers,
local or remote, take leases through the same interface (``lease``, ``heartbeat``,
``complete``, ``fail``, ``release``); a lease that expires goes back to the queue;
an infrastructure failure is retried up to ``max_attempts`` and then recorded as a
failure, apart from every score. Each job carries the policy version current when
it was leased. Finished groups feed the task bank, whose state is saved in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from farmd.metrics import Metrics
from farmd.records import Job, JobState, Trajectory
from farmd.store import Store
from farmd.taskbank import TaskBank, TaskKey

log = logging.getLogger("farmd.scheduler")

_BANK_STATE = "taskbank"


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    lease_s: float = 120.0
    """How long a worker holds a job without a heartbeat before it goes back to the queue."""
    max_attempts: int = 3
    """Leases a job may take (infrastructure failures, expired leases) before it fails for good."""
    maintenance_every_s: float = 1.0
    """How often expired leases are requeued and finished groups fed to the task bank."""
    demand_buffer: int = 256
    """Unconsumed trajectories (stored or in the queue) to keep ahead of the slowest streaming trainer."""
    demand_agent: str | None = None
    """The agent demand-driven rollouts use (the current policy's); None: only explicit requests run."""
    demand_envs: tuple[str, ...] = ()
    group_size: int = 8
    seed: int = 0


@dataclass
class _Streams:
    """Trainers streaming now: consumer name -> how many streams it has open."""

    open: dict[str, int] = field(default_factory=dict)


class Scheduler:
    def __init__(self, store: Store, bank: TaskBank, config: SchedulerConfig | None = None,
                 metrics: Metrics | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.bank = bank
        self.config = config or SchedulerConfig()
        self.policy_version = 0
        self._rng = random.Random(self.config.seed)
        self._bank_cursor = 0
        self._task: asyncio.Task[None] | None = None
        self._streams = _Streams()
        self.stored_generation = 0
        """Counts commits that stored trajectories: a stream notes it before it reads."""
        self._stored = asyncio.Event()
        """Set (and replaced) at each such commit: wakes every stream waiting for more."""
        self._submit_lock = asyncio.Lock()
        self.counters: dict[str, int] = {"completed": 0, "failed": 0, "retried": 0, "requeued": 0, "enqueued": 0}

    @classmethod
    async def open(cls, store: Store, max_difficulty: dict[str, int], config: SchedulerConfig | None = None,
                   metrics: Metrics | None = None) -> Scheduler:
        saved = await store.get_state(_BANK_STATE)
        bank = TaskBank.from_json(saved["bank"], max_difficulty) if saved else TaskBank(max_difficulty)
        scheduler = cls(store, bank, config, metrics)
        scheduler._bank_cursor = int(saved["cursor"]) if saved else 0
        latest = await store.latest_policy()
        scheduler.policy_version = latest.version if latest else 0
        bank.set_policy_version(scheduler.policy_version)
        return scheduler

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._maintain(), name="scheduler-maintenance")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._observe_finished()
        await self._save_bank()

    # -- demand -----------------------------------------------------------------------------------

    async def submit(self, env: str, agent: str, rollouts: int, group_size: int | None = None,
                     source: str = "request") -> tuple[list[int], int]:
        """Queue ``rollouts`` attempts at tasks the bank picks, in groups. Returns (group ids, jobs)."""
        size = max(1, group_size or self.config.group_size)
        groups = max(1, math.ceil(rollouts / size))
        async with self._submit_lock:  # the bank hands out fresh seeds: one caller at a time
            keys = self.bank.sample(env, groups, self._rng)
            while len(keys) < groups:  # a small bank may hand back fewer tasks than asked: reuse them
                keys.append(keys[len(keys) % max(1, len(keys))] if keys else TaskKey(env, 0, self.bank.level(env)))
            sizes = [size] * groups
            sizes[-1] = rollouts - size * (groups - 1) if rollouts >= size else rollouts
            ids = await self.store.enqueue([(k.env, k.seed, k.difficulty, agent, n) for k, n in zip(keys, sizes,
                                                                                                    strict=True)],
                                           source=source)
        self.counters["enqueued"] += sum(sizes)
        return ids, sum(sizes)

    async def _top_up_demand(self) -> None:
        cfg = self.config
        if not cfg.demand_agent or not cfg.demand_envs or not self._streams.open:
            return
        cursors = await self.store.consumers()
        slowest = min((cursors.get(name, 0) for name in self._streams.open), default=0)
        counts = await self.store.open_job_counts()
        pending = counts.get(JobState.QUEUED, 0) + counts.get(JobState.LEASED, 0)
        ahead = await self.store.last_seq() - slowest + pending
        want = cfg.demand_buffer - ahead
        if want < cfg.group_size:
            return
        env = cfg.demand_envs[self._rng.randrange(len(cfg.demand_envs))]
        await self.submit(env, cfg.demand_agent, want, source="demand")

    def stream_opened(self, consumer: str) -> None:
        self._streams.open[consumer] = self._streams.open.get(consumer, 0) + 1

    def stream_closed(self, consumer: str) -> None:
        left = self._streams.open.get(consumer, 1) - 1
        if left > 0:
            self._streams.open[consumer] = left
        else:
            self._streams.open.pop(consumer, None)

    async def wait_for_more(self, seen_generation: int, timeout_s: float) -> None:
        """Return once trajectories were stored after ``stored_generation`` was ``seen_generation``
        (at once if they already were), or after ``timeout_s``. One stream's wait never swallows
        another's wake-up: each commit sets its own event."""
        if self.stored_generation != seen_generation:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stored.wait(), timeout_s)

    # -- leases (the interface local and remote workers share) ------------------------------------

    async def lease(self, owner: str, n: int) -> list[Job]:
        return await self.store.lease(owner, n, self.config.lease_s, self.policy_version)

    async def heartbeat(self, owner: str, job_ids: list[int]) -> int:
        return await self.store.extend(owner, job_ids, self.config.lease_s)

    async def complete(self, owner: str, trajectories: list[Trajectory]) -> list[int]:
        stored = await self.store.complete([(owner, t) for t in trajectories])
        self.counters["completed"] += len(stored)
        if self.metrics is not None:
            self.metrics.stored.inc(len(stored))
        if stored:
            self.stored_generation += 1
            stored_now, self._stored = self._stored, asyncio.Event()
            stored_now.set()
        return stored

    async def fail(self, owner: str, job_id: int, error: str) -> JobState | None:
        state = await self.store.fail(owner, job_id, error, self.config.max_attempts)
        if state is JobState.FAILED:
            self.counters["failed"] += 1
            log.warning("job %d failed for good: %s", job_id, error,
                        extra={"job": job_id, "event": "job_failed", "error": error[:500]})
        elif state is JobState.QUEUED:
            self.counters["retried"] += 1
        return state

    async def release(self, owner: str) -> int:
        return await self.store.requeue_owner(owner)

    async def recover(self, node: str, owner: str) -> int:
        """``owner`` starts on ``node``: leases that node's earlier incarnation held died with it.

        They go back to the queue now rather than when their leases run out, and the attempt
        counts (a rollout that kills its node must not be retried forever).
        """
        expired = await self.store.expire_leases_of(f"{node}:", keep=owner)
        if expired:
            requeued, failed = await self.store.requeue_expired(self.config.max_attempts)
            self.counters["requeued"] += requeued
            self.counters["failed"] += failed
            log.info("%s restarted: %d rollouts it had leased before went back to the queue", node, expired)
        return expired

    # -- policies ---------------------------------------------------------------------------------

    def set_policy_version(self, version: int) -> None:
        if version > self.policy_version:
            self.policy_version = version
            self.bank.set_policy_version(version)

    # -- upkeep -----------------------------------------------------------------------------------

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.config.maintenance_every_s)
            try:
                requeued, failed = await self.store.requeue_expired(self.config.max_attempts)
                self.counters["requeued"] += requeued
                self.counters["failed"] += failed
                if await self._observe_finished():
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
        last = await self.store.last_seq()
        for name, acked in (await self.store.consumers()).items():
            if not name.endswith("#groups"):  # group cursors count groups, not trajectories
                m.consumer_lag.labels(name).set(last - acked)
        m.policy_version.set(self.policy_version)
        m.streams.set(sum(self._streams.open.values()))

    async def _observe_finished(self) -> int:
        seen = 0
        while True:
            groups = await self.store.finished_groups(self._bank_cursor, 500)
            if not groups:
                return seen
            for g in groups:
                self._bank_cursor = g["done_seq"]
                if g["rewards"] and g["env"] in self.bank.envs:
                    with contextlib.suppress(ValueError):
                        self.bank.observe(TaskKey(g["env"], g["seed"], g["difficulty"]),
                                          [min(1.0, max(0.0, r)) for r in g["rewards"]], g["policy_version"])
                    seen += 1

    async def _save_bank(self) -> None:
        await self.store.put_state(_BANK_STATE, {"cursor": self._bank_cursor, "bank": self.bank.to_json()})

    async def status(self) -> dict[str, Any]:
        counts = await self.store.job_counts()
        now = time.time()
        return {
            "queue": {state.value: counts.get(state.value, 0) for state in JobState},
            "throughput_per_s": await self.store.finished_since(now - 60) / 60.0,
            "pass_rates": await self.store.pass_rates(),
            "bank": self.bank.status(),
            "consumers": await self.store.consumers(),
            "streams": dict(self._streams.open),
            "policy_version": self.policy_version,
            "last_seq": await self.store.last_seq(),
            "counters": dict(self.counters),
        }
