"""Reaping each box's pid 1.

bwrap's monitor exits as soon as it learns its child's exit status, before that
child (the box's pid 1) is reaped, so every box leaves a zombie pid 1 behind,
reparented to the host's init. A sandbox makes its process a child subreaper so
those zombies come to it instead, and reaps each one by pid when its box is torn
down: nothing of a box outlives its teardown, not even a process-table entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_subreaper = False


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (process-wide, idempotent)."""
    global _subreaper
    if not _subreaper:
        _subreaper = _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def reap(pid: int) -> None:
    """Wait for ``pid`` if it is (or is about to be) our zombie; a no-op otherwise.

    Only called while we are a subreaper: then no one else can reap the pid, so it
    cannot have been reused by the time we wait for it.
    """
    if pid <= 0 or not _subreaper:
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
