"""What every bench module needs: a real farmd to measure, a trainer's drain of its stream, and the
closing lines of a report (goals met or not, and what limits each figure)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import asyncpg
import grpc
from farm_client import Batch, FarmClient
from farm_client.record import Trajectory
from rich.console import Console

from farmd.cli.local_farmd import LocalFarmd


@contextlib.contextmanager
def farmd(data: Path, workers: int, timeout_s: float = 60.0) -> Iterator[str]:
    """``farmd serve`` on port 0 with ``data``; yields its address; SIGTERM and wait on the way out."""
    env = {k: v for k, v in os.environ.items() if k != "FARM_TOKEN"}  # the client sends no token
    with LocalFarmd(data, "--workers", str(workers), log_path=data.parent / f"{data.name}.log", env=env,
                    start_timeout_s=timeout_s) as running:
        yield running.addr


def drain(client: FarmClient, consumer: str, count: int, batch_size: int, *, whole_groups: bool = False,
          tick: Callable[[int], None] | None = None, deadline_s: float = 300.0) -> list[Trajectory]:
    """Take ``count`` trajectories from ``consumer``'s stream, acking each batch as a trainer does.

    A stream waits for ever; after ``deadline_s`` (rollouts that failed for good never arrive) the
    client's channel is closed under it, and that is an error.
    """
    got: list[Trajectory] = []
    # A generator, whatever its annotation says: closing it cancels the RPC now, not at collection.
    stream = cast(Generator[Batch, None, None],
                  client.batches(consumer, batch_size=batch_size, whole_groups=whole_groups))
    watchdog = threading.Timer(deadline_s, client.close)
    watchdog.start()
    try:
        for batch in stream:
            got += batch.trajectories
            client.ack(batch)
            if tick:
                tick(len(batch))
            if len(got) >= count:
                break
    except grpc.RpcError as exc:
        raise RuntimeError(f"{consumer}: {len(got)} of {count} trajectories arrived in {deadline_s:g}s "
                           f"({exc.code().name})") from exc
    finally:
        watchdog.cancel()
        stream.close()
    return got


def verdicts(console: Console, met: Mapping[str, bool], limits: Sequence[str], *,
             goals: Mapping[str, str] | None = None, how: str = " (found by measuring parts of it apart, on "
             "this code)") -> None:
    """A report's last lines: each goal met or not (with what it asks, where given), then what limits
    each figure."""
    for name, ok in met.items():
        asked = f" ({goals[name]})" if goals and name in goals else ""
        console.print(f"  {'met' if ok else 'NOT met'}: {name}{asked}")
    console.print(f"What limits each figure{how}:")
    for line in limits:
        console.print(f"  - {line}")


def stored_rows(db: Path) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
    """The trajectories table's DDL (indexes too), its columns, and its rows as the farm stored them:
    what a raw-SQLite baseline writes again."""
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        ddl = [sql for (sql,) in src.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name='trajectories' AND sql IS NOT NULL ORDER BY type DESC")]
        columns = [c[1] for c in src.execute("PRAGMA table_info(trajectories)")]
        rows = src.execute(f"SELECT {','.join(columns)} FROM trajectories ORDER BY seq").fetchall()
    finally:
        src.close()
    return ddl, columns, rows


@contextlib.contextmanager
def raw_table(raw: Path, ddl: Sequence[str]) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 database with the farm's trajectories table, opened as the store opens its own."""
    con = sqlite3.connect(raw, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        for sql in ddl:
            con.execute(sql)
        yield con
    finally:
        con.close()


def raw_insert(con: sqlite3.Connection, columns: Sequence[str], rows: Sequence[tuple[Any, ...]], per_txn: int,
               tick: Callable[[int], None] | None = None) -> list[float]:
    """``rows`` into ``raw_table``'s table, ``per_txn`` a transaction; the seconds each transaction took."""
    insert = f"INSERT INTO trajectories({','.join(columns)}) VALUES ({','.join('?' * len(columns))})"
    per_call = []
    for start in range(0, len(rows), per_txn):
        chunk = rows[start:start + per_txn]
        t0 = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        con.executemany(insert, chunk)
        con.execute("COMMIT")
        per_call.append(time.perf_counter() - t0)
        if tick:
            tick(len(chunk))
    return per_call


def committed_row(path: Path, url: str | None, sql: str) -> tuple[int, ...]:
    """One row of integers ``sql`` reads from what a farm's store committed, read by this process: its PostgreSQL
    database at ``url``, or its SQLite file at ``path`` (read-only). Its coordinators may be busy, or dead."""
    if url is not None:
        return asyncio.run(_server_row(url, sql))
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return tuple(int(v) for v in con.execute(sql).fetchone())
    finally:
        con.close()


async def _server_row(url: str, sql: str) -> tuple[int, ...]:
    con = await asyncpg.connect(url)
    try:
        row = await con.fetchrow(sql)
    finally:
        await con.close()
    assert row is not None
    return tuple(int(v) for v in row)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (for a server that takes its port from its command line)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
