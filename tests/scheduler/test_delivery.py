"""The delivery service: cursors by name and kind, staleness, and which consumers demand follows."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from farmd.records import Trajectory
from farmd.scheduler.delivery import Delivery, Subscription, _fresh
from farmd.store import Store


def t(tid: int, group: int, version: int) -> Trajectory:
    return Trajectory(id=tid, group_id=group, env="e", env_version="1", seed=1, difficulty=1, agent="a",
                      policy_version=version, reward=1.0, passed=True, status="ok", reasons=[], flags=[],
                      verifier_version="1", steps=[], final="", node="n")


def test_staleness_keeps_or_drops_whole_groups_as_one() -> None:
    batch = [t(1, 1, 3), t(2, 1, 2), t(3, 2, 3), t(4, 2, 3)]  # group 1 straddles a publish
    assert [x.id for x in _fresh(batch, lambda v: v < 3, whole_groups=False)] == [1, 3, 4]
    assert [x.id for x in _fresh(batch, lambda v: v < 3, whole_groups=True)] == [3, 4]
    assert _fresh(batch, lambda v: False, whole_groups=True) == batch


async def test_a_consumer_sitting_on_a_batch_stops_counting_and_counts_again_when_it_acks(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        await store.enqueue([("rg:chain_sum", 1, 1, "reference", 4)])
        jobs = await store.lease("w", 4, 60, lambda _agent: 0)
        await store.complete([("w", t(j.id, j.group_id, 0)) for j in jobs])
        delivery = Delivery(store, lambda _line, _v: 0, stall_s=0.2)
        assert await delivery.backlog() is None, "nobody streaming: nobody to produce for"
        stream = delivery.batches("slow", whole_groups=False, batch_size=2, max_staleness=0, view="summary")
        first = await anext(stream)
        assert [x.id for x in first.trajectories] == [jobs[0].id, jobs[1].id]
        assert await delivery.backlog() == 2, "what it was sent needs no producing, acked or not"
        await asyncio.sleep(0.3)
        assert await delivery.backlog() is None, "it sat on its batch past stall_s"
        assert [c.state for c in await delivery.status()] == ["stalled"]
        assert await delivery.ack("slow", first.up_to, whole_groups=False) == 2
        assert await delivery.backlog() == 2, "an ack brings it back (two stored, never sent)"
        await stream.aclose()
        assert await delivery.backlog() is None and [c.state for c in await delivery.status()] == ["closed"]

        # Reconnecting is no way to sit on a batch for ever: the clock is the consumer's, not the stream's.
        again = delivery.batches("slow", whole_groups=False, batch_size=2, max_staleness=0, view="summary")
        assert [x.id for x in (await anext(again)).trajectories] == [jobs[2].id, jobs[3].id]
        await again.aclose()
        await asyncio.sleep(0.3)
        reopened = delivery.batches("slow", whole_groups=False, batch_size=2, max_staleness=0, view="summary")
        reading = asyncio.create_task(anext(reopened))
        await asyncio.sleep(0.05)  # it has the same batch again, and still no ack
        assert await delivery.backlog() is None, "a new stream did not restart its clock"
        await asyncio.gather(reading)
        await reopened.aclose()
    finally:
        await store.close()


async def test_a_subscription_carries_only_its_agent_and_envs_and_counts_staleness_in_its_own_line(
        tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    versions = {"torch:tiny": 3, "torch:tiny?temperature=0": 3, "reference": 0}
    try:
        await store.enqueue([("rg:chain_sum", 1, 1, "reference", 2), ("rg:chain_sum", 2, 1, "torch:tiny", 2),
                             ("py-func", 3, 1, "torch:tiny", 2), ("rg:chain_sum", 4, 1, "torch:tiny?temperature=0", 2),
                             ("rg:chain_sum", 5, 1, "torch:tiny", 2)])
        # The last group was leased (and ran) at an old version of its line: two versions of "tiny" came out since.
        jobs = await store.lease("w", 8, 60, lambda agent: versions[agent])
        jobs += await store.lease("w", 2, 60, lambda agent: 1)
        await store.complete([("w", replace(t(j.id, j.group_id, j.policy_version), agent=j.agent, env=j.env,
                                            seed=j.seed)) for j in jobs])
        lines = {"tiny": [1, 2, 3], "other": [4, 5, 6, 7]}

        def behind(line: str | None, version: int) -> int:
            return sum(v > version for v in (lines[line] if line else [v for vs in lines.values() for v in vs]))

        delivery = Delivery(store, behind, line_for=lambda spec: "tiny" if spec.startswith("torch:tiny") else None)
        mine = Subscription(agent="torch:tiny", envs=("rg:chain_sum",))
        stream = delivery.batches("trainer", whole_groups=True, batch_size=2, max_staleness=1, view="summary",
                                  subscription=mine)
        first = await anext(stream)
        assert {(x.agent, x.env, x.policy_version) for x in first.trajectories} == {("torch:tiny", "rg:chain_sum", 3)}
        assert len(first.trajectories) == 2, "whole groups, of its own agent and environment only"
        assert await delivery.backlog() == 2, "others' trajectories are nothing it waits for"
        second = await anext(stream)
        assert second.trajectories == [], "two versions of its own line behind: stale (other lines do not count)"
        assert await delivery.backlog() == 0
        assert await delivery.ack("trainer", second.up_to, whole_groups=True) == second.up_to
        await stream.aclose()

        # A consumer that keeps stale ones sees how far behind its last batch was (the console plots it).
        keeps = delivery.batches("watcher", whole_groups=True, batch_size=2, max_staleness=0, view="summary",
                                 subscription=mine)
        for behind_by in (0.0, 2.0):
            await anext(keeps)
            (watcher,) = [c for c in await delivery.status() if c.name == "watcher"]
            assert watcher.staleness == behind_by
        await keeps.aclose()
    finally:
        await store.close()
