"""Starting one box (blocking; runs on the sandbox's spawner threads).

bwrap is started as the box's slot uid, with an empty environment and exactly
the descriptors it needs, and nothing the box runs is ever outside its cgroup:

- on cgroup v1 the spawning thread joins the box's cgroups (writing "0" to
  their ``tasks`` files moves only the calling thread, which the kernel does
  without the global threadgroup lock), forks, and leaves again: the box is born
  inside;
- elsewhere bwrap reports the host pid of its pid 1 on the info fd and waits on
  the block fd; farm moves pid 1 into the cgroup (``cgroup.procs``, which can
  wait for an RCU grace period) and only then lets it go on.

pid 1 starts the box's init, which waits for a program.

bwrap is vfork'd by a thread that has switched its own ids to the slot's
(``creds.py``), or, where that is not supported, exec'd through setpriv: never
by a fork that switches uid, since Python can only vfork when it does not change
credentials itself, and a plain fork of a large farmd costs milliseconds of
page-table copying and copy-on-write faults per box.

"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from farmd.errors import SandboxError
from farmd.sandbox import command, creds, reaper, scratch, seccomp
from farmd.sandbox.cgroups import BoxCgroup, CgroupDriver
from farmd.sandbox.policy import SandboxPolicy
from farmd.sandbox.slots import Slot
from farmd.sandbox.watch import Box

INFRA_PIDS = 2
"""bwrap's monitor and the box's init (its pid 1): processes that must not eat the program's allowance."""


@dataclass(frozen=True, slots=True)
class Launcher:
    """Everything needed to start boxes, prepared once."""

    layout: command.HostLayout
    init_code: bytes
    cgroups: CgroupDriver
    boxes_dir: Path
    timeout_s: float

    def launch(self, box_id: str, slot: Slot, policy: SandboxPolicy, stdin: bool = False) -> Box:
        """``stdin``: the program's stdin is a pipe the host writes (``Box.in_fd``), not /dev/null."""
        undo: list[Callable[[], object]] = []
        fds: list[int] = []
        try:
            return self._launch(box_id, slot, policy, stdin, undo, fds)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            for step in reversed(undo):
                with contextlib.suppress(Exception):
                    step()
            raise

    def _launch(
        self, box_id: str, slot: Slot, policy: SandboxPolicy, stdin: bool, undo: list[Callable[[], object]],
        fds: list[int],
    ) -> Box:
        scratch_dir = self.boxes_dir / box_id
        scratch_dir.mkdir(mode=0o711)
        undo.append(lambda: scratch.remove_dir(scratch_dir))
        scratch.mount_tmpfs(scratch_dir, policy.disk_bytes, policy.disk_inodes, slot.uid, slot.gid)
        cg = self.cgroups.create(f"box-{box_id}")
        undo.append(cg.remove)
        limits = (policy.memory_bytes, policy.pids + INFRA_PIDS, policy.cpus)
        cg.set_limits(*limits)

        def pipe() -> tuple[int, int]:
            r, w = os.pipe()
            fds.extend((r, w))
            return r, w

        # On cgroup v1 the box is born in its cgroup (this thread joins it around the fork).
        # Elsewhere bwrap reports pid 1 and waits while farm moves it in (the slow path).
        admit = not self.cgroups.thread_join
        # bwrap reports pid 1's host pid on the info fd. The admit path needs it now; the
        # teardown needs it later, to reap pid 1 (see reaper.py).
        info_r, info_w = pipe()
        block_r, block_w = pipe() if admit else (-1, -1)
        out_r, out_w = pipe()
        err_r, err_w = pipe()
        in_r, in_w = pipe() if stdin else (-1, -1)
        host_ctrl, box_ctrl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        undo += [host_ctrl.close, box_ctrl.close]
        seccomp_fd = seccomp.bpf_fd()
        fds.append(seccomp_fd)
        channels = command.BoxFds(info=info_w, block=block_r, seccomp=seccomp_fd, control=box_ctrl.fileno())
        args_fd = _memfd("farm-bwrap-args", command.args_payload(
            command.bwrap_args(policy, self.layout, str(scratch_dir), channels)))
        fds.append(args_fd)
        code_fd = _memfd("farm-box-init", self.init_code)
        fds.append(code_fd)
        passed = [fd for fd in (args_fd, seccomp_fd, info_w, block_r, box_ctrl.fileno(), code_fd) if fd >= 0]
        argv = command.launch_argv(self.layout, slot.uid, slot.gid, args_fd, code_fd, box_ctrl.fileno())

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                argv,
                pass_fds=passed,
                env={},
                cwd="/",
                stdin=in_r if stdin else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                close_fds=True,
                start_new_session=True,
            )

        with contextlib.ExitStack() as stack:
            if not admit:
                stack.enter_context(cg.joined_by_this_thread())
            if self.layout.setpriv is None and os.geteuid() == 0:
                stack.enter_context(creds.this_thread_as(slot.uid, slot.gid))
            proc = spawn()
        undo.append(functools.partial(_reap, proc))
        if os.geteuid() == 0:
            creds.verify(proc.pid, slot.uid, slot.gid)
        for fd in [*passed, out_w, err_w, *([in_r] if stdin else [])]:
            if fd != box_ctrl.fileno():
                fds.remove(fd)
                os.close(fd)
        box_ctrl.close()
        pid1, pid1_fd = self._admit(proc, cg, info_r, block_w, err_r, fds) if admit else (-1, -1)
        host_ctrl.setblocking(False)
        for fd in (out_r, err_r, *([in_w] if stdin else [])):
            os.set_blocking(fd, False)
        if not admit:
            fds.remove(info_r)
        return Box(
            box_id=box_id, slot=slot, shape=policy.mount_shape(), scratch=scratch_dir, cgroup=cg,
            proc=proc, pid1=pid1, pid1_fd=pid1_fd, info_fd=-1 if admit else info_r, ctrl=host_ctrl,
            out_fd=out_r, err_fd=err_r, limits=limits, in_fd=in_w,
        )


    def _admit(self, proc: subprocess.Popen[bytes], cg: BoxCgroup, info_r: int, block_w: int,
               err_r: int, fds: list[int]) -> tuple[int, int]:
        """Read pid 1 from bwrap, move it into the cgroup, then let the box go on. Returns pid 1 and a pidfd."""
        info = _read_until_eof(info_r, self.timeout_s)
        if not info:
            proc.wait(self.timeout_s)
            err = _read_until_eof(err_r, 0.5).decode(errors="replace").strip()
            raise SandboxError(f"bwrap could not build the box (exit {proc.returncode}): {err}")
        try:
            pid1 = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SandboxError(f"bwrap reported no pid 1: {info[:200]!r}") from exc
        pid1_fd = os.pidfd_open(pid1)
        fds.append(pid1_fd)
        try:
            cg.add(pid1)
        except OSError as exc:
            raise SandboxError(f"could not move the box into its cgroup: {exc}") from exc
        os.write(block_w, b"x")
        for fd in (info_r, block_w):
            fds.remove(fd)
            os.close(fd)
        return pid1, pid1_fd


def teardown(box: Box) -> None:
    """Kill whatever is left of a box and remove every trace of it from the host (blocking)."""
    if box.proc.poll() is None:
        box.kill()
    box.proc.wait()
    box.ctrl.close()
    pid1 = box.pid1 if box.pid1 > 0 else _pid1_from_info(box.info_fd)
    for fd in (box.pid1_fd, box.out_fd, box.err_fd, box.info_fd, box.in_fd):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    box.cgroup.remove()  # kills anything still in it, pid 1 included
    reaper.reap(pid1)
    scratch.remove_dir(box.scratch)


def _pid1_from_info(info_fd: int) -> int:
    """pid 1's host pid from bwrap's info fd (bwrap has exited: the read does not block)."""
    if info_fd < 0:
        return -1
    try:
        os.set_blocking(info_fd, False)
        return int(json.loads(os.read(info_fd, 1 << 16))["child-pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def _reap(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_until_eof(fd: int, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    data = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxError(f"bwrap did not report within {timeout_s}s")
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return bytes(data)
        data += chunk
