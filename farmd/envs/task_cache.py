"""Tasks a node made recently, shared by the rollouts that ask for them.

A group's rollouts are one task attempted several times, leased together and started at once: each used
to make the task again (a reasoning-gym puzzle takes up to a second; even a one-line sum paid a thread
hop). Tasks are deterministic in ``(seed, difficulty)`` and frozen, so one made task serves them all: the
first asker makes it, the others await the same making, and it is kept for the next group of the same
task. A failure is never kept: the next asker tries again. An environment whose making takes microseconds
(``Environment.generates_inline``) makes it on the asker's own thread (``made``): nothing to share but the result.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

KEPT = 1024
"""Made tasks kept per environment (a task is a prompt and a few examples: kilobytes)."""


class TaskCache(Generic[T]):
    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._made: OrderedDict[Hashable, T] = OrderedDict()
        self._making: dict[Hashable, asyncio.Task[T]] = {}
        """In flight, on the loop that started each (a test's loop may be gone when the next asks)."""

    async def get(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        if key in self._made:
            self._made.move_to_end(key)
            return self._made[key]
        loop = asyncio.get_running_loop()
        making = self._making.get(key)
        if making is None or making.get_loop() is not loop:
            making = loop.create_task(self._make(key, make))
            self._making[key] = making
        # Shielded: one asker cancelled (its rollout stopped) does not stop the making the others await.
        return await asyncio.shield(making)

    def made(self, key: Hashable, make: Callable[[], T]) -> T:
        """``get`` for a making that takes microseconds: done here, on the caller's thread, with nothing to await."""
        if key in self._made:
            self._made.move_to_end(key)
            return self._made[key]
        return self._keep(key, make())

    async def _make(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        try:
            made = await make()
        finally:
            if self._making.get(key) is asyncio.current_task():
                del self._making[key]
        return self._keep(key, made)

    def _keep(self, key: Hashable, made: T) -> T:
        self._made[key] = made
        while len(self._made) > self._kept:
            self._made.popitem(last=False)
        return made
