"""Policy content in the database, for a store on PostgreSQL: the rows of ``policy_chunks``, a chunk each.

On SQLite a policy's content is a file beside the database (``farmd.store.policy_files``): one process serves it.
On PostgreSQL several coordinators may serve one farm, and a node may fetch a version from any of them, so the
content lives where every one of them reads it: the database. An upload still goes to a temporary file first
(hashed as it arrives, checked before it is kept, never held in memory); keeping it copies it into the table a
chunk per transaction (a gigabyte is never one statement, and the writes of everything else go on between its
chunks), its last chunk written last, so content is whole once its row can name it. Reads go a chunk at a time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from farmd.store.database import Database
from farmd.store.policy_files import FOLDER, PolicyFiles, PolicyUpload

CHUNK_BYTES = 1 << 20
"""Bytes per row: small enough that one row is never a burden to hold, large enough that a row is little overhead."""


class PolicyChunks(PolicyFiles):
    """Policy content in ``policy_chunks`` (sha256, n, data); uploads in progress still files under the data
    directory (``PolicyFiles``' uploads and sweep)."""

    def __init__(self, db: Database, data_dir: Path) -> None:
        super().__init__(data_dir)
        self._db = db

    async def keep(self, upload: PolicyUpload) -> str:
        sha256 = upload.sha256
        # The same content kept before (by this coordinator or another): whole already, nothing to copy.
        if await self._db.one("SELECT 1 FROM policy_chunks WHERE sha256=? AND n=0", (sha256,)) is None:
            await self._copy(upload, sha256)
        await upload.discard()
        return f"{FOLDER}/{sha256}"

    async def _copy(self, upload: PolicyUpload, sha256: str) -> None:
        path = upload.path  # open and locked by the upload while it is copied
        size = upload.size
        count = max(1, -(-size // CHUNK_BYTES))
        # Chunk 0 last: "chunk 0 is there" is what says the content is whole.
        for n in [*range(1, count), 0]:
            data = await asyncio.to_thread(_read_at, path, n * CHUNK_BYTES, CHUNK_BYTES)
            async with self._db.write() as db:
                await db.execute("DELETE FROM policy_chunks WHERE sha256=? AND n=?", (sha256, n))
                await db.execute("INSERT INTO policy_chunks(sha256, n, data) VALUES (?,?,?)", (sha256, n, data))

    async def read(self, name: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        sha256 = self._path(name).name
        if await self._db.one("SELECT 1 FROM policy_chunks WHERE sha256=? AND n=0", (sha256,)) is None:
            raise FileNotFoundError(name)
        n = 0
        while True:
            row = await self._db.one("SELECT data FROM policy_chunks WHERE sha256=? AND n=?", (sha256, n))
            if row is None:
                return
            data = bytes(row[0])
            for start in range(0, len(data), chunk_bytes):
                yield data[start:start + chunk_bytes]
            n += 1

    async def remove_content(self, names: list[str]) -> int:
        freed = 0
        for name in names:
            sha256 = self._path(name).name
            async with self._db.write() as db:
                row = await db.fetchone("SELECT COALESCE(SUM(length(data)), 0) FROM policy_chunks WHERE sha256=?",
                                        (sha256,))
                await db.execute("DELETE FROM policy_chunks WHERE sha256=?", (sha256,))
            freed += int(row[0]) if row else 0
        return freed

    async def content_held(self) -> dict[str, int]:
        rows = await self._db.all("SELECT sha256, SUM(length(data)) FROM policy_chunks GROUP BY sha256 "
                                  "HAVING MIN(n) = 0")
        return {str(sha): int(size) for sha, size in rows}

    async def content_usage(self) -> tuple[int, int]:
        row = await self._db.one("SELECT COUNT(DISTINCT sha256), COALESCE(SUM(length(data)), 0) FROM policy_chunks")
        return (int(row[0]), int(row[1])) if row else (0, 0)


def _read_at(path: Path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)
