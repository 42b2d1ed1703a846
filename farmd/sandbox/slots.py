"""Slot uids: every box runs as an unprivileged host uid of its own.

When farmd is root, a box started by root is host uid 0 inside, whatever uid the
user namespace shows; starting bwrap as a dedicated uid is what makes the box
nobody in particular. Each uid is held by one box at a time, across every farmd
process on the host: a process reserves a uid with an flock on a file in the run
directory, which the kernel releases if the process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from farmd.errors import SandboxError


@dataclass(frozen=True, slots=True)
class Slot:
    uid: int
    gid: int


class SlotPool:
    """At most ``capacity`` slots in use at once in this process, each a uid no other box holds."""

    def __init__(self, run_dir: Path, uid_base: int, uid_count: int, capacity: int) -> None:
        if os.geteuid() != 0:
            # Without root there is no uid to switch to: every box runs as our own
            # (unprivileged) uid, which is already not root.
            uid_count = 1
        self._dir = run_dir / "slots"
        self._base = uid_base
        self._count = uid_count
        self._capacity = capacity
        self._held: dict[int, int] = {}  # uid -> lock fd
        self._free: list[int] = []
        self._in_use = 0
        self._cond = asyncio.Condition()
        self._next_probe = 0
        self._stopped = False

    @property
    def capacity(self) -> int:
        return self._capacity

    def _reserve_uid(self) -> int:
        if os.geteuid() != 0:
            self._held[os.geteuid()] = -1
            return os.geteuid()
        for i in range(self._count):
            uid = self._base + (self._next_probe + i) % self._count
            if uid in self._held:
                continue
            fd = os.open(self._dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[uid] = fd
            self._next_probe = (self._next_probe + i + 1) % self._count
            return uid
        raise SandboxError(
            f"all {self._count} slot uids from {self._base} are held by other farm processes"
        )

    async def acquire(self) -> Slot:
        async with self._cond:
            await self._cond.wait_for(lambda: self._in_use < self._capacity or self._stopped)
            if self._stopped:
                raise SandboxError("the sandbox is shutting down")
            self._in_use += 1
        try:
            uid = self._free.pop() if self._free else self._reserve_uid()
        except BaseException:
            await self._give_back_capacity()
            raise
        gid = uid if os.geteuid() == 0 else os.getegid()
        return Slot(uid, gid)

    async def _give_back_capacity(self) -> None:
        async with self._cond:
            self._in_use -= 1
            self._cond.notify()

    async def release(self, slot: Slot) -> None:
        """Give a slot back. Only after every process of its box is gone."""
        self._free.append(slot.uid)
        await self._give_back_capacity()

    async def stop(self) -> None:
        """Refuse new acquisitions and wake everyone waiting for one."""
        async with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def close(self) -> None:
        for fd in self._held.values():
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._held.clear()
        self._free.clear()
