"""The resident memory of a process while a block runs: what a test of a bound on memory measures."""

from __future__ import annotations

import threading
import time

import psutil

MB = 1 << 20


class PeakRss:
    """The highest resident size of ``pid`` seen while the block runs (sampled every 10 ms)."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.base = self.peak = self.now()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.01)

    def now(self) -> int:
        return int(self._proc.memory_info().rss)

    @property
    def grew_mb(self) -> float:
        return (self.peak - self.base) / MB

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())
