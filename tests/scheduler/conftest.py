"""Every test here runs against SQLite and against a real PostgreSQL server (``store_backend``); a scheduler over
a real store for them (``farm``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from farmd.scheduler import Scheduler, SchedulerConfig
from farmd.store import Store


@pytest.fixture(autouse=True)
def _both_backends(store_backend: str) -> str:
    return store_backend


@pytest.fixture
async def farm(tmp_path: Path, request: pytest.FixtureRequest, store_backend: str):  # type: ignore[no-untyped-def]
    """``(store, open_)``: ``open_(**config)`` opens a scheduler on the store over the test module's ``LEVELS``
    (environment -> levels); every one opened is stopped, and the store closed, afterwards."""
    store = await Store.open(tmp_path / "farm.db")
    made: list[Scheduler] = []

    async def open_(**config: object) -> Scheduler:
        scheduler = await Scheduler.open(store, request.module.LEVELS, SchedulerConfig(**config))  # type: ignore[arg-type]
        made.append(scheduler)
        return scheduler

    yield store, open_
    for s in made:
        await s.stop()
    await store.close()
