"""What statements an operation runs on SQLite, and which of them walk a table whole.

A farm's tables only grow: a statement that reads every row of one costs more each day, and in the writer it holds
every other write behind it. SQLite plans without statistics (farmd never analyzes its file), so a plan read on a
small database is the plan of a large one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from farmd.store import Store

_READS_OR_WRITES = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


@contextmanager
def statements_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement run, with its parameters written in, on each SQLite connection opened inside (open the store
    inside)."""
    seen: list[str] = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):  # type: ignore[no-untyped-def]
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(seen.append)
        return conn

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", traced)
        yield seen


@asynccontextmanager
async def traced_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Store, list[str]]]:
    """The store at ``path``, and every statement it runs from its opening on (``statements_run``; its migrations
    left out), closed after. On PostgreSQL the test is skipped: a server's plans follow its statistics."""
    with statements_run(monkeypatch) as seen:
        store = await Store.open(path)
        try:
            if store.db.shared:
                pytest.skip("SQLite's plans: a server's follow its statistics")
            del seen[:]
            yield store, seen
        finally:
            await store.close()


def whole_walks(database: Path, statements: list[str], names: set[str]) -> dict[str, list[str]]:
    """Each of ``statements`` whose plan walks one of ``names`` (tables, and the aliases the statements give them)
    whole, with the steps that do. Temporary tables are made as the statements made them."""
    conn = sqlite3.connect(database)
    try:
        for sql in statements:
            if sql.lstrip().upper().startswith("CREATE TEMP"):
                conn.execute(sql)
        out: dict[str, list[str]] = {}
        for sql in statements:
            if not sql.lstrip().upper().startswith(_READS_OR_WRITES):
                continue
            steps = [str(step[-1]) for step in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
            walks = [step for step in steps if step.startswith("SCAN ") and step.split()[1] in names
                     and "VIRTUAL TABLE" not in step]  # json_each over one row's value, aliased as a table may be
            if walks:
                out[sql[:200]] = walks
        return out
    finally:
        conn.close()
