"""Sandbox.session: a program in a box of its own that takes input while it runs, under bounds raised per piece
of work, torn down whatever ends it."""

from __future__ import annotations

import asyncio
import time

import pytest

from farmd.sandbox import Sandbox, SandboxPolicy
from tests.sandbox.test_runner import _leftovers

pytestmark = pytest.mark.sandbox

SMALL = SandboxPolicy(wall_time_s=5, cpu_time_s=2, memory_mb=128, pids=16, disk_mb=8, tmp_mb=8, shm_mb=4,
                      output_kb=4)

# Answers each line with its length; a line "spin N" first has a child spin for N CPU seconds (each process of a
# session has the policy's CPU time as its own backstop, RLIMIT_CPU: the session's allowance is the box's).
ECHO = """
import os, sys, time
for line in sys.stdin:
    if line.startswith("spin"):
        if os.fork() == 0:
            end = time.process_time() + float(line.split()[1])
            while time.process_time() < end:
                pass
            os._exit(0)
        os.wait()
    if line.startswith("shout"):
        sys.stdout.write("x" * int(line.split()[1]) + "\\n")
    sys.stdout.write(f"{len(line)}\\n")
    sys.stdout.flush()
print("bye")
"""


async def _line(session, timeout_s: float = 5.0, end: bytes = b"\n") -> bytes:  # type: ignore[no-untyped-def]
    """What it writes until a line ends with ``end``, it ends, or ``timeout_s`` passes."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while not got.endswith(end) and time.monotonic() < deadline and not session.ended:
        await session.output(deadline - time.monotonic())
        got += session.take()
    return got


async def test_a_session_answers_each_line_as_it_comes_and_ends_with_its_stdin() -> None:
    async with Sandbox() as sandbox:
        session = await sandbox.session(["python3", "-c", ECHO], SMALL)
        for text in (b"a\n", b"hello\n", b"x" * 10_000 + b"\n"):  # past a pipe's atomic write, within its buffer
            assert await session.send(text)
            assert await _line(session) == f"{len(text)}\n".encode()
        result = await session.close()
        assert not await session.send(b"more\n"), "nothing is taken after its stdin is closed"
    assert (result.exit_code, result.violations, result.stdout) == (0, [], b"bye\n")
    assert _leftovers() == []


async def test_each_piece_of_work_gets_its_own_allowance() -> None:
    policy = SandboxPolicy(wall_time_s=1, cpu_time_s=0.5, memory_mb=128, pids=16, disk_mb=8, tmp_mb=8, shm_mb=4)
    async with Sandbox() as sandbox:
        session = await sandbox.session(["python3", "-c", ECHO], policy)
        started = time.monotonic()
        for _ in range(3):  # 1.5 CPU seconds on at most one core, past the policy's 0.5 s of CPU and 1 s of wall
            session.allow(0.5, 60)  # wall time to spare on a loaded machine: the CPU bound is the one tried
            before = session.cpu_s()
            assert await session.send(b"spin 0.5\n")
            assert await _line(session, 60) == b"9\n"
            assert session.cpu_s() - before >= 0.45
        assert time.monotonic() - started > 1.5
        session.allow(0, 60)
        assert await session.send(b"spin 3\n"), "more CPU than it was allowed"
        assert await _line(session, 60) == b""
        result = await session.close()
    assert result.violations == ["cpu_time"], result
    assert _leftovers() == []


async def test_output_is_bounded_by_what_is_held_untaken() -> None:
    async with Sandbox() as sandbox:
        session = await sandbox.session(["python3", "-c", ECHO], SMALL)
        for _ in range(4):  # 12 KB in all, through a 4 KB bound, each taken as it comes
            assert await session.send(b"shout 3000\n")
            assert await _line(session, end=b"\n11\n") == b"x" * 3000 + b"\n11\n"
        assert await session.send(b"shout 5000\n")
        await _line(session)
        result = await session.close()
    assert result.violations == ["output"], result


async def test_a_session_nobody_closes_is_torn_down_when_it_ends_or_the_sandbox_closes() -> None:
    async with Sandbox() as sandbox:
        ended = await sandbox.session(["python3", "-c", "print('done')"], SMALL)
        forgotten = await sandbox.session(["python3", "-c", ECHO], SMALL)
        killed = await sandbox.session(["python3", "-c", ECHO], SMALL)
        killed.kill()
        assert (await killed.close()).signal == 9
        for _ in range(50):
            if ended.ended:
                break
            await asyncio.sleep(0.1)
        assert not await ended.send(b"x\n")
        assert (await ended.close()).stdout == b"done\n"
        assert not forgotten.ended
    assert forgotten.ended
    assert _leftovers() == []
