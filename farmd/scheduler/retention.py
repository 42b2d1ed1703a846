"""Disk that does not grow without bound: unused policy content removed in the background, and the disk the
store and the policies take, with how fast it grows.

Every ``policy_sweep_s`` the sweep removes what no one can use any more (``Policies.remove_unused``: the store's
transactions and file deletions, each awaited off the event loop) and samples the disk. ``farmctl status`` and the
console read ``disk``: the sizes now, and bytes per hour over the last ``window_s`` (or since farmd started, when
that is shorter), from the samples kept in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

from farmd.scheduler.policies import Policies
from farmd.store import Store
from farmd.store.retention import DiskUsage, Removed
from farmd.tasks import cancel_and_wait, every

log = logging.getLogger("farmd.scheduler.retention")

WINDOW_S = 600.0
"""Growth is measured over the last ten minutes: long enough to see past one checkpoint of the database's log,
short enough to say how it grows now rather than since the start."""
_MIN_SPAN_S = 1.0
"""Two samples closer than this say nothing of a rate."""
_MIN_SAMPLE_GAP_S = 1.0
"""Status asked many times a second adds a sample at most this often (the window holds a bounded number)."""


@dataclass(frozen=True, slots=True)
class Disk:
    """The disk the farm's data takes now and how fast it grows (None: not measured over long enough yet)."""

    usage: DiskUsage
    store_growth_per_h: float | None
    policy_growth_per_h: float | None
    window_s: float
    """The span the growth was measured over: up to ``WINDOW_S``."""
    keep_newest: int


class Retention:
    def __init__(self, store: Store, policies: Policies, *, keep_newest: int, every_s: float,
                 window_s: float = WINDOW_S) -> None:
        self._store = store
        self._policies = policies
        self.keep_newest = keep_newest
        self.every_s = every_s
        self.window_s = window_s
        self._samples: deque[DiskUsage] = deque()
        self._task: asyncio.Task[None] | None = None
        self.removed = 0
        """Versions whose content this farmd removed since it started."""

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="farmd-policy-retention")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        # A sweep that fails keeps what it would have removed until the next one.
        await every(lambda: self.every_s, self._round, log, "removing unused policy content failed",
                    "policy_sweep_failed")

    async def _round(self) -> None:
        await self.sweep()
        await self.disk()

    async def sweep(self) -> list[Removed]:
        removed = await self._policies.remove_unused(self.keep_newest)
        self.removed += len(removed)
        return removed

    async def disk(self) -> Disk:
        """The disk now (measured now, off the event loop), and its growth over the window."""
        usage = await self._store.retention.usage()
        if not self._samples or usage.at - self._samples[-1].at >= _MIN_SAMPLE_GAP_S:
            self._samples.append(usage)
        while len(self._samples) > 1 and usage.at - self._samples[0].at > self.window_s:
            self._samples.popleft()
        first = self._samples[0]
        span = usage.at - first.at
        if span < _MIN_SPAN_S:
            return Disk(usage, None, None, span, self.keep_newest)
        per_h = 3600.0 / span
        return Disk(usage, (usage.store_bytes - first.store_bytes) * per_h,
                    (usage.policy_bytes - first.policy_bytes) * per_h, span, self.keep_newest)
