"""The one write transaction at a time: what a writer that is cancelled or writes nothing leaves behind, the
round trips a write costs on SQLite's thread, and the checkpoints that are not the writer's."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any, cast

import aiosqlite
import pytest

from farmd.store import Store
from farmd.store.database import CHECKPOINT_EVERY_S, SqliteDatabase
from tests.store.test_store import traj


async def _keys(store: Store) -> list[str]:
    return sorted(str(r[0]) for r in await store.db.all("SELECT key FROM state WHERE key LIKE 'test-%'"))


@pytest.mark.parametrize("when", ["in its first statement", "after its first statement"])
async def test_a_cancelled_writer_leaves_nothing_and_no_transaction_open(tmp_path: Path, when: str) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        wrote = asyncio.Event()

        async def writer() -> None:
            async with store.db.write() as tx:
                await tx.execute("INSERT INTO state(key, value) VALUES ('test-cancelled', 'x')")
                wrote.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(writer())
        if when == "in its first statement":
            await asyncio.sleep(0)  # it has handed its first statement (and its BEGIN) to the connection
        else:
            await wrote.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with store.db.write() as tx:
            await tx.execute("INSERT INTO state(key, value) VALUES ('test-after', 'y')")
        assert await _keys(store) == ["test-after"]
    finally:
        await store.close()


async def test_a_write_of_nothing_leaves_no_transaction_open(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        async with store.db.write():
            pass
        async with store.db.write() as tx:
            await tx.execute("INSERT INTO state(key, value) VALUES ('test-next', 'y')")
        assert await _keys(store) == ["test-next"]
    finally:
        await store.close()


@pytest.mark.sqlite_only
async def test_a_writes_begin_goes_with_its_first_statement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each statement is a round trip to the connection's thread; BEGIN IMMEDIATE is not one of its own (on the
    branch point a one-statement write made three: BEGIN, the statement, COMMIT), and statements that answer
    nothing ride with the next hop: a write of only those is one, BEGIN and COMMIT included. An error of theirs is
    raised where they run, and the whole transaction is rolled back."""
    store = await Store.open(tmp_path / "farm.db")
    hops = 0
    handed = aiosqlite.Connection._execute

    writer = cast(SqliteDatabase, store.db)._wdb  # the WAL's checkpoints go on a connection of their own

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal hops
        hops += self is writer
        return await handed(self, fn, *args, **kwargs)

    try:
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
        async with store.db.write() as tx:
            await tx.execute("INSERT INTO state(key, value) VALUES ('test-one', 'x')")
        assert hops == 2, "the statement with its BEGIN, then COMMIT"
        hops = 0
        async with store.db.write() as tx:
            await tx.executemany_each([("INSERT INTO state(key, value) VALUES (?, ?)", [("test-a", "1"), ("test-b", "2")]),
                                       ("DELETE FROM state WHERE key = ?", [("test-one",)])])
        assert hops == 1 and await _keys(store) == ["test-a", "test-b"]
        hops = 0
        async with store.db.write() as tx:
            await tx.executemany("INSERT INTO state(key, value) VALUES (?, ?)", [("test-c", "3")])
            assert (await tx.execute_fetchall("SELECT value FROM state WHERE key='test-c'")) == [("3",)]
        assert hops == 2, "the rows went with the read that follows them"
        hops = 0
        async with store.db.write() as tx:
            await tx.executemany_numbered("SELECT COUNT(*) FROM state WHERE key LIKE 'test-%'",
                                          lambda row: [("INSERT INTO state(key, value) VALUES (?, ?)",
                                                        [(f"test-{row[0] + 1}", "n")])])
        assert hops == 1 and "test-4" in await _keys(store), "rows numbered from a read ride with the commit, the read too"
        async with store.db.write() as tx:
            await tx.execute("DELETE FROM state WHERE key = 'test-4'")
        hops = 0
        ids = await store.enqueue([("arith", seed, 1, "torch:tiny", 4) for seed in range(64)])
        assert hops == 2 and len(ids) == 64, "64 groups queued in one hop, their ids read in it, then COMMIT"
        hops = 0
        leased = await store.lease("node:1:worker", 8, 60.0, 3)
        assert hops == 2 and {j.policy_version for j in leased} == {3}, "the lease, its versions with the COMMIT"
        assert [j.group_id for j in leased] == [ids[0]] * 4 + [ids[1]] * 4
        hops = 0
        stored = await store.complete([("node:1:worker", traj(j.id, j.group_id)) for j in leased])
        assert hops == 2 and stored == [j.id for j in leased], "the leases read, then all the rest with COMMIT"
        records = await store.trajectories(limit=10)
        assert [t.seq for t in records] == list(range(1, 9)) and {t.policy_version for t in records} == {3}
        with pytest.raises(sqlite3.IntegrityError):
            async with store.db.write() as tx:
                await tx.execute("DELETE FROM state WHERE key = 'test-a'")
                await tx.executemany("INSERT INTO state(key, value) VALUES (?, ?)", [("test-d", "4"), ("test-c", "5")])
        assert await _keys(store) == ["test-a", "test-b", "test-c"], "the failed write left nothing"
        async with store.db.write() as tx:
            await tx.executemany("INSERT INTO state(key, value) VALUES (?, ?)", [("test-d", "4")])
        assert await _keys(store) == ["test-a", "test-b", "test-c", "test-d"]
    finally:
        monkeypatch.undo()
        await store.close()


async def test_rows_numbered_from_what_is_stored_follow_everything_before_them(tmp_path: Path) -> None:
    """``executemany_numbered`` makes its statements from its query's row as the transaction stands where they
    run (after the statements before them, before those after), on either database; a build that fails fails the
    whole write."""
    store = await Store.open(tmp_path / "farm.db")
    count = "SELECT COUNT(*) FROM state WHERE key LIKE 'test-%'"

    def next_key(row: Any) -> list[tuple[str, list[Any]]]:
        return [("INSERT INTO state(key, value) VALUES (?, ?)", [(f"test-{int(row[0]) + 1}", "n")])]

    try:
        async with store.db.write() as tx:
            await tx.executemany("INSERT INTO state(key, value) VALUES (?, ?)", [("test-1", "a")])
            await tx.executemany_numbered(count, next_key)
            await tx.executemany_numbered(count, next_key)
            await tx.executemany("INSERT INTO state(key, value) VALUES (?, ?)", [("test-9", "z")])
        assert await _keys(store) == ["test-1", "test-2", "test-3", "test-9"]

        def broken(row: Any) -> list[tuple[str, list[Any]]]:
            raise ValueError(f"no statements from {tuple(row)}")

        with pytest.raises(ValueError, match="no statements from"):
            async with store.db.write() as tx:
                await tx.execute("DELETE FROM state WHERE key = 'test-1'")
                await tx.executemany_numbered(count, broken)
        assert await _keys(store) == ["test-1", "test-2", "test-3", "test-9"], "the failed write left nothing"
    finally:
        await store.close()


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 63, 64, 85, 150])
async def test_an_insert_of_many_rows_writes_them_in_order_as_one_a_row_would(tmp_path: Path, rows: int) -> None:
    """An INSERT of many rows goes in statements of many rows each (``database._one_values_row``): the rows, their
    order and their ids are what one statement a row gives, on either database; a row that breaks a constraint
    fails the whole write."""
    store = await Store.open(tmp_path / "farm.db")
    try:
        sent = [(f"test-{i:04d}", f"v{i}") for i in range(rows)]
        async with store.db.write() as tx:
            await tx.executemany("INSERT INTO state(key, value) VALUES (?,?)", sent)
        assert [(str(k), str(v)) for k, v in await store.db.all(
            "SELECT key, value FROM state WHERE key LIKE 'test-%' ORDER BY rowid")] == sent
        with pytest.raises(Exception):  # noqa: B017 - each driver's own integrity error
            async with store.db.write() as tx:
                await tx.executemany("INSERT INTO state(key, value) VALUES (?,?)",
                                     [("test-new", "x"), *((f"test-more-{i}", "m") for i in range(rows)),
                                      ("test-new", "y")])
                await tx.execute("SELECT 1")  # what rides with the next hop is raised there
        assert await _keys(store) == [k for k, _ in sent], "nothing of the failed write is kept"
    finally:
        await store.close()


def test_only_an_insert_ending_in_its_one_row_is_written_many_rows_at_once() -> None:
    from farmd.store.database import _one_values_row

    assert _one_values_row("INSERT INTO t(a, b, c) VALUES (?,'queued',?)") == ("INSERT INTO t(a, b, c) VALUES ",
                                                                               "(?,'queued',?)")
    for other in ("INSERT INTO t(a) VALUES (?) ON CONFLICT(a) DO NOTHING", "INSERT INTO t SELECT a FROM u WHERE b=?",
                  "UPDATE t SET a=? WHERE b=?", "INSERT INTO t(a) VALUES (lower(?))"):
        assert _one_values_row(other) is None, other


@pytest.mark.sqlite_only
@pytest.mark.clocked
async def test_the_wal_is_checkpointed_beside_the_writer_never_by_it(tmp_path: Path) -> None:
    """A commit never pays for a checkpoint: one past SQLite's own mark (1,000 pages, where the writer checkpointed
    the whole WAL before its commit returned) leaves the database file as it was, and the checkpoints' own
    connection copies it back within a few ``CHECKPOINT_EVERY_S``."""
    path = tmp_path / "farm.db"
    store = await Store.open(path)
    try:
        before = path.stat().st_size
        async with store.db.write() as tx:
            await tx.execute("INSERT INTO state(key, value) VALUES ('test-big', ?)", (os.urandom(6 << 20),))
        assert path.stat().st_size < before + (1 << 20), "the writer checkpointed"
        for _ in range(int(10 * CHECKPOINT_EVERY_S / 0.05)):
            if path.stat().st_size >= before + (6 << 20):
                break
            await asyncio.sleep(0.05)
        assert path.stat().st_size >= before + (6 << 20), "no checkpoint copied the write back"
    finally:
        await store.close()
