"""The farm's pulse over time: samples of a real scheduler on a real store, taken on a clock and kept bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from farmd.scheduler import Scheduler, SchedulerConfig
from farmd.scheduler.history import History
from farmd.store import Store
from tests.scheduler.test_scheduler import LEVELS, scored


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[Scheduler]:
    store = await Store.open(tmp_path / "farm.db")
    made = await Scheduler.open(store, LEVELS, SchedulerConfig(group_size=2))
    yield made
    await made.stop()
    await store.close()


async def test_samples_follow_the_queue_and_keep_only_the_newest(scheduler: Scheduler) -> None:
    store = scheduler.store
    history = History(scheduler, every_s=0.05, keep=3)
    first = await history.sample()
    assert first.queue.queued == 0 and first.last_seq == 0
    assert [b.env for b in first.bank] == ["rg:chain_sum", "py-func", ""], "each environment, then the totals"

    await scheduler.submit("rg:chain_sum", "reference", 4)
    queued = await history.sample()
    assert queued.queue.queued == 4
    leased = await scheduler.lease("w", 2)
    await store.complete([("w", scored(job)) for job in leased])
    done = await history.sample()
    assert (done.queue.queued, done.queue.done, done.last_seq) == (2, 2, 2)
    assert done.throughput_per_s > 0

    await history.sample()
    assert len(history.since(0)) == 3, "the oldest sample made room"
    assert history.since(time.time() + 1) == []

    started = time.time()
    await history.start()  # on its own clock from here
    deadline = time.monotonic() + 5
    while len(history.since(started)) < 2:
        assert time.monotonic() < deadline, "no samples on the clock"
        await asyncio.sleep(0.02)
    await history.stop()
