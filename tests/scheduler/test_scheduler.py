"""The scheduler against a real store: groups, leases, retries, recovery, demand, and a bank that survives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farmd.records import JobState, Trajectory
from farmd.scheduler import PolicyChunk, Scheduler, SchedulerConfig
from farmd.store import Store
from farmd.taskbank import TaskKey

LEVELS = {"rg:chain_sum": 5, "py-func": 5}


def scored(job, reward: float = 1.0) -> Trajectory:  # type: ignore[no-untyped-def]
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=job.policy_version, reward=reward,
                      passed=reward > 0, status="ok", reasons=[], flags=[], verifier_version="1", steps=[], final="x",
                      node="n1")


async def test_submit_splits_rollouts_into_groups_at_bank_chosen_tasks(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=4)
    groups, jobs = await s.submit("rg:chain_sum", "reference", 10)
    assert jobs == 10 and len(groups) == 3
    leased = await s.lease("w", 100)
    sizes: dict[int, int] = {}
    for job in leased:
        sizes[job.group_id] = sizes.get(job.group_id, 0) + 1
    assert sorted(sizes.values()) == [2, 4, 4]
    by_group = {j.group_id: (j.seed, j.difficulty) for j in leased}
    assert all((j.seed, j.difficulty) == by_group[j.group_id] for j in leased), "a group is n attempts at one task"
    assert len(set(by_group.values())) == 3, "each group gets its own task"


async def test_jobs_carry_the_version_of_their_own_policy_line_at_lease_time(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1)
    tiny = await s.policies.publish(_chunks(b"tiny-1", "tiny"))
    await s.policies.publish(_chunks(b"other-1", "other"))
    await s.submit("rg:chain_sum", "torch:tiny", 2)
    await s.submit("rg:chain_sum", "reference", 1)
    first = await s.lease("w", 1)
    tiny2 = await s.policies.publish(_chunks(b"tiny-2", "tiny"))
    await s.policies.publish(_chunks(b"other-2", "other"))
    second, control = await s.lease("w", 2)
    assert (first[0].policy_version, second.policy_version) == (tiny.version, tiny2.version)
    assert control.agent == "reference" and control.policy_version == 0, "a scripted agent runs no farm policy"
    assert s.policy_version == 4, "the farm's newest version, of any line"
    assert (s.policies.behind("tiny", tiny.version), s.policies.behind("tiny", tiny2.version)) == (1, 0)
    assert s.policies.behind(None, tiny.version) == 3, "no line: every version since counts"
    assert await s.policies.sha256_of(tiny.version) == tiny.sha256
    assert await s.policies.content(tiny.sha256) == b"tiny-1"
    again = await s.policies.publish(_chunks(b"tiny-1", "tiny"))  # a trainer resumed from its checkpoint
    assert again.version == tiny.version and s.policies.latest("tiny") == tiny.version
    assert (s.policies.behind("tiny", tiny.version), s.policies.behind("tiny", tiny2.version)) == (0, 1)
    reopened = await open_(group_size=1)
    assert reopened.policies.latest("tiny") == tiny.version, "lines are read back from the store"
    assert reopened.policies.behind("tiny", tiny2.version) == 1
    s.set_policy_version(3)  # versions never go backwards
    assert s.policy_version == 4


async def _chunks(data: bytes, name: str):  # type: ignore[no-untyped-def]
    yield PolicyChunk(sha256="", uri="", data=data, name=name)


async def test_completion_is_once_even_when_reported_twice(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(group_size=2)
    await s.submit("rg:chain_sum", "reference", 2)
    jobs = await s.lease("w", 2)
    assert await s.complete("w", [scored(j) for j in jobs]) == [j.id for j in jobs]
    assert await s.complete("w", [scored(j) for j in jobs]) == []
    assert await s.complete("someone-else", [scored(jobs[0])]) == []
    assert len(await store.trajectories(limit=10)) == 2


async def test_infrastructure_failures_retry_then_fail_apart_from_scores(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(group_size=1, max_attempts=3, retry_backoff_s=0)
    await s.submit("rg:chain_sum", "reference", 1)
    states = []
    for _ in range(3):
        [job] = await s.lease("w", 1)
        states.append(await s.fail("w", job.id, "endpoint down"))
    assert states == [JobState.QUEUED, JobState.QUEUED, JobState.FAILED]
    assert await s.lease("w", 1) == []
    assert await store.trajectories(limit=10) == [], "a failure is never a trajectory, so never a reward of 0"
    failures = await store.failures()
    assert len(failures) == 3 and all("endpoint down" in f.error for f in failures)
    assert (await s.status()).pulse.queue.failed == 1


async def test_a_transient_failure_waits_out_a_growing_jittered_backoff(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1, max_attempts=3, retry_backoff_s=0.3, retry_backoff_max_s=0.5)
    waits = [s.backoff_s(attempts) for attempts in (1, 2, 3, 9) for _ in range(50)]
    assert all(0.15 <= w <= 0.3 for w in waits[:50]) and all(0.25 <= w <= 0.5 for w in waits[50:])
    assert len(set(waits[:50])) > 1, "jittered: jobs one outage failed together come back apart"
    await s.submit("rg:chain_sum", "reference", 1)
    [job] = await s.lease("w", 1)
    woken: list[float] = []
    s.on_work.append(lambda: woken.append(asyncio.get_running_loop().time()))
    failed_at = asyncio.get_running_loop().time()
    assert await s.fail("w", job.id, "endpoint 503", transient=True) is JobState.QUEUED
    assert await s.lease("w", 1) == [], "not leased again before its backoff has passed"
    await asyncio.sleep(0.35)
    # Idle workers sleep until told of work: they are told once the backoff has passed, not left to a poll.
    assert len(woken) == 1 and 0.15 - 0.01 <= woken[0] - failed_at <= 0.3 + 0.05
    [again] = await s.lease("w", 1)
    assert again.id == job.id and again.attempts == 2
    assert s.counters["retried"] == 1


async def test_a_permanent_failure_fails_at_once_apart_from_scores(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(group_size=1, max_attempts=3, retry_backoff_s=0)
    await s.submit("rg:chain_sum", "reference", 1)
    [job] = await s.lease("w", 1)
    error = "InfraFailure: the agent's endpoint failed: http://model/v1: 400 bad request; not retried"
    assert await s.fail("w", job.id, error, transient=False) is JobState.FAILED
    assert await s.lease("w", 1) == [], "first attempt, but trying again cannot help"
    [failure] = await store.failures()
    assert failure.final and "400 bad request" in failure.error
    assert await store.trajectories(limit=10) == [], "never a score"
    assert (s.counters["failed"], s.counters["retried"]) == (1, 0)
    assert await s.fail("w", job.id, error, transient=False) is None, "no longer its lease"


async def test_expired_leases_go_back_to_the_queue(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1, lease_s=0.05, maintenance_every_s=0.05)
    await s.start()
    await s.submit("rg:chain_sum", "reference", 1)
    [job] = await s.lease("dead-worker", 1)
    await asyncio.sleep(0.4)
    [again] = await s.lease("live-worker", 1)
    assert again.id == job.id and again.attempts == 2
    assert await s.complete("dead-worker", [scored(job)]) == [], "the old owner lost it"
    assert await s.complete("live-worker", [scored(again)]) == [again.id]


async def test_queued_and_requeued_work_wakes_the_in_process_worker_at_once(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1, lease_s=0.05, maintenance_every_s=0.05)
    woken: list[int] = []
    s.on_work.append(lambda: woken.append(len(woken)))
    await s.submit("rg:chain_sum", "reference", 1)
    assert woken, "a submitted run wakes the worker that leases in-process"
    [job] = await s.lease("dead-worker", 1)
    woken.clear()
    await s.start()
    for _ in range(100):  # the expired lease is requeued by upkeep
        if woken:
            break
        await asyncio.sleep(0.02)
    assert woken, "a requeued job wakes it too"
    assert (await s.lease("live-worker", 1))[0].id == job.id


async def test_a_restarted_node_requeues_what_its_last_incarnation_held(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1, max_attempts=2)
    await s.submit("rg:chain_sum", "reference", 3)
    await s.lease("node-a:100:1", 1)
    await s.lease("node-b:200:1", 1)
    assert await s.recover("node-a", "node-a:101:1") == 1
    assert await s.recover("node-a", "node-a:101:1") == 0
    # node-b's lease is another node's business; node-a's job is queued again, attempt counted
    jobs = await s.lease("node-a:101:1", 10)
    assert len(jobs) == 2 and max(j.attempts for j in jobs) == 2
    await s.recover("node-a", "node-a:102:1")  # it died again holding the job: out of attempts
    assert (await s.status()).pulse.queue.failed == 1


async def test_demand_follows_open_streams_and_stays_bounded(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(group_size=4, demand_buffer=20, demand_agent="reference", demand_envs=("rg:chain_sum",),
                    maintenance_every_s=0.05)
    await s.start()
    await asyncio.sleep(0.3)
    assert (await store.job_counts()).get("queued", 0) == 0, "no trainer streaming: no demand"
    stream = s.delivery.batches("trainer", whole_groups=False, batch_size=8, max_staleness=0, view="summary")
    reading = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.4)
    queued = (await store.job_counts()).get("queued", 0)
    assert 17 <= queued <= 20, queued
    await asyncio.sleep(0.3)
    assert (await store.job_counts()).get("queued", 0) == queued, "the buffer is full: no more"
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    await stream.aclose()


@pytest.mark.parametrize("lag", [0, 1])
async def test_demand_per_version_queues_lag_batches_ahead_and_one_more_per_version(farm, lag: int) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    # A long period: only a publish can wake upkeep within the test, so what is queued at once is its doing.
    s = await open_(group_size=4, demand_buffer=100, demand_per_version=8, demand_lag=lag, demand_agent="torch:tiny",
                    demand_envs=("rg:chain_sum",), maintenance_every_s=30)
    await s.start()
    stream = s.delivery.batches("trainer", whole_groups=False, batch_size=8, max_staleness=0, view="summary")
    reading = asyncio.create_task(anext(stream))
    try:
        await asyncio.sleep(0.2)  # the stream is open before the first version
        first = await s.policies.publish(_chunks(b"tiny-1", "tiny"))
        # Lag 1: the batch to learn from and the one sampled meanwhile; lag 0: the one to learn from.
        assert await _queued_within(store, 8 * (lag + 1)) == 8 * (lag + 1)
        assert {j.policy_version for j in await s.lease("w", 100)} == {first.version}
        await asyncio.sleep(0.3)
        assert (await store.job_counts()).get("queued", 0) == 0, "no more until a new version"
        second = await s.policies.publish(_chunks(b"tiny-2", "tiny"))
        assert await _queued_within(store, 8) == 8, "one batch more for the new version, not two"
        assert {j.policy_version for j in await s.lease("w", 100)} == {second.version}
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await stream.aclose()


async def _queued_within(store: Store, n: int, timeout_s: float = 2.0) -> int:
    """How many jobs are queued once ``n`` are (a publish wakes demand at once, not at the next period)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (queued := (await store.job_counts()).get("queued", 0)) < n:
        assert loop.time() < deadline, f"{queued} of {n} jobs queued after {timeout_s} s"
        await asyncio.sleep(0.02)
    return queued


async def test_the_task_bank_survives_a_restart(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=4)
    await s.submit("rg:chain_sum", "skilled:3", 8)  # a policy: the reference control teaches the bank nothing
    jobs = await s.lease("w", 8)
    await s.complete("w", [scored(j, reward=float(i % 2)) for i, j in enumerate(jobs)])
    await s.stop()
    before = s.bank.status()
    again = await open_()
    assert again.bank.status() == before
    assert before.envs["rg:chain_sum"].groups == 2, before


async def test_a_stream_never_misses_a_wake_up(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1)
    await s.submit("rg:chain_sum", "reference", 2)
    jobs = await s.lease("w", 2)
    seen = s.delivery.generation
    await s.complete("w", [scored(jobs[0])])  # stored between a stream's read and its wait
    t0 = asyncio.get_running_loop().time()
    await s.delivery.wait_for_more(seen, 5)
    assert asyncio.get_running_loop().time() - t0 < 0.5, "the commit it had not seen wakes it at once"

    seen = s.delivery.generation
    waiters = [asyncio.create_task(s.delivery.wait_for_more(seen, 5)) for _ in range(3)]
    await asyncio.sleep(0.05)
    await s.complete("w", [scored(jobs[1])])
    done, _ = await asyncio.wait(waiters, timeout=0.5)
    assert len(done) == 3, "one commit wakes every waiting stream"


async def test_a_trainer_resumed_from_a_checkpoint_finds_its_older_trajectories_no_staler(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(group_size=1)
    v = [(await s.policies.publish(_chunks(f"tiny-{i}".encode(), "tiny"))).version for i in range(5)]
    assert [s.policies.behind("tiny", x) for x in v] == [4, 3, 2, 1, 0]
    await s.policies.publish(_chunks(b"tiny-2", "tiny"))  # the checkpoint held the third version
    assert [s.policies.behind("tiny", x) for x in v] == [2, 1, 0, 1, 2], "the crashed run's last two are a branch"
    after = (await s.policies.publish(_chunks(b"tiny-5", "tiny"))).version
    assert [s.policies.behind("tiny", x) for x in (*v, after)] == [3, 2, 1, 0, 1, 0]
    reopened = await open_(group_size=1)
    assert [reopened.policies.behind("tiny", x) for x in (*v, after)] == [3, 2, 1, 0, 1, 0]


async def test_a_later_verdict_moves_the_task_banks_counts_of_the_task_it_counted(farm) -> None:  # type: ignore[no-untyped-def]
    """The bank counted a group by the verdicts it had; a rescore that turns a pass into a fail moves that pass to a
    fail, a withdrawal takes it back, and a group finished after a rescore is counted by its current verdict, once."""
    store, open_ = farm
    s = await open_(group_size=4)
    await s.submit("rg:chain_sum", "skilled:3", 4)
    jobs = sorted(await s.lease("w", 4), key=lambda j: j.id)
    await s.complete("w", [scored(j, reward=1.0) for j in jobs])
    await s._observe_finished()
    key = TaskKey("rg:chain_sum", jobs[0].seed, jobs[0].difficulty)
    start = s.bank.posterior(key)
    assert start is not None and (start.alpha, start.beta) == (5.0, 1.0), "four passes on a uniform prior"

    # A newer verifier finds two of the passes were not: two passes become fails.
    await store.add_scores([(j.id, "2", 0.0, False, "ok", ["stricter"], []) for j in jobs[:2]])
    await s._observe_finished()
    moved = s.bank.posterior(key)
    assert moved is not None and (moved.alpha, moved.beta) == (3.0, 3.0)
    # One more is withdrawn (its node lied): its fail is taken back, not counted again as one.
    async with store.db.write() as db:
        await db.execute("UPDATE trajectories SET verified_by='node:liar', node='liar' WHERE id=?", (jobs[0].id,))
    await store.nodes.quarantine("liar", "it lied")
    await s._observe_finished()
    taken = s.bank.posterior(key)
    assert taken is not None and (taken.alpha, taken.beta) == (3.0, 2.0)
    await s._observe_finished()
    assert s.bank.posterior(key) == taken, "each change moves the counts once"

    # A group rescored before the bank read it is counted as it is now, and never moved again for that.
    await s.submit("rg:chain_sum", "skilled:3", 4)
    later = sorted(await s.lease("w", 4), key=lambda j: j.id)
    await s.complete("w", [scored(j, reward=1.0) for j in later])
    await store.add_scores([(later[0].id, "2", 0.0, False, "ok", [], [])])
    await s._observe_finished()
    other = s.bank.posterior(TaskKey("rg:chain_sum", later[0].seed, later[0].difficulty))
    if later[0].seed == jobs[0].seed:  # the bank handed the same task out again
        assert other is not None and (other.alpha, other.beta) == (6.0, 3.0)
    else:
        assert other is not None and (other.alpha, other.beta) == (4.0, 2.0)

    # Kept across a restart: the mark the counts hold goes with the bank's state.
    await s.stop()
    kept = s.bank.posterior(key)
    again = await open_(group_size=4)
    await again._observe_finished()
    assert again.bank.posterior(key) == kept


async def test_one_rule_says_which_agents_wait_for_their_lines_first_policy(tmp_path: Path) -> None:
    # CreateRun's refusal and demand's wait are this one method: a torch line nobody published to has nothing
    # to load; an endpoint that serves a line answers with what it serves until then.
    store = await Store.open(tmp_path / "farm.db")
    s = await Scheduler.open(store, LEVELS, SchedulerConfig(group_size=1), endpoint_lines={"vllm": "tiny"})
    try:
        assert s.policies.unpublished("torch:tiny") == "tiny"
        assert s.policies.unpublished("torch:tiny?temperature=0") == "tiny"
        for runs_now in ("openai:m@vllm", "openai:m@other", "reference", "skilled:3", "torch:/a/path"):
            assert s.policies.unpublished(runs_now) is None, runs_now
        await s.policies.publish(_chunks(b"tiny-1", "tiny"))
        assert s.policies.unpublished("torch:tiny") is None
        assert s.policies.unpublished("torch:other") == "other"
    finally:
        await s.stop()
        await store.close()


async def test_demand_waits_for_the_first_policy_of_its_torch_line(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(group_size=4, demand_buffer=8, demand_agent="torch:tiny", demand_envs=("rg:chain_sum",),
                    maintenance_every_s=0.05)
    await s.start()
    stream = s.delivery.batches("trainer", whole_groups=False, batch_size=8, max_staleness=0, view="summary")
    reading = asyncio.create_task(anext(stream))
    try:
        await asyncio.sleep(0.4)
        assert (await store.job_counts()).get("queued", 0) == 0, "nothing to load: no demand yet"
        await s.policies.publish(_chunks(b"tiny-1", "tiny"))
        await asyncio.sleep(0.4)
        assert (await store.job_counts()).get("queued", 0) >= 4
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await stream.aclose()
