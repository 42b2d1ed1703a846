"""Finished rollouts a node holds on disk until the coordinator says it has them.

A result is written (and synced) before it is sent, and removed only when the coordinator answers that
it dealt with it: a dropped connection, a coordinator restart or a node restart loses nothing. Sending
one twice is harmless: the coordinator stores a job once, for the owner holding its lease. Each entry
is one file, ``<job id>.result``: the lease owner's line, then the serialized record.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from farmd.private import make_dir

_SUFFIX = ".result"
MAX_OWNER_CHARS = 300


@dataclass(frozen=True, slots=True)
class Buffered:
    job_id: int
    owner: str
    data: bytes


class Outbox:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ids: set[int] = set()

    async def open(self) -> None:
        """Make the directory and find what an earlier run of this node left unsent."""
        self._ids = await asyncio.to_thread(self._scan)

    def _scan(self) -> set[int]:
        make_dir(self.directory)
        ids = set()
        for path in self.directory.iterdir():
            if path.name.startswith(".tmp-"):
                path.unlink(missing_ok=True)  # a write cut short by a crash: its rollout was never reported
            elif path.suffix == _SUFFIX and path.stem.isdigit():
                ids.add(int(path.stem))
        return ids

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> list[int]:
        return sorted(self._ids)

    async def put(self, items: list[Buffered]) -> None:
        await asyncio.to_thread(self._write, items)
        self._ids.update(b.job_id for b in items)

    def _write(self, items: list[Buffered]) -> None:
        for item in items:
            final = self.directory / f"{item.job_id}{_SUFFIX}"
            tmp = self.directory / f".tmp-{item.job_id}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, item.owner.encode()[:MAX_OWNER_CHARS] + b"\n")
                view = memoryview(item.data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        if items:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the renames themselves survive a power cut
            finally:
                os.close(dir_fd)

    async def read(self, job_ids: list[int]) -> list[Buffered]:
        return await asyncio.to_thread(self._read, job_ids)

    def _read(self, job_ids: list[int]) -> list[Buffered]:
        out = []
        for job_id in job_ids:
            try:
                raw = (self.directory / f"{job_id}{_SUFFIX}").read_bytes()
            except FileNotFoundError:
                self._ids.discard(job_id)
                continue
            owner, _, data = raw.partition(b"\n")
            out.append(Buffered(job_id, owner.decode(errors="replace"), data))
        return out

    async def remove(self, job_ids: list[int]) -> None:
        self._ids.difference_update(job_ids)
        await asyncio.to_thread(self._unlink, job_ids)

    def _unlink(self, job_ids: list[int]) -> None:
        for job_id in job_ids:
            (self.directory / f"{job_id}{_SUFFIX}").unlink(missing_ok=True)
