"""The coordinator's node registry over a real store and scheduler: who may join, how much each node is
leased, what happens to a node that falls silent, and that a late result is stored at most once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farmd.errors import BadRequest, Conflict, FailedPrecondition
from farmd.records import Job, Trajectory
from farmd.scheduler import Scheduler, SchedulerConfig
from farmd.scheduler.nodes import Hello, IsolationCheck, Nodes
from farmd.store import Store

LEVELS = {"rg:chain_sum": 5}
OK = (IsolationCheck(name="bwrap", ok=True, detail=""),)


def hello(name: str, capacity: int = 2, isolation: tuple[IsolationCheck, ...] = OK) -> Hello:
    return Hello(name=name, owner=f"{name}:1:aa", capacity=capacity, version="0", address="ipv4:10.0.0.2:1",
                 isolation=isolation)


def result(job: Job) -> Trajectory:
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=0, reward=1.0, passed=True, status="ok", reasons=[],
                      flags=[], verifier_version="1", steps=[], final="x", node="n1")


@pytest.fixture
async def fleet(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = await Store.open(tmp_path / "farm.db")
    scheduler = await Scheduler.open(store, LEVELS, SchedulerConfig(lease_s=30, group_size=4))
    yield scheduler, Nodes(scheduler, lost_after_s=0.3, local="coordinator")
    await scheduler.stop()
    await store.close()


async def test_who_may_join(fleet) -> None:  # type: ignore[no-untyped-def]
    _scheduler, nodes = fleet
    nodes.join(hello("a"))
    with pytest.raises(Conflict, match="connected already"):
        nodes.join(hello("a"))
    with pytest.raises(Conflict, match="coordinator's own"):
        nodes.join(hello("coordinator"))
    with pytest.raises(BadRequest):
        nodes.join(hello("a:b"))
    with pytest.raises(BadRequest):
        nodes.join(hello("b", capacity=0))
    with pytest.raises(FailedPrecondition, match="cannot isolate") as refused:
        nodes.join(hello("c", isolation=(IsolationCheck(name="seccomp", ok=False, detail="none", fix="x"),)))
    assert refused.value.reason == "NODE_CANNOT_ISOLATE"
    node = nodes._nodes["a"]
    nodes.leave(node)
    assert nodes.join(hello("a")) is not node, "a node whose stream ended may rejoin"


async def test_a_node_is_never_leased_more_than_its_capacity(fleet) -> None:  # type: ignore[no-untyped-def]
    scheduler, nodes = fleet
    await scheduler.submit("rg:chain_sum", "reference", 8)
    small = nodes.join(hello("small", capacity=2))
    assert len(await nodes.lease(small, 8)) == 2
    assert await nodes.lease(small, 8) == [], "full"
    big = nodes.join(hello("big", capacity=8))
    leased = await nodes.lease(big, 8)
    assert len(leased) == 6, "one group's jobs go to whoever has room: a slow node holds back only its own"
    assert await nodes.complete(big, [("big:1:aa", result(leased[0]))]) == [leased[0].id]
    assert len(await nodes.lease(big, 8)) == 0, "nothing left to lease"
    assert await nodes.complete(big, [("small:1:aa", result(leased[1]))]) == [], "never for another node's owner"


async def test_a_silent_node_is_lost_its_leases_go_elsewhere_and_its_late_results_are_not_stored(fleet  # type: ignore[no-untyped-def]
                                                                                                ) -> None:
    scheduler, nodes = fleet
    await scheduler.submit("rg:chain_sum", "reference", 4)
    slow = nodes.join(hello("slow", capacity=4))
    held = await nodes.lease(slow, 4)
    other = nodes.join(hello("other", capacity=4))
    await asyncio.sleep(0.4)
    await nodes.heartbeat(other, [], ())
    assert await nodes.mark_lost() == ["slow"]
    assert (await nodes.status())[1].state == "lost"
    again = await nodes.lease(other, 4)
    assert sorted(j.id for j in again) == sorted(j.id for j in held), "requeued at once, not at lease expiry"
    assert await nodes.complete(slow, [("slow:1:aa", result(j)) for j in held]) == [], "a late result"
    assert await nodes.complete(other, [("other:1:aa", result(j)) for j in again]) == [j.id for j in again]
    assert await nodes.complete(slow, [("slow:1:aa", result(j)) for j in held]) == [], "still at most once"
    rows = {r.name: r for r in await nodes.status()}
    assert (rows["slow"].state, rows["other"].done, rows["slow"].done) == ("connected", 4, 0), \
        "it spoke again: it is back"


async def test_an_idle_nodes_lease_waits_for_work_and_wakes_as_soon_as_it_is_queued(fleet) -> None:  # type: ignore[no-untyped-def]
    scheduler, nodes = fleet
    node = nodes.join(hello("idle", capacity=2))
    started = asyncio.get_running_loop().time()
    assert await nodes.lease(node, 2, wait_s=0.2) == []
    assert asyncio.get_running_loop().time() - started >= 0.2, "nothing queued: it waited before answering"
    waiting = asyncio.create_task(nodes.lease(node, 2, wait_s=5.0))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    queued_at = asyncio.get_running_loop().time()
    await scheduler.submit("rg:chain_sum", "reference", 2)
    jobs = await asyncio.wait_for(waiting, 2.0)
    assert len(jobs) == 2 and asyncio.get_running_loop().time() - queued_at < 1.0


async def test_a_lease_for_slots_whose_results_are_on_their_way_waits_for_them(fleet) -> None:  # type: ignore[no-untyped-def]
    scheduler, nodes = fleet
    await scheduler.submit("rg:chain_sum", "reference", 8)
    node = nodes.join(hello("n", capacity=2))
    held = await nodes.lease(node, 2)
    asking = asyncio.get_running_loop().create_task(nodes.lease(node, 2, wait_s=1.0))
    await asyncio.sleep(0.1)
    assert not asking.done(), "its slots are held here until their results come: it waits, not comes back empty"
    assert await nodes.complete(node, [(node.hello.owner, result(held[0]))]) == [held[0].id]
    got = await asyncio.wait_for(asking, 1.0)
    assert len(got) == 1, "the slot its result freed, at once"
    assert await nodes.lease(node, 2, wait_s=0.2) == [], "a node that is full and asks anyway waits its wait out"
