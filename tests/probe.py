"""How long farmd's event loop is held while a block runs: what a test of "nothing stalls the daemon" measures.

A thread asks farmd's gRPC health check every 10 ms (the health servicer answers on the same event loop as
every other call) and keeps the longest answer: a loop held for a second makes some answer wait that second.
An answer takes about a millisecond when nothing holds the loop.
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class LoopProbe:
    """The longest health check answer (``worst_s``) seen while the block runs, asked every ``every_s``."""

    def __init__(self, addr: str, every_s: float = 0.01) -> None:
        self._channel = grpc.insecure_channel(addr)
        self._stub = health_pb2_grpc.HealthStub(self._channel)
        self._every_s = every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True, name="loop-probe")
        self.worst_s = 0.0
        self.asked = 0
        self._stub.Check(health_pb2.HealthCheckRequest(), timeout=30)  # connected before the block starts

    def _ask(self) -> None:
        while not self._done.is_set():
            started = time.monotonic()
            with contextlib.suppress(grpc.RpcError):  # a check that timed out counts by the time it waited
                self._stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
            self.worst_s = max(self.worst_s, time.monotonic() - started)
            self.asked += 1
            self._done.wait(self._every_s)

    def __enter__(self) -> LoopProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._channel.close()
