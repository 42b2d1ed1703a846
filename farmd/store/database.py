"""The database layer: the connections, the schema's migrations, and the one write transaction at a time.

Two backends behind one interface. SQLite (the default, one file under the data directory): one aiosqlite
connection (its own thread) in WAL mode writes, every write one ``BEGIN IMMEDIATE`` transaction, and reads go
through a second connection, which in WAL mode sees only committed transactions. PostgreSQL
(``farmd.store.postgres``): the same, on a server. Either way every write is one transaction
(``Database.write``), so a crash at any instant leaves either all of an operation or none of it, and writes are
one at a time (the streams' sequence numbers are taken in commit order). The record modules
(``farmd.store.jobs``, ``trajectories``, ``intake``, ...) take a ``Database``; what spans two of them
(completing a job and storing its trajectory) is one ``write`` its caller opens and hands on.

The SQL is written once where the dialects agree; where they do not, the record modules ask ``Database.sql``
(a ``Dialect``) for the fragment, so every difference between the two is in this layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiosqlite

from farmd.errors import StoreError
from farmd.private import create_file, make_dir
from farmd.store.schema import MIGRATIONS

log = logging.getLogger(__name__)

MAX_VARS = 10_000
"""Ids bound to one statement at most (SQLite binds at most 32766 values): longer lists go in chunks."""


class Dialect:
    """SQL fragments where SQLite and PostgreSQL differ: SQLite's, overridden by ``farmd.store.postgres``."""

    name = "sqlite"

    def json_values(self, expr: str, alias: str, *, integers: bool = False) -> str:
        """A FROM item named ``alias`` whose ``value`` column holds each element of the JSON array ``expr`` (text,
        or ``integers``); a column that is not a JSON array is read as no elements, never a failed query."""
        if expr == "?":  # a bound list farmd made itself: one parameter, bound once
            return f"json_each(?) AS {alias}"
        return f"json_each(CASE WHEN json_valid({expr}) THEN {expr} ELSE '[]' END) AS {alias}"

    def json_array(self, expr: str) -> str:
        """A JSON array (as text) of one element."""
        return f"json_array({expr})"

    def json_group_array(self, expr: str) -> str:
        """The aggregate of ``expr`` as a JSON array (as text), ``[]`` for none."""
        return f"json_group_array({expr})"

    def greatest(self, a: str, b: str) -> str:
        return f"MAX({a}, {b})"

    def integer_part(self, expr: str) -> str:
        """A number's integer part (toward zero), as an integer."""
        return f"CAST({expr} AS INTEGER)"

    def is_number(self, expr: str) -> str:
        """Whether a value is stored as a number (SQLite keeps any type in any column)."""
        return f"typeof({expr}) IN ('real', 'integer')"

    def serial_key(self) -> str:
        """The type of an integer key column given the next number when a row leaves it out."""
        return "INTEGER PRIMARY KEY"

    def temp(self, table: str) -> str:
        """A temporary table of the writing connection, by the name statements reach it."""
        return f"temp.{table}"

    def glob(self, expr: str) -> str:
        """``expr`` matches the shell pattern bound to the parameter (``*``, ``?``, ``[...]``), case sensitive."""
        return f"{expr} GLOB ?"

    def glob_pattern(self, pattern: str) -> str:
        """A shell pattern as the parameter of ``glob`` takes it."""
        return pattern


Statements = list[tuple[str, list[Any]]]
"""(statement, rows) pairs, each run with ``executemany`` in order."""
Numbered = Callable[[Sequence[Any]], Statements]
"""What ``Transaction.executemany_numbered`` takes: the statements of rows numbered from the row it is handed."""


class Transaction(Protocol):
    """The write transaction ``Database.write`` opened: one atomic change's statements, in order.

    What the record modules' in-transaction steps take. Results are plain values (rows, counts, a new
    row's id), never a driver's cursor, so no step depends on the driver under it; statements are written
    with ``?`` parameters, whichever the database."""

    sql: Dialect

    async def execute(self, sql: str, params: Iterable[Any] = ()) -> int:
        """Run one statement; how many rows it changed (0 for one that changes none)."""

    async def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> None:
        """Run one statement for each of ``rows`` (one row: any statement, as ``execute`` runs; more: DML only). It
        may be sent with the transaction's next statement, or its commit, and an error of it raised there (SQLite's:
        a hop to its thread was most of what a short write waited on, on a loaded machine)."""

    async def executemany_each(self, statements: Iterable[tuple[str, Iterable[Iterable[Any]]]]) -> None:
        """``executemany`` of each (statement, rows) in order, in one round trip to the driver where it allows."""

    async def executemany_numbered(self, query: str, build: Numbered) -> None:
        """``executemany_each`` of the statements ``build`` makes from ``query``'s one row (where the ids of new
        rows start). Sent, like ``executemany``, with the next statement or the commit where the driver allows:
        SQLite runs the query, ``build`` and its statements on its thread, so a write that numbers its own rows
        (an Atropos push) is one hop there, not two. ``build`` is a function of that row and what it was given
        alone: it may run on another thread."""

    async def execute_fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        """The rows a statement returns (a SELECT's, or an UPDATE's RETURNING)."""

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any: ...

    async def insert(self, sql: str, params: Iterable[Any] = ()) -> int:
        """Run one INSERT of one row into a table keyed by ``id``; the id it was given, 0 when it inserted
        none (``ON CONFLICT DO NOTHING``)."""


@dataclass(frozen=True, slots=True)
class Standby:
    """A coordinator waiting to take over the farm (``Database.standbys``)."""

    address: str
    """Where it will serve (its ``--listen``), as it said when it began to wait."""
    since: float
    """When it began to wait (a time)."""


class Database:
    """A store's database: ``SqliteDatabase`` (a file) or ``farmd.store.postgres.PostgresDatabase`` (a server),
    each opened by its ``open``. Close with ``await db.close()``."""

    sql: Dialect = Dialect()
    shared = False
    """Whether other processes (coordinators) may use the database too: a server's, never a file's."""
    path: Path
    """The data directory's database file (SQLite), or where it would be (PostgreSQL): files beside it."""

    async def close(self) -> None:
        raise NotImplementedError

    def write(self) -> AbstractAsyncContextManager[Transaction]:
        raise NotImplementedError

    async def all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self.all(sql, params)
        return rows[0] if rows else None

    async def blob_slice(self, table: str, column: str, key: str, rowid: int, offset: int, size: int) -> bytes:
        """``size`` bytes of one blob (in the row whose ``key`` is ``rowid``) from ``offset``, never the whole blob."""
        raise NotImplementedError

    async def size(self) -> int:
        """The bytes the database takes on its disk."""
        raise NotImplementedError

    async def analyze(self, table: str) -> None:
        """``table``'s planner statistics brought up to date, where a planner goes by them (a server's). SQLite's
        plans for farm's statements go by the indexes alone: nothing to do."""

    async def become_active(self, on_lost: Callable[[], None], address: str = "") -> None:
        """Return once this process is the one coordinator serving the farm: at once on SQLite (its file is one
        process's); on a server, once no other process holds the role. ``on_lost``: called if the role is lost
        (the connection that holds it dropped), when the process must stop serving. ``address``: where this
        process will serve, shown to the active one's operators while this one waits (``standbys``)."""

    async def standbys(self) -> list[Standby]:
        """The coordinators waiting to take over (``become_active``), oldest first: none on SQLite."""
        return []

    def on_stored(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when another process sharing this database stored something streams read (only a
        server has other processes: SQLite's one writer wakes its own streams)."""


CHECKPOINT_EVERY_S = 1.0
"""How often, at most, the WAL is checkpointed while writes come (``SqliteDatabase._checkpoint``)."""


class SqliteDatabase(Database):
    """Open with ``await SqliteDatabase.open(path)``; close with ``await db.close()``."""

    def __init__(self, writer: aiosqlite.Connection, reader: aiosqlite.Connection, checkpointer: aiosqlite.Connection,
                 path: Path) -> None:
        self._wdb = writer
        self._db = reader
        """Reads go through their own connection: in WAL mode it sees only committed transactions,
        never the middle of a write another coroutine has open on the writing connection."""
        self._checkpointer = checkpointer
        self._written = asyncio.Event()
        self._checkpoints = asyncio.get_running_loop().create_task(self._checkpoint(), name="sqlite-checkpoints")
        self._write_lock = asyncio.Lock()
        self.path = path

    @classmethod
    async def open(cls, path: Path) -> SqliteDatabase:
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
            await db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpoints are _checkpoint's
            reader = await aiosqlite.connect(path, isolation_level=None)
            await reader.execute("PRAGMA busy_timeout=10000")
            checkpointer = await aiosqlite.connect(path, isolation_level=None)
            database = cls(db, reader, checkpointer, path)
        except BaseException:
            for conn in (db, reader):
                if conn is not None:
                    await conn.close()
            raise
        try:
            await database._migrate()
        except BaseException:
            await database.close()
            raise
        return database

    async def close(self) -> None:
        self._checkpoints.cancel()
        await asyncio.gather(self._checkpoints, return_exceptions=True)
        await self._checkpointer.close()
        await self._db.close()
        await self._wdb.close()  # the last connection: SQLite checkpoints the whole WAL as it closes

    async def _checkpoint(self) -> None:
        """SQLite's WAL copied back into the database file, at most every ``CHECKPOINT_EVERY_S`` while writes come,
        on a connection and thread of its own. Left to the writer (SQLite's automatic checkpoint, every 1,000 pages),
        a commit now and then paid for a whole checkpoint and its fsync: commits of an Atropos push's rows (45 KB, in
        SQLite alone) took 0.07 ms at the median and 0.24-0.36 ms on average, up to 275 ms, against 0.09 ms and at
        most 2 ms without. A passive checkpoint never waits for the writer or the readers; what it cannot copy yet is
        copied by the next."""
        while True:
            await self._written.wait()
            await asyncio.sleep(CHECKPOINT_EVERY_S)
            self._written.clear()
            try:
                await self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:  # the WAL grows until one succeeds; nothing committed is lost
                log.warning("a checkpoint of %s failed: %s", self.path, exc,
                            extra={"event": "checkpoint_failed", "error": str(exc)})

    async def _migrate(self) -> None:
        row = await self.one("PRAGMA user_version")
        current = int(row[0]) if row else 0
        if current > len(MIGRATIONS):
            raise StoreError(f"{self.path} has schema version {current}; this farmd knows up to {len(MIGRATIONS)}")
        for version in range(current, len(MIGRATIONS)):
            await self._wdb.executescript(f"BEGIN; {MIGRATIONS[version]}; PRAGMA user_version={version + 1}; COMMIT;")

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Transaction]:
        """One write transaction at a time on the writing connection (aiosqlite runs statements
        in order, but would interleave two coroutines' transactions)."""
        async with self._write_lock:
            transaction = SqliteTransaction(self._wdb)
            try:
                yield transaction
                await transaction.commit()
                self._written.set()
            except BaseException:
                # Also when the caller was cancelled: a statement already handed to the
                # connection's thread runs anyway (a BEGIN included), so the transaction must
                # be ended here, or the next writer finds one open. The rollback is queued
                # behind it and shielded from a second cancellation.
                await asyncio.shield(self._rollback())
                raise

    async def _rollback(self) -> None:
        # OperationalError: the BEGIN itself failed, so there is nothing to end.
        with contextlib.suppress(sqlite3.OperationalError):
            await self._wdb.execute("ROLLBACK")

    async def all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        """Rows of one read, in one call on the reader's thread: a cursor held open across awaits
        would pin every other coroutine's reads to its snapshot, which can predate a commit."""
        return list(await self._db.execute_fetchall(sql, params))

    async def size(self) -> int:
        return await asyncio.to_thread(_file_bytes, self.path)

    async def blob_slice(self, table: str, column: str, key: str, rowid: int, offset: int, size: int) -> bytes:
        """``size`` bytes of one blob from ``offset``, never the whole blob: in a thread."""
        return await asyncio.to_thread(_blob_slice, self.path, table, column, rowid, offset, size)


def _file_bytes(path: Path) -> int:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(f"{os.fspath(path)}{suffix}").st_size
    return total


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


class SqliteTransaction:
    """A ``Transaction`` on SQLite's writing connection.

    Each statement runs on the connection's thread in one hop there and back (aiosqlite's ``_execute``, as its
    own methods run theirs: aiosqlite is pinned); a short write waited on its hops more than on SQLite, so no
    hop is spent on what can ride with another. ``BEGIN IMMEDIATE`` runs in the first statement's hop, and
    ``executemany``, ``executemany_each`` and ``executemany_numbered``, which answer nothing, wait for the next
    statement's hop or the COMMIT's (an error of theirs is raised there, still inside the transaction, which is
    then rolled back)."""

    sql = Dialect()

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self.begun = False
        """Whether BEGIN was handed to the connection (then the transaction is COMMITted or rolled back)."""
        self._pending: list[tuple[str, list[Any] | _Build]] = []
        """Statements with rows (or the ``executemany_numbered`` that makes them), sent with the next hop."""

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        first, self.begun = not self.begun, True
        pending, self._pending = self._pending, []
        return await self._conn._execute(  # type: ignore[no-untyped-call]
            _in_hop, first, pending, fn, self._conn._conn, *args)

    async def commit(self) -> None:
        """COMMIT, with whatever waits to be sent; nothing when nothing was."""
        if self.begun or self._pending:
            await self._run(_commit)

    async def execute(self, sql: str, params: Iterable[Any] = ()) -> int:
        return int(await self._run(_execute, sql, params))

    async def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> None:
        self._pending.append((sql, list(rows)))

    async def executemany_each(self, statements: Iterable[tuple[str, Iterable[Iterable[Any]]]]) -> None:
        self._pending.extend((sql, list(rows)) for sql, rows in statements)

    async def executemany_numbered(self, query: str, build: Numbered) -> None:
        self._pending.append((query, _Build(build)))

    async def execute_fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        return list(await self._run(_fetchall, sql, params))

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self.execute_fetchall(sql, params)
        return rows[0] if rows else None

    async def insert(self, sql: str, params: Iterable[Any] = ()) -> int:
        return int(await self._run(_insert, sql, params))


# What ``SqliteTransaction`` runs on the connection's own thread.

def _in_hop(begin: bool, pending: list[tuple[str, list[Any] | _Build]], fn: Callable[..., Any], conn: sqlite3.Connection,
           *args: Any) -> Any:
    if begin:
        conn.execute("BEGIN IMMEDIATE")
    _executemany_each(conn, pending)
    return fn(conn, *args)


def _commit(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")


def _execute(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    return max(0, conn.execute(sql, params).rowcount)


def _fetchall(conn: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _insert(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    cur = conn.execute(sql, params)
    return int(cur.lastrowid or 0) if cur.rowcount > 0 else 0


class _Build:
    """A pending ``executemany_numbered``: its query's row is read, and its statements made, on the thread."""

    __slots__ = ("build",)

    def __init__(self, build: Numbered) -> None:
        self.build = build


def _executemany_each(conn: sqlite3.Connection, batch: Sequence[tuple[str, list[Any] | _Build]]) -> None:
    for sql, rows in batch:
        if isinstance(rows, _Build):
            _executemany_each(conn, rows.build(conn.execute(sql).fetchone()))
            continue
        if len(rows) == 1:  # as ``execute``: any statement (``executemany`` takes only DML), DDL included
            conn.execute(sql, rows[0])
            continue
        insert = _one_values_row(sql)
        if insert is None:
            conn.executemany(sql, rows)
            continue
        head, one_row = insert
        at = 0
        for size in _ROW_BLOCKS:
            while len(rows) - at >= size:
                conn.execute(head + ",".join((one_row,) * size), [v for row in rows[at:at + size] for v in row])
                at += size


_ROW_BLOCKS = (64, 16, 4, 1)
"""Rows an INSERT of many writes per statement: the largest first. Few sizes, so few statements to prepare and
cache for each INSERT; at most 64 rows of at most 511 values stays under SQLite's 32,766 parameters."""
_ONE_VALUES_ROW = re.compile(r"(?is)^(\s*INSERT\b.*?\bVALUES\s*)(\([^()]*\))\s*$")


@functools.cache
def _one_values_row(sql: str) -> tuple[str, str] | None:
    """An INSERT whose statement ends in its one row of VALUES, as (what comes before the row, the row); None for
    any other statement (an upsert's ON CONFLICT, an INSERT ... SELECT, an UPDATE).

    Such an INSERT of many rows is written as statements of many rows each, never one statement a row as
    ``executemany`` does: Python's sqlite3 releases the GIL around every step, a row each, and takes it back after.
    With the event loop busy, taking it back waits out the interpreter's switch interval, 5 ms: 2,000 rows took
    60 ms with the GIL free and 9-12 s beside a busy thread, against 0.27 s in statements of 64 rows (measured
    here). Rows are inserted in order either way, and a constraint a row breaks fails its statement, and so the
    caller's transaction, as it did."""
    match = _ONE_VALUES_ROW.match(sql)
    return (match.group(1), match.group(2)) if match is not None else None
