"""CPU work whose size someone outside farmd decides, done in a worker process, where it cannot hold the loop.

A thread is no help with a C parser: ``json.loads`` of a 30 MB reply holds the interpreter for the whole
call, and every box's timer and every API call on farmd's event loop waits that long. Pure-Python work in
a thread gives the interpreter up every few milliseconds; a single long C call does not. So what parses a
large body in one call goes to ``OFFLOAD``: one worker process (started on first use, from a clean
interpreter, never forked from farmd's threads), its result sent back whole. The daemon owns it: it is
closed when farmd stops, and a worker that dies (out of memory, killed) is replaced on the next call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from farmd.errors import OffloadFailed

log = logging.getLogger("farmd.offload")

T = TypeVar("T")


class Offload:
    """A pool of ``workers`` processes, started on first use."""

    def __init__(self, workers: int = 1) -> None:
        self._workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # forkserver: workers come from a clean process, not forked from farmd's threads (grpc, sqlite).
                # No cycle collection there: a parse makes millions of containers and no cycles, and the collector,
                # run for each few hundred of them, tripled the time 30 MB of nested lists took to parse.
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self._workers, mp_context=multiprocessing.get_context("forkserver"),
                    initializer=gc.disable)
            return self._pool

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker process (``fn`` a module-level function, its arguments and result
        picklable); its exceptions are raised here. ``OffloadFailed`` if the worker died doing it."""
        pool = self._executor()
        try:
            # Submitting starts the worker the first time (a process, and its handshake): in a thread too.
            return await asyncio.wrap_future(await asyncio.to_thread(pool.submit, fn, *args))
        except BrokenProcessPool as exc:
            log.warning("the offload worker died (%s); a new one starts on the next call", exc,
                        extra={"event": "offload_broken"})
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise OffloadFailed(f"the worker process died: {exc}") from None

    def close(self) -> None:
        """Stop the workers (work in flight is cancelled; its callers get ``OffloadFailed`` or CancelledError).
        A later ``run`` starts new ones: farmd's parts share this, and only the daemon's stop closes it."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


OFFLOAD = Offload()
"""The process's: what farmd's parts hand work to. ``Daemon.stop`` closes it."""
