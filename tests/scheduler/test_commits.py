"""Many workers' reports and lease requests at once, over a real store: they share transactions (group commit),
and each caller is told exactly what it would have been told alone."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from farmd.records import Job, Trajectory
from farmd.scheduler import Scheduler, SchedulerConfig
from farmd.store import Store

LEVELS = {"rg:chain_sum": 5}


def result(job: Job, **changed: object) -> Trajectory:
    fields: dict[str, object] = dict(
        id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed, difficulty=job.difficulty,
        agent=job.agent, policy_version=0, reward=1.0, passed=True, status="ok", reasons=[], flags=[],
        verifier_version="1", steps=[], final="x", node="n")
    fields.update(changed)
    return Trajectory(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def scheduler(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = await Store.open(tmp_path / "farm.db")
    scheduler = await Scheduler.open(store, LEVELS, SchedulerConfig(lease_s=30, group_size=4))
    yield scheduler
    await scheduler.stop()
    await store.close()


async def test_reports_that_arrive_together_share_a_transaction_and_each_hears_of_its_own(scheduler) -> None:  # type: ignore[no-untyped-def]
    await scheduler.submit("rg:chain_sum", "reference", 64)
    owners = [f"n{i}:1:aa" for i in range(16)]
    held = {owner: await scheduler.lease(owner, 4) for owner in owners}
    before = scheduler.commits.batches
    reports = []
    for i, owner in enumerate(owners):
        jobs = held[owner]
        items = [(owner, result(jobs[0])), (owner, result(jobs[1]))]
        if i == 3:  # a record that is not its lease's: refused, for this reporter alone
            items.append((owner, result(jobs[2], seed=jobs[2].seed + 1)))
        if i == 5:  # another owner's lease: never stored for this one, and nothing said of it
            items.append((owner, result(held[owners[6]][3])))
        reports.append(scheduler.complete_for(items, refuse_mismatch=True))
    done = await asyncio.gather(*reports)
    assert scheduler.commits.batches - before < len(owners), "reports that waited went together"
    for i, (owner, completion) in enumerate(zip(owners, done, strict=True)):
        jobs = held[owner]
        assert completion.stored == sorted([jobs[0].id, jobs[1].id]), owner
        assert list(completion.refused) == ([jobs[2].id] if i == 3 else []), owner
    assert (await scheduler.store.trajectory(held[owners[6]][3].id)) is None
    assert scheduler.counters["completed"] == 2 * len(owners)


async def test_one_job_reported_twice_at_once_is_stored_once(scheduler) -> None:  # type: ignore[no-untyped-def]
    await scheduler.submit("rg:chain_sum", "reference", 4)
    jobs = await scheduler.lease("n1:1:aa", 4)
    first, second = await asyncio.gather(
        scheduler.complete_for([("n1:1:aa", result(jobs[0])), ("n1:1:aa", result(jobs[1]))], refuse_mismatch=True),
        scheduler.complete_for([("n1:1:aa", result(jobs[1])), ("n1:1:aa", result(jobs[2]))], refuse_mismatch=True))
    assert first.stored == sorted([jobs[0].id, jobs[1].id])
    assert second.stored == [jobs[2].id], "the second report of a job finds it done, as if sent after the first"
    assert await scheduler.store.last_seq() == 3


async def test_a_failing_report_fails_alone(scheduler, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    await scheduler.submit("rg:chain_sum", "reference", 8)
    good, bad = await scheduler.lease("n1:1:aa", 4), await scheduler.lease("n2:1:aa", 4)
    real = scheduler.store.complete_leases

    async def complete_leases(items: list[tuple[str, Trajectory]], **kw: object) -> object:
        if any(t.final == "boom" for _, t in items):
            raise RuntimeError("a record the store cannot take")
        return await real(items, **kw)

    monkeypatch.setattr(scheduler.store, "complete_leases", complete_leases)
    outcomes = await asyncio.gather(
        scheduler.complete_for([("n1:1:aa", result(good[0]))], refuse_mismatch=True),
        scheduler.complete_for([("n2:1:aa", dataclasses.replace(result(bad[0]), final="boom"))],
                               refuse_mismatch=True),
        scheduler.complete_for([("n1:1:aa", result(good[1]))], refuse_mismatch=True),
        return_exceptions=True)
    assert [o.stored for o in (outcomes[0], outcomes[2])] == [[good[0].id], [good[1].id]]  # type: ignore[union-attr]
    assert isinstance(outcomes[1], RuntimeError)


async def test_lease_requests_that_arrive_together_share_a_transaction(scheduler) -> None:  # type: ignore[no-untyped-def]
    await scheduler.submit("rg:chain_sum", "reference", 44)
    before = scheduler.leases.batches
    leased = await asyncio.gather(*(scheduler.lease(f"n{i}:1:aa", 4) for i in range(10)))
    assert scheduler.leases.batches - before < 10, "asks that waited went together"
    assert [len(got) for got in leased] == [4] * 10
    assert len({j.id for got in leased for j in got}) == 40, "no job leased twice"
    for i, got in enumerate(leased):
        assert all(j.lease_owner == f"n{i}:1:aa" for j in got)
    bad, good = await asyncio.gather(scheduler.lease("bad:1:aa", 4, endpoint="no such*name"),
                                     scheduler.lease("n0:1:aa", 8), return_exceptions=True)
    assert isinstance(bad, ValueError), "an ask naming no endpoint fails, alone"
    assert len(good) == 4, "the rest of the queue, for the ask beside it"  # type: ignore[arg-type]


async def test_while_reports_come_together_the_next_batch_waits_for_more(scheduler) -> None:  # type: ignore[no-untyped-def]
    """A batch of more than one report says reports are arriving faster than transactions are written: the next
    waits ``linger_s`` first (at most ``LINGER_SHARE`` of a rollout's time: these took 200 s), and what arrives
    meanwhile shares its transaction."""
    await scheduler.submit("rg:chain_sum", "reference", 16)
    jobs = await scheduler.lease("n1:1:aa", 16)
    report = [[("n1:1:aa", result(job, started_at=time.time() - 200.0))] for job in jobs]
    scheduler.commits.linger_s = 0.5
    before = scheduler.commits.batches
    await asyncio.gather(*(scheduler.complete_for(r, refuse_mismatch=True) for r in report[:8]))  # a busy farm
    assert scheduler.commits.batches - before < 8, "reports that came together were written together"
    before = scheduler.commits.batches
    first = asyncio.ensure_future(scheduler.complete_for(report[8], refuse_mismatch=True))
    await asyncio.sleep(0.1)  # well inside the wait, and far longer than a transaction takes
    second = scheduler.complete_for(report[9], refuse_mismatch=True)
    assert [c.stored for c in await asyncio.gather(first, second)] == [[jobs[8].id], [jobs[9].id]]
    assert scheduler.commits.batches - before == 1, "the report that came during the wait went with the first"


async def test_a_lone_report_on_a_quiet_farm_is_written_at_once(scheduler) -> None:  # type: ignore[no-untyped-def]
    await scheduler.submit("rg:chain_sum", "reference", 4)
    jobs = await scheduler.lease("n1:1:aa", 4)
    scheduler.commits.linger_s = 30.0  # a wait would be seen
    done = await asyncio.wait_for(scheduler.complete_for(
        [("n1:1:aa", result(jobs[0], started_at=time.time() - 1e4))], refuse_mismatch=True), 10)
    assert done.stored == [jobs[0].id]
    done = await asyncio.wait_for(scheduler.complete_for(
        [("n1:1:aa", result(jobs[1], started_at=time.time() - 1e4))], refuse_mismatch=True), 10)
    assert done.stored == [jobs[1].id], "one report after another, never more at once: no wait"


async def test_a_busy_farm_of_short_rollouts_waits_no_more_than_their_share(scheduler) -> None:  # type: ignore[no-untyped-def]
    """A node's next jobs come in the reply to its results: where rollouts are short, a long wait would leave its
    slots idle, so the wait is at most ``LINGER_SHARE`` of a rollout's time."""
    await scheduler.submit("rg:chain_sum", "reference", 12)
    jobs = await scheduler.lease("n1:1:aa", 12)
    report = [[("n1:1:aa", result(job, started_at=time.time() - 0.01))] for job in jobs]
    scheduler.commits.linger_s = 30.0  # a wait would be seen
    before = scheduler.commits.batches
    await asyncio.gather(*(scheduler.complete_for(r, refuse_mismatch=True) for r in report[:8]))
    assert scheduler.commits.batches - before < 8, "a busy farm"
    done = await asyncio.wait_for(scheduler.complete_for(report[8], refuse_mismatch=True), 10)
    assert done.stored == [jobs[8].id]
