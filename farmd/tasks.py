"""Background tasks farmd's parts keep running on its loop (a sampler, a feed, a sweep)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and return once it has ended, so what it held is let go before the
    caller closes what it used (the store, a stream)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def every(seconds: Callable[[], float], work: Callable[[], Awaitable[object]], log: logging.Logger,
                failed: str, event: str) -> None:
    """Run ``work`` now and then every ``seconds()`` after it ends, until cancelled. A round that fails is logged
    (``failed``, ``event``) and the next one runs: a background task's error never stops the daemon."""
    while True:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(failed, extra={"event": event})
        await asyncio.sleep(seconds())
