"""Background tasks farmd's parts keep running on its loop (a sampler, a feed, a sweep)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and return once it has ended, so what it held is let go before the
    caller closes what it used (the store, a stream)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
