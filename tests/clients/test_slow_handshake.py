"""A farmd slow to finish a connection's handshake, as on a loaded host, is still reached on the first call."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

from farm_client import FarmClient

from tests.conftest import RunningFarm

HELD_S = 0.8
"""How long the farm's first bytes (its HTTP/2 SETTINGS) are held back: a few times what a loaded CI was seen to
take, far below grpc's own 20 s for a connection attempt."""


def _pump(src: socket.socket, dst: socket.socket, hold_s: float) -> None:
    with contextlib.suppress(OSError):
        first = True
        while data := src.recv(65536):
            if first and hold_s:
                time.sleep(hold_s)
            first = False
            dst.sendall(data)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _slow_proxy(upstream: str, hold_s: float) -> Iterator[str]:
    """A TCP relay to ``upstream`` that holds back the first bytes ``upstream`` sends on each connection."""
    host, port = upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection((host, int(port)))
            threading.Thread(target=_pump, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=_pump, args=(server, client, hold_s), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        listener.close()
        thread.join(5)


def test_a_farm_whose_handshake_is_slow_answers_the_first_call(
        running_farm: Callable[..., RunningFarm]) -> None:
    farm = running_farm()
    with _slow_proxy(farm.addr, HELD_S) as addr, FarmClient(addr, timeout_s=30) as client:
        began = time.monotonic()
        assert client.status()["node"]
        assert time.monotonic() - began >= HELD_S  # the relay did hold the handshake back
