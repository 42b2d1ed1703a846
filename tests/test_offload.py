"""The worker process farmd hands work to that would hold its event loop: results and errors come back, a worker
that dies is replaced, and closing it stops it."""

from __future__ import annotations

import os
import signal

import pytest

from farmd.errors import OffloadFailed
from farmd.offload import Offload


def _pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def _fails(message: str) -> None:
    raise ValueError(message)


def _dies() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def test_work_runs_in_another_process_and_its_errors_come_back() -> None:
    offload = Offload()
    try:
        pid, doubled = await offload.run(_pid_and, 21)
        assert doubled == 42 and pid != os.getpid()
        assert (await offload.run(_pid_and, 1))[0] == pid, "one worker, kept between calls"
        with pytest.raises(ValueError, match="not this"):
            await offload.run(_fails, "not this")
    finally:
        offload.close()


async def test_a_worker_that_dies_is_replaced_on_the_next_call() -> None:
    offload = Offload()
    try:
        first, _ = await offload.run(_pid_and, 1)
        with pytest.raises(OffloadFailed, match="died"):
            await offload.run(_dies)
        second, value = await offload.run(_pid_and, 2)
        assert value == 4 and second != first
    finally:
        offload.close()
    offload.close()  # twice: nothing left to stop
