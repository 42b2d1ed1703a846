"""Coalescing a group's identical first requests into one request for ``n`` choices.

The attempts of one group start from the same task, so their first requests are the
same messages with the same sampling parameters. Asked as one request with ``n = k``
the server encodes the prompt once and samples ``k`` continuations; each attempt takes
its own choice (``index``). ``Coalescer.join`` holds the first caller of a key for a
short window (or until ``max_n`` callers have joined), sends once, and hands every
caller the shared result and its position in it.

Only the request is shared: a caller that is cancelled leaves the others waiting (the
request is cancelled only when nobody waits for it any more), and a failure reaches
every caller, each of which fails its own attempt as it would alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclass(eq=False)
class _Batch(Generic[R]):
    size: int = 0
    """Callers that joined; the request asks for this many choices."""
    waiting: int = 0
    """Callers still waiting for the result."""
    full: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[R] | None = None


class Coalescer(Generic[R]):
    """Joins concurrent callers of one key into one ``send(n)``; safe to share between tasks."""

    def __init__(self, *, window_s: float, max_n: int) -> None:
        if window_s < 0 or max_n < 1:
            raise ValueError(f"a coalescing window of {window_s}s for at most {max_n} choices")
        self.window_s = window_s
        self.max_n = max_n
        self._open: dict[Hashable, _Batch[R]] = {}
        """Batches still taking callers."""
        self._tasks: set[asyncio.Task[R]] = set()

    async def join(self, key: Hashable, send: Callable[[int], Awaitable[R]]) -> tuple[R, int]:
        """``send(n)``'s result, shared with every caller that joined the same key, and this caller's
        position among them (0 .. n-1). ``send`` is the first caller's; later callers' are not called."""
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch()
            batch.task = asyncio.get_running_loop().create_task(self._run(key, batch, send))
            self._tasks.add(batch.task)
            batch.task.add_done_callback(self._done)
        assert batch.task is not None
        index = batch.size
        batch.size += 1
        batch.waiting += 1
        if batch.size >= self.max_n:
            self._seal(key, batch)
        try:
            # Shielded: one caller's cancellation must not cancel the request the others wait for.
            result = await asyncio.shield(batch.task)
        except asyncio.CancelledError:
            batch.waiting -= 1
            if batch.waiting == 0 and not batch.task.done():
                self._forget(key, batch)
                batch.task.cancel()
            raise
        return result, index

    async def aclose(self) -> None:
        """Cancel every request in flight (their callers see CancelledError)."""
        self._open.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _forget(self, key: Hashable, batch: _Batch[R]) -> None:
        """No caller joins ``batch`` any more."""
        if self._open.get(key) is batch:
            del self._open[key]

    def _seal(self, key: Hashable, batch: _Batch[R]) -> None:
        self._forget(key, batch)
        batch.full.set()

    async def _run(self, key: Hashable, batch: _Batch[R], send: Callable[[int], Awaitable[R]]) -> R:
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that meets the event.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.window_s):
                await batch.full.wait()
        self._forget(key, batch)
        return await send(batch.size)

    def _done(self, task: asyncio.Task[R]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # every caller may have gone: the failure was still seen, not "never retrieved"
