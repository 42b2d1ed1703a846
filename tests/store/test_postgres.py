"""What a store on PostgreSQL holds beyond SQLite's: several processes share one database. Two stores opened on
the same server (each with its own data directory, as two coordinators on two machines) take the streams'
sequence numbers one writer at a time, each one's stream is woken by the other's commits, and a policy published
through one is served whole by the other."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from farmd.scheduler.delivery import Delivery
from farmd.store import Store
from farmd.store.postgres import translate
from tests.store.test_store import traj


@pytest.fixture
async def two(postgres: Any, store_backend: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    if store_backend != "postgresql":
        pytest.skip("two processes share a database only on a server")
    url = postgres.new_database()
    a = await Store.open(tmp_path / "a" / "farm.db", url)
    b = await Store.open(tmp_path / "b" / "farm.db", url)
    yield a, b
    await a.close()
    await b.close()


async def _complete_all(store: Store, owner: str) -> int:
    done = 0
    while jobs := await store.lease(owner, 4, 30, 0):
        done += len(await store.complete([(owner, traj(j.id, j.group_id)) for j in jobs]))
    return done


async def test_two_stores_on_one_database_number_every_trajectory_once_in_commit_order(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    await a.enqueue([("py-func", seed, 1, "reference", 2) for seed in range(20)])
    done = await asyncio.gather(_complete_all(a, "wa"), _complete_all(b, "wb"))
    assert sum(done) == 40 and min(done) > 0, done  # both leased, and no job twice
    rows = await a.trajectories(limit=100)
    seqs = sorted(t.seq for t in rows)
    assert seqs == list(range(1, 41)), "each seq once, none skipped"
    groups = await b.finished_groups(0, 100)
    assert len(groups) == 20


async def test_a_stream_is_woken_by_another_coordinators_commit(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    delivery = Delivery(b, lambda _line, _v: 0)
    seen = delivery.generation
    waiting = asyncio.ensure_future(delivery.wait_for_more(seen, 30.0))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await a.enqueue([("py-func", 1, 1, "reference", 1)])
    await _complete_all(a, "wa")
    await asyncio.wait_for(waiting, 10.0)  # woken by NOTIFY, long before its 30 s
    assert delivery.generation > seen


async def test_a_policy_published_through_one_is_served_whole_by_the_other(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    content = os.urandom((1 << 20) * 2 + 12345)  # three chunks, the last a part one
    sha = hashlib.sha256(content).hexdigest()
    published = await a.add_policy(sha, content, None, "tiny")
    assert not any((a.path.parent / "policies").glob("[0-9a-f]*")), "in the database, not a file"
    got = b"".join([chunk async for chunk in b.policy_content(sha, 65536)])
    assert got == content
    assert (await b.policy_by_hash(sha)) == published
    again = await b.add_policy(sha, content, None, "tiny")  # the same content twice: the same version
    assert again.version == published.version


def test_parameters_are_numbered_outside_quotes_and_a_negative_limit_is_none() -> None:
    assert translate("SELECT '?', x FROM t WHERE a = ? AND b = '??' AND c = ? LIMIT ?") == \
        "SELECT '?', x FROM t WHERE a = $1 AND b = '??' AND c = $2 LIMIT NULLIF(GREATEST($3::bigint, -1), -1)"


async def test_a_store_whose_active_lock_is_gone_cannot_write(postgres: Any, store_backend: str,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path) -> None:
    """The server refuses the writes of a coordinator that lost the active lock, whatever that coordinator believes:
    its session is ended behind its back (as the server ends a vanished host's), and the next write fails before
    it changes anything, and says why; a standby then takes the lock and writes."""
    if store_backend != "postgresql":
        pytest.skip("the active lock is PostgreSQL's")
    import asyncpg

    from farmd.errors import ActiveLost

    url = postgres.new_database()
    a = await Store.open(tmp_path / "a" / "farm.db", url)
    b = await Store.open(tmp_path / "b" / "farm.db", url)
    lost: list[str] = []
    try:
        await a.db.become_active(lambda: lost.append("a"))
        await a.enqueue([("arith", 1, 1, "reference", 2)])
        admin = await asyncpg.connect(url)
        try:
            assert await admin.fetchval(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'farmd active' "
                "AND datname = current_database()")
        finally:
            await admin.close()
        with pytest.raises(ActiveLost, match="no longer holds the farm's active lock"):
            await a.enqueue([("arith", 2, 1, "reference", 2)])
        await asyncio.sleep(0.1)
        assert lost, "told to stop serving"
        await asyncio.wait_for(b.db.become_active(lambda: None), 10)
        await b.enqueue([("arith", 3, 1, "reference", 2)])
        assert await b.job_counts() == {"queued": 4}, "the refused write left nothing behind"
    finally:
        await a.close()
        await b.close()
