"""The delivery service: cursors by name and kind, staleness, and which consumers demand follows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from farmd.records import Trajectory
from farmd.scheduler.delivery import Delivery, _fresh
from farmd.store import Store


def t(tid: int, group: int, version: int) -> Trajectory:
    return Trajectory(id=tid, group_id=group, env="e", env_version="1", seed=1, difficulty=1, agent="a",
                      policy_version=version, reward=1.0, passed=True, status="ok", reasons=[], flags=[],
                      verifier_version="1", steps=[], final="", node="n")


def test_staleness_keeps_or_drops_whole_groups_as_one() -> None:
    batch = [t(1, 1, 3), t(2, 1, 2), t(3, 2, 3), t(4, 2, 3)]  # group 1 straddles a publish
    assert [x.id for x in _fresh(batch, 3, whole_groups=False)] == [1, 3, 4]
    assert [x.id for x in _fresh(batch, 3, whole_groups=True)] == [3, 4]
    assert _fresh(batch, None, whole_groups=True) == batch


async def test_a_consumer_sitting_on_a_batch_stops_counting_and_counts_again_when_it_acks(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        await store.enqueue([("rg:chain_sum", 1, 1, "reference", 4)])
        jobs = await store.lease("w", 4, 60, 0)
        await store.complete([("w", t(j.id, j.group_id, 0)) for j in jobs])
        delivery = Delivery(store, lambda: 0, stall_s=0.2)
        assert await delivery.backlog() is None, "nobody streaming: nobody to produce for"
        stream = delivery.batches("slow", whole_groups=False, batch_size=2, max_staleness=0, body=False)
        first = await anext(stream)
        assert [x.id for x in first.trajectories] == [jobs[0].id, jobs[1].id]
        assert await delivery.backlog() == 4, "it has taken nothing yet"
        await asyncio.sleep(0.3)
        assert await delivery.backlog() is None, "it sat on its batch past stall_s"
        assert [c["state"] for c in await delivery.status()] == ["stalled"]
        assert await delivery.ack("slow", first.up_to, whole_groups=False) == 2
        assert await delivery.backlog() == 2, "an ack brings it back"
        await stream.aclose()
        assert await delivery.backlog() is None and [c["state"] for c in await delivery.status()] == ["closed"]

        # Reconnecting is no way to sit on a batch for ever: the clock is the consumer's, not the stream's.
        again = delivery.batches("slow", whole_groups=False, batch_size=2, max_staleness=0, body=False)
        assert [x.id for x in (await anext(again)).trajectories] == [jobs[2].id, jobs[3].id]
        await again.aclose()
        await asyncio.sleep(0.3)
        reopened = delivery.batches("slow", whole_groups=False, batch_size=2, max_staleness=0, body=False)
        reading = asyncio.create_task(anext(reopened))
        await asyncio.sleep(0.05)  # it has the same batch again, and still no ack
        assert await delivery.backlog() is None, "a new stream did not restart its clock"
        await asyncio.gather(reading)
        await reopened.aclose()
    finally:
        await store.close()
