"""Completions and leases from every caller at once: group commit.

A fleet's nodes report a few results each, many times a second; stored one report at a time, every report paid a
transaction of its own (its statements, the thread hops to the database's connection, a wake-up of every trainer's
stream), and that, not the records, was most of what a rollout cost the coordinator. Reports that arrive while
one transaction is being written wait, and go together in the next: one transaction, one thread hop to pack their
bodies, one wake-up. A report that arrives when nothing is being written goes at once, so an idle farm waits no
longer than it did.

Each caller is told what came of its own items only, as if it had been stored alone: a batch never holds one job
twice (a second report of a job waits for the next batch, where the first has been stored), never mixes a joined
node's reports (``refuse_mismatch``) with the farm's own worker's, and a batch that fails is tried again one
report at a time, so one caller's bad record fails that caller alone. A caller cancelled while it waits does not
take its items back: they are stored (or not) with the batch, as a report the node sends again would be.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from farmd.records import Job, Trajectory
from farmd.store.jobs import LeaseAsk
from farmd.store.nodes import Completion
from farmd.tasks import cancel_and_wait

log = logging.getLogger("farmd.scheduler")

Items = list[tuple[str, Trajectory]]
"""(lease owner, trajectory) pairs, as ``Store.complete_leases`` takes them."""

MAX_BATCH = 4096
"""Records one transaction stores at most: a transaction holds the writer for as long as it takes."""
LINGER_S = 0.02
"""While reports come faster than transactions are written (the last batch held more than one, and ended just
now), the next batch waits up to this long for more before it is written: what a transaction costs is paid for
more reports. PostgreSQL's ``commit_delay`` is the same idea. A report on a quiet farm, or one worker's alone,
goes at once. On the fleet simulation (100 nodes of 32 slots, 5 s rollouts) it took the coordinator's CPU a
rollout on SQLite from 1.47-1.50 ms to 1.00-1.17 (alternating runs), results 10 ms later at the median; on
PostgreSQL, whose transactions cost the coordinator less, 0.98-1.10 to 0.93-0.97, inside the noise."""
LINGER_SHARE = 0.005
"""And at most this share of a rollout's time (the recent median): a node's next jobs come in the reply to its
results, so its freed slots wait with them; at 5 s a rollout the wait is the whole ``LINGER_S`` (0.4% of a
slot's time), at 200 ms it is 1 ms."""


@dataclass(slots=True)
class _Report:
    items: Items
    ids: frozenset[int]
    refuse_mismatch: bool
    done: asyncio.Future[Completion]


def _share(done: Completion, ids: frozenset[int]) -> Completion:
    """What of ``done`` is ``ids``'."""
    return Completion(stored=[i for i in done.stored if i in ids],
                      refused={i: why for i, why in done.refused.items() if i in ids},
                      canaries={i: t for i, t in done.canaries.items() if i in ids})


def _retrieved(future: asyncio.Future[Any]) -> None:
    # A caller cancelled while it waited never reads its future: its failure is not news.
    if not future.cancelled():
        future.exception()


class GroupCommit:
    """``complete(items, refuse_mismatch)``: the store's completion of a batch. ``committed(items, done)``: runs
    once per stored batch (counters, metrics, one wake-up of the streams)."""

    def __init__(self, complete: Callable[[Items, bool], Awaitable[Completion]],
                 committed: Callable[[Items, Completion], None], *, max_batch: int = MAX_BATCH,
                 linger_s: float = LINGER_S) -> None:
        self._complete = complete
        self._committed = committed
        self._max_batch = max_batch
        self.linger_s = linger_s
        self._rollout_s = 0.0
        """How long rollouts take, lately: a moving median of the batches' own, from each one's start to its result."""
        self._busy_until = 0.0
        """Until when a batch waits ``linger_s`` first: set when a batch of more than one report is written."""
        self._waiting: deque[_Report] = deque()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        """Transactions written (a figure for tests and benchmarks: reports per transaction)."""

    async def submit(self, items: Items, refuse_mismatch: bool) -> Completion:
        """Store ``items`` with whatever else is waiting; what came of them."""
        if not items:
            return Completion()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Completion] = loop.create_future()
        future.add_done_callback(_retrieved)
        self._waiting.append(_Report(items, frozenset(t.id for _, t in items), refuse_mismatch, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="group-commit")
        return await asyncio.shield(future)

    async def stop(self) -> None:
        """Let what is being written finish (its callers are told), then refuse nothing: a later ``submit`` starts
        a writer again. Cancelled only if the stop itself is."""
        await _let_finish(self._task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch: list[_Report] = []
            try:
                wait = min(self.linger_s, LINGER_SHARE * self._rollout_s)
                if wait > 0 and loop.time() < self._busy_until:
                    await asyncio.sleep(wait)
                batch = self._next()
                await self._write(batch)
            except BaseException as exc:  # cancelled (a stopping coordinator): every caller waiting is told so
                for report in (*batch, *self._waiting):
                    if not report.done.done():
                        report.done.set_exception(exc)
                self._waiting.clear()
                raise
            if len(batch) > 1:  # reports are arriving together: the next batch waits for more
                self._busy_until = loop.time() + 5 * self.linger_s

    def _next(self) -> list[_Report]:
        """The oldest waiting report, and every later one that may share its transaction."""
        first = self._waiting.popleft()
        batch, ids, size = [first], set(first.ids), len(first.items)
        kept: deque[_Report] = deque()
        while self._waiting:
            report = self._waiting.popleft()
            if report.refuse_mismatch != first.refuse_mismatch or not ids.isdisjoint(report.ids) \
                    or size + len(report.items) > self._max_batch:
                kept.append(report)
                continue
            batch.append(report)
            ids.update(report.ids)
            size += len(report.items)
        self._waiting = kept
        return batch

    async def _write(self, batch: list[_Report]) -> None:
        items = [item for report in batch for item in report.items]
        try:
            done = await self._complete(items, batch[0].refuse_mismatch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].done.set_exception(exc)
                return
            for report in batch:  # one caller's bad record must not fail the others: each alone
                await self._write([report])
            return
        self.batches += 1
        # A rollout's time, as its result arrives: from when it started (its record says, and a node's word bends this
        # heuristic alone, bounded by LINGER_S) to now. A record that does not say (0) says nothing of it.
        now = time.time()
        ages = sorted(min(max(now - t.started_at, 0.0), 3600.0) for _, t in items
                      if isinstance(t.started_at, float | int) and math.isfinite(t.started_at) and t.started_at > 0)
        if ages:
            median = ages[len(ages) // 2]
            self._rollout_s = median if not self._rollout_s else self._rollout_s + 0.2 * (median - self._rollout_s)
        for report in batch:
            report.done.set_result(_share(done, report.ids))
        try:
            self._committed(items, done)
        except Exception:  # what is stored stays stored: a figure missed is not a failed report
            log.exception("after storing %d results", len(items))


@dataclass(slots=True)
class _Ask:
    ask: LeaseAsk
    done: asyncio.Future[list[Job]]


class GroupLease:
    """Lease requests from every worker at once, in one transaction: asks that arrive while one transaction of
    leases is being written go together in the next, each served in the order it came, as if alone. A batch that
    fails (an ask naming no endpoint) is tried again one ask at a time, so that ask alone fails."""

    def __init__(self, lease: Callable[[list[LeaseAsk]], Awaitable[list[list[Job]]]]) -> None:
        self._lease = lease
        self._waiting: deque[_Ask] = deque()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0

    async def lease(self, ask: LeaseAsk) -> list[Job]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Job]] = loop.create_future()
        future.add_done_callback(_retrieved)
        self._waiting.append(_Ask(ask, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="group-lease")
        # Not shielded: a caller cancelled before its ask is written is left out of it; one cancelled after
        # holds leases it never hears of, which run out (or its node's next heartbeat or release gives back).
        return await future

    async def stop(self) -> None:
        """As ``GroupCommit.stop``: what is being leased finishes, its callers told."""
        await _let_finish(self._task)

    async def _run(self) -> None:
        while self._waiting:
            batch = [a for a in self._waiting if not a.done.done()]  # a caller gone: nothing leased for it
            self._waiting.clear()
            try:
                await self._write(batch)
            except BaseException as exc:
                for asked in (*batch, *self._waiting):
                    if not asked.done.done():
                        asked.done.set_exception(exc)
                self._waiting.clear()
                raise

    async def _write(self, batch: list[_Ask]) -> None:
        if not batch:
            return
        try:
            leased = await self._lease([a.ask for a in batch])
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0].done.done():
                    batch[0].done.set_exception(exc)
                return
            for asked in batch:
                await self._write([asked])
            return
        self.batches += 1
        for asked, jobs in zip(batch, leased, strict=True):
            if not asked.done.done():
                asked.done.set_result(jobs)


async def _let_finish(task: asyncio.Task[None] | None) -> None:
    """Wait for a batch writer's ``task`` to end by itself; cancel it (and wait) only if the waiting is cancelled."""
    if task is not None and not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await cancel_and_wait(task)
            raise
