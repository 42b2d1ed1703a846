"""Watching one program run in a box, host side, and turning what was seen into a result.

Times are ``time.monotonic()`` (the clock a box's programs share), not the loop's
clock, which is millisecond-coarse on uvloop.

Everything here is driven by event-loop callbacks (readers on the output pipes,
the control socket and bwrap's pidfd; a wall-clock timer; a monitor timer), not
tasks: a box's run should cost the host a few hundred microseconds, not the
scheduling of half a dozen coroutines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmd.sandbox import cgroups, scratch
from farmd.sandbox import result as R
from farmd.sandbox.policy import SandboxPolicy
from farmd.sandbox.result import BoxResult
from farmd.sandbox.slots import Slot

_READ_CHUNK = 1 << 16
_MONITOR_FIRST_S = 0.02
_MONITOR_MAX_S = 0.25
_LINGER_S = 0.1


@dataclass(eq=False)
class Box:
    """A launched box: bwrap running as its slot uid, its init waiting for one program."""

    box_id: str
    slot: Slot
    shape: tuple[int, int, int, int]
    scratch: Path
    cgroup: cgroups.BoxCgroup
    proc: subprocess.Popen[bytes]
    pid1: int
    """Host pid of the box's pid 1 when known at launch (the admit path), else -1."""
    pid1_fd: int
    info_fd: int
    """bwrap's info fd, read at teardown to learn pid 1 (-1 once known)."""
    ctrl: socket.socket
    out_fd: int
    err_fd: int
    limits: tuple[int, int, float]
    """The cgroup limits currently written (memory bytes, pids, cpus)."""
    closed: bool = False
    in_fd: int = -1
    """The host's end of the program's stdin (non-blocking), for a box launched with one; else -1."""

    def kill(self) -> None:
        """SIGKILL the box: its pid 1 (the kernel then kills its whole pid namespace), bwrap's
        monitor (whose death kills pid 1 too, by --die-with-parent) and whatever is in its cgroup."""
        if self.pid1_fd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pid1_fd, signal.SIGKILL)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                self.proc.kill()
        with contextlib.suppress(OSError):
            self.cgroup.kill_all()

    def set_limits(self, memory_bytes: int, pids: int, cpus: float) -> None:
        wanted = (memory_bytes, pids, cpus)
        if wanted != self.limits:
            self.cgroup.set_limits(*wanted)
            self.limits = wanted


class Run:
    """One program's run in ``box``: await ``done``, then call ``result``."""

    def __init__(self, box: Box, policy: SandboxPolicy, loop: asyncio.AbstractEventLoop) -> None:
        self.box = box
        self.policy = policy
        self.loop = loop
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.truncated = False
        self.violations: list[str] = []
        self.killed = False
        self.timed_out = False
        self.exit: dict[str, Any] | None = None
        self.released_at = 0.0
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.bwrap_status: int | None = None
        self.cpu_base = 0
        self.cpu_limit_s = policy.cpu_time_s
        """The CPU bound: the policy's, raised by ``allow``."""
        self.on_output: Callable[[], None] | None = None
        """Called after new stdout was read (a session's reader waits on it)."""
        self.done: asyncio.Future[None] = loop.create_future()
        self.started: asyncio.Future[None] = loop.create_future()
        """Set when the init reports the program started."""
        self._open = {box.out_fd, box.err_fd, box.ctrl.fileno()}
        self._pidfd = -1
        self._timers: list[asyncio.TimerHandle] = []
        self._wall: asyncio.TimerHandle | None = None
        self._monitor_delay = _MONITOR_FIRST_S

    # -- wiring -------------------------------------------------------------------------------

    def start(self, request: bytes) -> None:
        """Send the program to the box's init and start watching. Raises OSError if the init is gone."""
        box = self.box
        self.cpu_base = box.cgroup.cpu_ns()
        self._pidfd = os.pidfd_open(box.proc.pid)
        self.released_at = time.monotonic()
        box.ctrl.send(request)
        self.loop.add_reader(box.out_fd, self._on_output, box.out_fd, self.stdout)
        self.loop.add_reader(box.err_fd, self._on_output, box.err_fd, self.stderr)
        self.loop.add_reader(box.ctrl.fileno(), self._on_control)
        self.loop.add_reader(self._pidfd, self._on_bwrap_exit)
        self._wall = self.loop.call_later(self.policy.wall_time_s, self._on_wall_timeout)
        self._timers.append(self._wall)
        self._timers.append(self.loop.call_later(self._monitor_delay, self._on_monitor))

    def allow(self, cpu_s: float, wall_s: float) -> None:
        """More work for a program that takes it while it runs: ``cpu_s`` more CPU seconds, and at least
        ``wall_s`` seconds from now before the wall bound."""
        self.cpu_limit_s += cpu_s
        if self._wall is not None and self.exit is None and not self.killed:
            left = self._wall.when() - self.loop.time()
            if left < wall_s:
                self._wall.cancel()
                self._wall = self.loop.call_later(wall_s, self._on_wall_timeout)
                self._timers.append(self._wall)

    def stop(self) -> None:
        """Detach from the loop (idempotent)."""
        for fd in list(self._open):
            self.loop.remove_reader(fd)
        self._open.clear()
        if self._pidfd >= 0:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def _closed(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        self._open.discard(fd)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if not self._open and self.bwrap_status is not None and not self.done.done():
            self.done.set_result(None)

    # -- events -------------------------------------------------------------------------------

    def flag(self, violation: str) -> None:
        if violation not in self.violations:
            self.violations.append(violation)

    def kill(self, violation: str | None) -> None:
        if violation:
            self.flag(violation)
        if self.killed:
            return
        self.killed = True
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        self.box.kill()

    def _on_output(self, fd: int, buf: bytearray) -> None:
        cap = self.policy.output_bytes
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self._closed(fd)
                return
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]
            if len(chunk) > room:
                self.truncated = True
                self.kill(R.OUTPUT)
            if buf is self.stdout and self.on_output is not None:
                self.on_output()

    def _on_control(self) -> None:
        sock = self.box.ctrl
        while True:
            try:
                message = sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:
                self._closed(sock.fileno())
                return
            try:
                event = json.loads(message)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            kind = event.get("event")
            if kind == "started":
                self.started_at = time.monotonic()
                if not self.started.done():
                    self.started.set_result(None)
                # CPU counts from here: a box launched on demand has just spent ~10 ms starting
                # its init, which a box started ahead of demand spent earlier; neither is the program's.
                with contextlib.suppress(OSError):
                    self.cpu_base = self.box.cgroup.cpu_ns()
            elif kind == "full":
                self.kill(R.TMP if event.get("mount") == "/tmp" else R.SHM)
            elif kind == "exit" and isinstance(event.get("status"), int):
                self.exit = event
                if self.ended_at is None:
                    self.ended_at = time.monotonic()
                # The box is normally gone within a millisecond or two. bwrap's pid 1 is
                # writable by the program (bwrap keeps itself dumpable), so one that lingers
                # may be the program's doing: whatever is left is killed, cgroup and all.
                self._timers.append(self.loop.call_later(_LINGER_S, self.kill, None))

    def _on_bwrap_exit(self) -> None:
        self.loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        self.bwrap_status = self.box.proc.wait()
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        # pid 1 is gone, and with it its pid namespace and every process of the box. (The
        # cgroup is checked once more when it is removed.)
        self._maybe_done()

    def _on_wall_timeout(self) -> None:
        if self.exit is None:
            self.timed_out = True
            self.kill(R.WALL_TIME)

    def _on_monitor(self) -> None:
        """The bounds the kernel does not end a box for by itself: CPU time, processes, scratch space."""
        if self.killed or self.exit is not None:
            return
        cg = self.box.cgroup
        limit_ns = self.cpu_limit_s * 1e9
        try:
            used_ns = cg.cpu_ns() - self.cpu_base
            if used_ns > limit_ns:
                self.kill(R.CPU_TIME)
            elif cg.pids_max_hits() > 0:
                self.kill(R.PIDS)
            elif scratch.is_full(self.box.scratch):
                self.kill(R.DISK)
        except OSError:
            return
        if self.killed:
            return
        # No sooner than the CPU bound could be crossed at full speed would be enough for
        # CPU, but a fork bomb or a full disk should not run long either.
        left_s = (limit_ns - used_ns) / 1e9 / max(self.policy.cpus, 1e-3)
        self._monitor_delay = min(_MONITOR_MAX_S, max(_MONITOR_FIRST_S, left_s), self._monitor_delay * 2)
        self._timers.append(self.loop.call_later(self._monitor_delay, self._on_monitor))

    # -- the result ---------------------------------------------------------------------------

    def result(self, requested_at: float) -> BoxResult:
        """Everything seen, as a BoxResult. Reads the cgroup: call before the box is torn down."""
        box = self.box
        cg = box.cgroup
        exit_code: int | None = None
        sig: int | None = None
        maxrss_mb = 0.0
        if self.exit is not None:
            status = int(self.exit["status"])
            if os.WIFEXITED(status):
                exit_code = os.WEXITSTATUS(status)
            elif os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
            maxrss_mb = float(self.exit.get("maxrss_kb", 0)) / 1024
            for mount in self.exit.get("full", []):
                self.flag(R.TMP if mount == "/tmp" else R.SHM)
        elif self.killed and self.violations:
            sig = signal.SIGKILL
        else:
            # The init ended without reporting: the program killed its supervisor. All that
            # is left is bwrap's status (128+N for a signal), which comes from pid 1, which the
            # program can write: so never an exit code, and the run is flagged.
            self.flag(R.INIT)
            code = self.bwrap_status or 0
            sig = code - 128 if 128 < code < 128 + 65 else signal.SIGKILL
        cpu_s = max(0.0, (cg.cpu_ns() - self.cpu_base) / 1e9)
        peak_mb = cg.memory_peak_bytes() / 2**20
        oom = cg.oom_kills() > 0
        if cg.pids_max_hits() > 0:
            self.flag(R.PIDS)
        if oom:
            self.flag(R.MEMORY)
        if cpu_s > self.cpu_limit_s or sig == signal.SIGXCPU:
            self.flag(R.CPU_TIME)
        if sig == signal.SIGSYS:
            self.flag(R.SYSCALL)
        if sig == signal.SIGXFSZ or scratch.is_full(box.scratch):
            self.flag(R.DISK)
        if self.truncated:
            self.flag(R.OUTPUT)
        ended = self.ended_at or time.monotonic()
        started = self.started_at or ended
        return BoxResult(
            exit_code=exit_code,
            signal=int(sig) if sig is not None else None,
            timed_out=self.timed_out,
            oom=oom,
            output_truncated=self.truncated,
            stdout=bytes(self.stdout),
            stderr=bytes(self.stderr),
            wall_s=max(0.0, ended - self.released_at),
            cpu_s=cpu_s,
            max_rss_mb=maxrss_mb or peak_mb,
            violations=self.violations,
            memory_peak_mb=peak_mb,
            start_latency_s=max(0.0, started - requested_at),
        )
