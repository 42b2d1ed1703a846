"""An in-process farm for API tests that start no box: farmd's own ``Daemon`` on port 0, no subprocess.

The server runs in a thread with its own event loop, not in the test's: the API tests call it
through sync grpc channels (as farm_client and trainers do), and a sync call made from the
server's own loop would block that loop and never be answered. A thread keeps every test's
calls and assertions as they are.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farmd.config import Config
from farmd.daemon import Daemon

_START_S = 30.0
_GRACE_S = 1.0


class InProcessFarm:
    """``Daemon(config)`` started and stopped on a loop of its own thread."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.addr = ""
        self.console = ""
        """HOST:PORT of its web console (``http_listen``); empty without one."""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="farmd-in-process")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        daemon = Daemon(self.config)
        try:
            await daemon.start()
            self.addr = f"127.0.0.1:{daemon.port}"
            self.console = daemon.console_address or ""
            self._ready.set()
            await self._stop.wait()
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()  # a failed start must not leave start() waiting
            await daemon.stop(_GRACE_S)

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(_START_S):
            raise AssertionError(f"the in-process farmd did not start within {_START_S} s")
        if self._error is not None:
            self._thread.join()
            raise AssertionError(f"the in-process farmd did not start: {self._error!r}") from self._error
        return self.addr

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(_START_S)
        assert not self._thread.is_alive(), "the in-process farmd did not stop"
        if self._error is not None:
            raise self._error


@pytest.fixture
def farm_in_process(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start farmd in this process with ``workers=0`` (``farm_in_process(token=...)``) and get its
    address. For API tests that run no rollout: no box, no subprocess, no interpreter start-up.
    Every farm started is stopped, and its loop closed, when the test ends."""
    farms: list[InProcessFarm] = []

    def start(token: str | None = None, **config: Any) -> str:
        farm = InProcessFarm(Config(data_dir=tmp_path / f"farm{len(farms)}", listen="127.0.0.1:0",
                                    workers=0, token=token, **config))
        farms.append(farm)
        return farm.start()

    yield start
    for farm in farms:
        farm.stop()


@pytest.fixture
def console_in_process(tmp_path: Path) -> Iterator[Callable[..., InProcessFarm]]:
    """``farm_in_process`` with its web console on a free port (``console_in_process(**config)``): the farm
    started, for its ``addr`` and ``console``."""
    farms: list[InProcessFarm] = []

    def start(**config: Any) -> InProcessFarm:
        farm = InProcessFarm(Config(data_dir=tmp_path / f"console{len(farms)}", listen="127.0.0.1:0", workers=0,
                                    http_listen="127.0.0.1:0", **config))
        farms.append(farm)
        farm.start()
        return farm

    yield start
    for farm in farms:
        farm.stop()
