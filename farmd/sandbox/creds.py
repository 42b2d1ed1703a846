"""Starting a process as a slot uid without forking farmd: per-thread credentials.

Linux credentials belong to each thread; glibc's setuid() makes all threads agree,
the raw syscalls do not. The spawning thread switches its *own* real and effective
ids to the slot's (keeping a saved uid of 0 to come back), vforks and execs bwrap,
and switches back. The child inherits the slot's ids and drops the saved 0 at exec
(a non-setuid exec sets the saved ids to the effective ones), with no capabilities.

This replaces an exec of setpriv per box (about a millisecond of CPU), and keeps
vfork: Python refuses to vfork when it must change ids itself, and a fork of a
large farmd costs milliseconds of page-table copying. Every spawned process is
checked from /proc afterwards: if its ids are not the slot's, it is killed and the
launch fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import time
from collections.abc import Iterator

from farmd.errors import SandboxError

# (setgroups, setresuid, setresgid) per architecture.
_SYSCALLS = {"x86_64": (116, 117, 119), "aarch64": (159, 147, 149)}
_KEEP = -1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def supported() -> bool:
    """True where farm knows the syscall numbers and runs as root."""
    return platform.machine() in _SYSCALLS and os.geteuid() == 0


def _call(number: int, *args: int) -> None:
    if _libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args]) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"switching the spawning thread's ids failed: {os.strerror(err)}")


@contextlib.contextmanager
def this_thread_as(uid: int, gid: int) -> Iterator[None]:
    """Run the block with this thread's real and effective ids set to ``uid``/``gid``, no groups."""
    setgroups, setresuid, setresgid = _SYSCALLS[platform.machine()]
    groups = os.getgroups()
    _call(setgroups, 0, 0)
    _call(setresgid, gid, gid, _KEEP)
    _call(setresuid, uid, uid, _KEEP)  # the saved uid stays 0: the way back
    try:
        yield
    finally:
        # Effective 0 first (allowed by the saved uid, and it restores the capabilities),
        # then everything else. A thread that cannot get back is not left running.
        try:
            _call(setresuid, _KEEP, 0, _KEEP)
            _call(setresuid, 0, 0, 0)
            _call(setresgid, 0, 0, 0)
            arr = (ctypes.c_uint * max(1, len(groups)))(*groups)
            if _libc.syscall(ctypes.c_long(setgroups), ctypes.c_long(len(groups)), arr) != 0:
                raise SandboxError("restoring the spawning thread's groups failed")
        except SandboxError:
            os.abort()  # a farmd thread stuck with a slot's ids must not carry on


def verify(pid: int, uid: int, gid: int, timeout_s: float = 0.5) -> None:
    """Raise SandboxError unless every id of ``pid`` is the slot's and it has no groups or capabilities.

    A vfork parent resumes when the child's exec replaces its memory, a moment before
    the exec commits the new credentials (which is when the saved ids drop to the
    slot's): so the check waits, briefly, for the final state.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError as exc:
            raise SandboxError(f"cannot check the ids of the box's process {pid}: {exc}") from exc
        uids = fields.get("Uid", "").split()
        gids = fields.get("Gid", "").split()
        groups = fields.get("Groups", "").split()
        caps = [int(fields.get(k, "0").strip(), 16) for k in ("CapEff", "CapPrm")]
        if uids == [str(uid)] * 4 and gids == [str(gid)] * 4 and not groups and not any(caps):
            return
        if time.monotonic() > deadline:
            raise SandboxError(
                f"the box's process {pid} does not run as slot uid {uid}: Uid {uids} Gid {gids} "
                f"Groups {groups} caps {caps}"
            )
        time.sleep(0.0002)
