"""The database layer: the connections, the schema's migrations, and the one write transaction at a time.

One aiosqlite connection (its own thread) in WAL mode writes. Every write is one ``BEGIN IMMEDIATE``
transaction (``Database.write``), so a crash at any instant leaves either all of an operation or none of
it; reads go through a second connection, which in WAL mode sees only committed transactions. The record
modules (``farmd.store.jobs``, ``trajectories``, ``intake``, ...) take a ``Database``; what spans two of
them (completing a job and storing its trajectory) is one ``write`` its caller opens and hands on.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from farmd.errors import StoreError
from farmd.private import create_file, make_dir
from farmd.store.schema import MIGRATIONS

MAX_VARS = 10_000
"""Ids bound to one statement at most (SQLite binds at most 32766 values): longer lists go in chunks."""

Connection = aiosqlite.Connection
"""The writing connection inside a ``write`` transaction, as record modules' in-transaction steps take it."""


class Database:
    """Open with ``await Database.open(path)``; close with ``await db.close()``."""

    def __init__(self, writer: aiosqlite.Connection, reader: aiosqlite.Connection, path: Path) -> None:
        self._wdb = writer
        self._db = reader
        """Reads go through their own connection: in WAL mode it sees only committed transactions,
        never the middle of a write another coroutine has open on the writing connection."""
        self._write_lock = asyncio.Lock()
        self.path = path

    @classmethod
    async def open(cls, path: Path) -> Database:
        # The file exists, private, before SQLite opens it: SQLite gives the -wal and -shm files it
        # makes the database file's mode.
        await asyncio.to_thread(make_dir, path.parent)
        await asyncio.to_thread(create_file, path)
        db = await aiosqlite.connect(path, isolation_level=None)
        reader = None
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a committed transaction survives a process crash (kill -9);
            # only a power loss can take the last ones back.
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.execute("PRAGMA busy_timeout=10000")
            reader = await aiosqlite.connect(path, isolation_level=None)
            await reader.execute("PRAGMA busy_timeout=10000")
            database = cls(db, reader, path)
            await database._migrate()
        except BaseException:
            await db.close()
            if reader is not None:
                await reader.close()
            raise
        return database

    async def close(self) -> None:
        await self._db.close()
        await self._wdb.close()

    async def _migrate(self) -> None:
        row = await self.one("PRAGMA user_version")
        current = int(row[0]) if row else 0
        if current > len(MIGRATIONS):
            raise StoreError(f"{self.path} has schema version {current}; this farmd knows up to {len(MIGRATIONS)}")
        for version in range(current, len(MIGRATIONS)):
            await self._wdb.executescript(f"BEGIN; {MIGRATIONS[version]}; PRAGMA user_version={version + 1}; COMMIT;")

    @asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction at a time on the writing connection (aiosqlite runs statements
        in order, but would interleave two coroutines' transactions)."""
        async with self._write_lock:
            db = self._wdb
            try:
                await db.execute("BEGIN IMMEDIATE")
                yield db
            except BaseException:
                # Also when the caller was cancelled: a statement already handed to the
                # connection's thread runs anyway (a BEGIN included), so the transaction must
                # be ended here, or the next writer finds one open. The rollback is queued
                # behind it and shielded from a second cancellation.
                await asyncio.shield(self._rollback())
                raise
            await db.execute("COMMIT")

    async def _rollback(self) -> None:
        # OperationalError: the BEGIN itself failed, so there is nothing to end.
        with contextlib.suppress(sqlite3.OperationalError):
            await self._wdb.execute("ROLLBACK")

    async def all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        """Rows of one read, in one call on the reader's thread: a cursor held open across awaits
        would pin every other coroutine's reads to its snapshot, which can predate a commit."""
        return list(await self._db.execute_fetchall(sql, params))

    async def one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self.all(sql, params)
        return rows[0] if rows else None

    async def blob_slice(self, table: str, column: str, rowid: int, offset: int, size: int) -> bytes:
        """``size`` bytes of one blob from ``offset``, never the whole blob: in a thread."""
        return await asyncio.to_thread(_blob_slice, self.path, table, column, rowid, offset, size)


def _blob_slice(db_path: Path, table: str, column: str, rowid: int, offset: int, size: int) -> bytes:
    """``size`` bytes of a blob from ``offset`` (blocking: run it in a thread).

    SQLite's incremental blob I/O reads only those bytes, where a SELECT would load the whole blob.
    A connection of its own per slice: a read held open between slices would pin an old snapshot.
    """
    uri = f"{db_path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db, \
            db.blobopen(table, column, rowid, readonly=True) as blob:
        if offset >= len(blob):
            return b""
        blob.seek(offset)
        return blob.read(size)
