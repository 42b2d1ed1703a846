"""The store: a real SQLite file, reopened, raced and failed on purpose."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from farmd.errors import CursorError
from farmd.records import JobState, Step, Trajectory
from farmd.store import PassRate, Store, StoreError
from farmd.store.jobs import LeaseAsk
from farmd.store.schema import MIGRATIONS
from tests.store.plans import traced_store, whole_walks


def traj(job_id: int, group_id: int = 1, reward: float = 1.0, status: str = "ok") -> Trajectory:
    return Trajectory(id=job_id, group_id=group_id, env="py-func", env_version="1", seed=1, difficulty=2,
                      agent="reference", policy_version=0, reward=reward, passed=reward > 0, status=status,
                      reasons=["r"], flags=[], verifier_version="1",
                      steps=[Step(action="def transform(x): ...")], final="src", node="n1")


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await Store.open(tmp_path / "farm.db")
    yield s
    await s.close()


@pytest.mark.sqlite_only
async def test_schema_is_migrated_once_and_refuses_the_future(tmp_path: Path) -> None:
    path = tmp_path / "farm.db"
    s = await Store.open(path)
    await s.close()
    s = await Store.open(path)  # idempotent
    await s.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version={len(MIGRATIONS) + 1}")
    con.commit()
    with pytest.raises(StoreError, match="schema version"):
        await Store.open(path)


async def test_lease_complete_once(store: Store) -> None:
    (group,) = await store.enqueue([("py-func", 1, 2, "reference", 3)])
    jobs = await store.lease("w1", 10, 30, policy_version=4)
    assert [j.group_id for j in jobs] == [group] * 3 and all(j.policy_version == 4 for j in jobs)
    assert all(j.state is JobState.LEASED and j.attempts == 1 for j in jobs)
    assert await store.lease("w2", 10, 30, 4) == []
    stored = await store.complete([("w1", traj(jobs[0].id, group)), ("w1", traj(jobs[0].id, group))])
    assert stored == [jobs[0].id]  # the same job twice in one batch: stored once
    assert await store.complete([("w1", traj(jobs[0].id, group))]) == []  # and never again
    assert await store.complete([("w2", traj(jobs[1].id, group))]) == []  # not w2's lease
    rows = await store.trajectories()
    assert [t.id for t in rows] == [jobs[0].id] and rows[0].seq == 1
    got = await store.trajectory(jobs[0].id)
    assert got is not None and got.steps == traj(0).steps and got.final == "src" and got.node == "n1"


async def out_of_attempts(store: Store, max_attempts: int) -> dict[int, bool]:
    """The decision the scheduler makes for expired leases (the store only carries it out)."""
    return {job_id: attempts >= max_attempts for job_id, attempts in (await store.expired_leases()).items()}


async def test_expired_leases_come_back_and_fail_for_good(store: Store) -> None:
    await store.enqueue([("py-func", 1, 1, "reference", 1)])
    (job,) = await store.lease("w1", 1, lease_s=0.01, policy_version=0)
    await asyncio.sleep(0.03)
    assert await store.requeue_expired(await out_of_attempts(store, max_attempts=2)) == (1, 0)
    (again,) = await store.lease("w2", 1, lease_s=0.01, policy_version=0)
    assert again.id == job.id and again.attempts == 2
    await asyncio.sleep(0.03)
    assert await store.requeue_expired(await out_of_attempts(store, max_attempts=2)) == (0, 1)
    assert (await store.job_counts()) == {"failed": 1}
    failures = await store.failures()
    assert failures and failures[0].final and "lease expired" in failures[0].error
    assert await store.trajectories() == []  # an infrastructure failure is never a trajectory, nor a score


async def test_failures_are_retried_then_recorded_apart(store: Store) -> None:
    await store.enqueue([("py-func", 1, 1, "reference", 1)])
    (job,) = await store.lease("w", 1, 30, 0)
    assert await store.fail("w", job.id, "sandbox died", final=False) is JobState.QUEUED
    (job,) = await store.lease("w", 1, 30, 0)
    assert await store.fail("other", job.id, "not mine", final=False) is None
    assert await store.fail("w", job.id, "sandbox died again", final=True) is JobState.FAILED
    assert len(await store.failures()) == 2
    done = await store.finished_groups(0, 10)
    assert len(done) == 1 and done[0].rewards == []


async def test_leases_a_node_never_received_go_back_and_the_rest_stay(store: Store) -> None:
    await store.enqueue([("py-func", 1, 1, "reference", 4)])
    jobs = await store.lease("n:1:a", 3, 30, 0)
    (other,) = await store.lease("m:1:b", 1, 30, 0)
    # n joins again holding the first (and names another's job, which changes nothing of that one's).
    assert await store.requeue_unheld("n:1:a", {jobs[0].id, other.id}) == 2
    again = await store.lease("w", 10, 30, 0)
    assert sorted(j.id for j in again) == [j.id for j in jobs[1:]]
    assert all(j.attempts == 1 for j in again), "a lease never received is no attempt"
    assert await store.requeue_unheld("n:1:a", {jobs[0].id}) == 0
    assert await store.complete([("n:1:a", traj(jobs[0].id, jobs[0].group_id))]) == [jobs[0].id]
    assert await store.complete([("m:1:b", traj(other.id, other.group_id))]) == [other.id]


async def test_groups_end_in_the_order_they_finish(store: Store) -> None:
    g1, g2 = await store.enqueue([("py-func", 1, 1, "reference", 2), ("py-func", 2, 1, "reference", 1)])
    jobs = await store.lease("w", 3, 30, 0)
    by_group = {j.group_id: [] for j in jobs}
    for j in jobs:
        by_group[j.group_id].append(j)
    await store.complete([("w", traj(by_group[g1][0].id, g1, 1.0))])
    await store.complete([("w", traj(by_group[g2][0].id, g2, 0.0))])
    assert [g.id for g in await store.finished_groups(0, 10)] == [g2]  # g1 still has a job out
    await store.complete([("w", traj(by_group[g1][1].id, g1, 0.0))])
    done = await store.finished_groups(0, 10)
    assert [(g.id, g.done_seq, g.rewards) for g in done] == [(g2, 1, [0.0]), (g1, 2, [1.0, 0.0])]
    assert [g.id for g in await store.finished_groups(1, 10)] == [g1]


async def test_consumers_scores_policies_state(store: Store) -> None:
    with pytest.raises(CursorError, match="only reached 0"):
        await store.ack("trainer", "trajectories", 1)  # a cursor past the end would skip what comes next
    await store.enqueue([("py-func", 1, 1, "reference", 6)])
    jobs = await store.lease("w", 6, 30, 0)
    await store.complete([("w", traj(j.id)) for j in jobs])
    assert await store.ack("trainer", "trajectories", 5) == 5
    assert await store.ack("trainer", "trajectories", 3) == 5  # never backwards
    assert [(c.name, c.kind, c.acked) for c in await store.consumers()] == [("trainer", "trajectories", 5)]
    assert await store.ack("trainer", "groups", 1) == 1
    with pytest.raises(CursorError):
        await store.ack("trainer", "groups", 2)
    assert await store.cursor("trainer", "groups") == 1 and await store.cursor("trainer", "trajectories") == 5
    assert await store.consumed("groups", 1) == 6, "the one finished group holds all six"
    job = jobs[0]
    row = (job.id, "2", 0.0, False, "ok", ["stricter"], ["suspected_hack"])
    assert await store.add_scores([row]) == 1
    assert await store.add_scores([(job.id, "2", 1.0, True, "ok", [], [])]) == 0  # never overwritten
    # The later verdict is current (what every reader shows); the first stays in the history, as verdict 0.
    assert [(s.reward, s.verdict_version > 0) for s in await store.scores(job.id)] == [(1.0, False), (0.0, True)]
    current = await store.trajectory(job.id)
    assert current is not None and (current.reward, current.flags, current.verifier_version) == \
        (0.0, ["suspected_hack"], "2") and current.verdict_version == current.scores[-1].verdict_version
    weights = hashlib.sha256(b"weights").hexdigest()
    p1 = await store.add_policy(weights, b"weights", None)
    assert (await store.add_policy(weights, b"weights", None)).version == p1.version == 1
    p2 = await store.add_policy("b" * 64, None, "http://inference/v1")
    assert p2.version == 2 and (await store.latest_policy()) == p2
    assert [chunk async for chunk in store.policy_content(weights, 4)] == [b"weig", b"hts"]
    await store.put_state("bank", {"x": [1, 2]})
    assert await store.get_state("bank") == {"x": [1, 2]}


async def test_job_counts_are_the_farms_work_and_leave_a_nodes_canaries_out(store: Store) -> None:
    await store.enqueue([("py-func", 1, 1, "reference", 3)])
    (job,) = await store.lease("w", 1, 30, 0)
    await store.complete([("w", traj(job.id))])
    assert await store.nodes.enqueue_canary("n1", job.id, "reference", max_size=2) == (None, 3), "too big: its size"
    assert await store.nodes.cancel_canaries("n1") == 0, "and nothing made"
    assert await store.nodes.enqueue_canary("n1", job.id, "reference") is not None
    assert await store.nodes.enqueue_canary("n2", job.id, "reference", max_size=3) is not None
    assert await store.nodes.enqueue_canary("n3", 10**9, "reference") is None, "no such template"
    assert await store.job_counts() == {"done": 1, "queued": 2}, "six canaries, none of them the farm's work"
    await store.nodes.cancel_canaries("n1")
    assert await store.job_counts() == {"done": 1, "queued": 2}


async def test_job_counts_hold_still_while_canaries_come_and_go(store: Store) -> None:
    """The counts are one snapshot: read beside a node's canaries changing state, the farm's work is what it was
    (read as two, a canary cancelled between them made a count -1, and GetStatus failed)."""
    await store.enqueue([("py-func", 1, 1, "reference", 3)])
    (job,) = await store.lease("w", 1, 30, 0)
    await store.complete([("w", traj(job.id))])
    for _ in range(20):
        for _ in range(3):
            await store.nodes.enqueue_canary("n1", job.id, "reference")
        counts, _ = await asyncio.gather(store.job_counts(), store.nodes.cancel_canaries("n1"))
        assert counts == {"done": 1, "queued": 2}


async def test_everything_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "farm.db"
    s = await Store.open(path)
    await s.enqueue([("py-func", 1, 1, "reference", 4)])
    jobs = await s.lease("w", 2, 30, 0)
    await s.complete([("w", traj(jobs[0].id))])
    await s.close()
    s = await Store.open(path)
    try:
        assert await s.job_counts() == {"done": 1, "leased": 1, "queued": 2}
        assert await s.last_seq() == 1
        rates = await s.pass_rates()
        # Stored under its lease's level (1), whatever the record said (2).
        assert rates == [PassRate(env="py-func", difficulty=1, trajectories=1, passed=1, mean_reward=1.0, errors=0)]
        assert await s.finished_since(time.time() - 60) == 1
    finally:
        await s.close()


async def test_a_writer_cancelled_anywhere_leaves_no_transaction_open(store: Store) -> None:
    finished = 0
    for delay in range(60):  # cancel at every point of a write: waiting for the lock, in BEGIN, mid-way, in COMMIT
        task = asyncio.ensure_future(store.enqueue([("py-func", delay, 1, "reference", 2)]))
        for _ in range(delay % 12):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
            finished += 1
        except asyncio.CancelledError:
            pass
    await store.enqueue([("py-func", 999, 1, "reference", 1)])  # would fail: "cannot start a transaction within..."
    counts = await store.job_counts()
    # a cancelled write either committed whole (its COMMIT was already on its way) or not at all
    assert counts["queued"] % 2 == 1 and counts["queued"] >= 2 * finished + 1, counts


@pytest.mark.sqlite_only
async def test_cursors_named_like_group_cursors_are_split_by_the_migration(tmp_path: Path) -> None:
    """A farm from before cursors had kinds: "NAME#groups" rows become NAME's group cursor, and finished
    groups learn how many trajectories were finished up to them."""
    import sqlite3

    from farmd.store.schema import MIGRATIONS

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        for version, script in enumerate(MIGRATIONS[:2], 1):
            conn.executescript(f"{script}; PRAGMA user_version={version};")
        conn.executescript("""
            INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at, done_seq)
                VALUES (1, 'e', 1, 1, 'a', 2, 'request', 0, 2), (2, 'e', 2, 1, 'a', 3, 'request', 0, 1),
                       (3, 'e', 3, 1, 'a', 1, 'request', 0, NULL);
            INSERT INTO consumers(name, acked_seq, updated_at) VALUES ('grpo', 4, 0), ('grpo#groups', 1, 0),
                                                                      ('x#groups#groups', 2, 0);
        """)
        for tid, group in ((1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 3)):
            conn.execute("INSERT INTO jobs(id, group_id, env, seed, difficulty, agent, state, source, created_at, "
                         "updated_at) VALUES (?, ?, 'e', 1, 1, 'a', 'done', 'request', 0, 0)", (tid, group))
            conn.execute("INSERT INTO trajectories(id, seq, group_id, env, env_version, seed, difficulty, agent, "
                         "policy_version, reward, passed, status, reasons, flags, verifier_version, body, node, "
                         "finished_at) VALUES (?, ?, ?, 'e', '1', 1, 1, 'a', 0, 0, 0, 'ok', '[]', '[]', '1', X'00', "
                         "'n', 0)", (tid, tid, group))
    store = await Store.open(db)
    try:
        cursors = {(c.name, c.kind): c.acked for c in await store.consumers()}
        assert cursors == {("grpo", "trajectories"): 4, ("grpo", "groups"): 1, ("x#groups", "groups"): 2}
        assert [await store.consumed("groups", n) for n in (0, 1, 2)] == [0, 3, 5]
    finally:
        await store.close()


async def test_a_completed_job_is_stored_under_its_lease_never_what_its_record_says(store: Store) -> None:
    ours, theirs = await store.enqueue([("py-func", 5, 1, "reference", 2), ("kernel", 9, 3, "random", 1)])
    jobs = sorted(await store.lease("w", 3, 30, policy_version=lambda agent: 6 if agent == "reference" else 0),
                  key=lambda j: j.id)
    forged = [dataclasses.replace(traj(jobs[0].id, theirs), env="kernel", seed=9, difficulty=3, agent="random",
                                  policy_version=0, run_id=77),
              dataclasses.replace(traj(jobs[1].id, ours), seed=5, difficulty=1, policy_version=6)]
    # The farm's own worker: stored, under the lease's identity (a mismatch there is a bug, logged).
    assert await store.complete([("w", forged[0])]) == [jobs[0].id]
    got = await store.trajectory(jobs[0].id)
    assert got is not None
    assert (got.group_id, got.env, got.seed, got.difficulty, got.agent, got.policy_version, got.run_id) == (
        ours, "py-func", 5, 1, "reference", 6, 0)
    assert [t.id for t in await store.trajectories(env="kernel")] == []
    # A node's: refused, not stored, and its job back in the queue with the attempt not counted.
    done = await store.complete_leases([("w", dataclasses.replace(forged[1], agent="torch:x"))], refuse_mismatch=True)
    assert (done.stored, list(done.refused)) == ([], [jobs[1].id]) and "agent" in done.refused[jobs[1].id]
    assert await store.trajectory(jobs[1].id) is None
    (again,) = await store.lease("w2", 1, 30, 6)
    assert (again.id, again.attempts) == (jobs[1].id, 1)
    done = await store.complete_leases([("w2", forged[1])], refuse_mismatch=True)
    assert (done.stored, done.refused) == ([jobs[1].id], {})


async def test_a_record_whose_text_holds_nul_is_stored_and_jams_nothing(store: Store) -> None:
    """PostgreSQL's text refuses NUL: a record holding one would fail the transaction that completes its batch,
    and every retry of it. It is stored (as U+FFFD there), and so is the rest of its batch."""
    await store.enqueue([("py-func", 1, 1, "reference", 2)])
    first, second = await store.lease("w", 2, 30, 0)
    odd = dataclasses.replace(traj(first.id, first.group_id), env_version="v\x00", verifier_version="x\x00",
                              node="n\x00", reasons=["a\x00b"])
    assert sorted(await store.complete([("w", odd), ("w", traj(second.id, second.group_id))])) == \
        sorted([first.id, second.id])
    got = await store.trajectory(first.id)
    assert got is not None and got.env_version in ("v\x00", "v\ufffd") and got.reasons == ["a\x00b"]


async def test_a_lease_for_an_endpoint_takes_its_agents_jobs_and_no_look_alikes(store: Store) -> None:
    agents = ["openai:m@a.b-1", "openai:m@a.b-1?max_tokens=5", "openai:m@aXb-1", "openai:m@a.b-12",
              "openai:m@x_a.b-1", "reference"]
    await store.enqueue([("py-func", i, 1, agent, 1) for i, agent in enumerate(agents)])
    mine = await store.lease("w", 10, 30, 0, endpoint="a.b-1")
    assert sorted(j.agent for j in mine) == sorted(agents[:2])
    others = await store.lease("w", 10, 30, 0, exclude=["a.b-1", "a.b-12"])
    assert sorted(j.agent for j in others) == sorted([agents[2], agents[4], agents[5]])


async def test_many_asks_leased_together_take_what_each_would_take_alone(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``lease_many`` serves asks of one endpoint filter together (two statements for all of them): each ask must
    get exactly what it would have got leasing alone, one after the other, canaries only for their node, jobs
    waiting out a backoff left alone, and each job's policy version its agent's; where the jobs it read cannot
    say, it leases those asks one at a time. Two stores get the same queue and the same asks, one all at once."""
    from farmd.store import jobs as jobs_module

    outcomes: list[bool] = []
    together = jobs_module._lease_together

    async def watched(*args: Any, **kwargs: Any) -> Any:
        shared = await together(*args, **kwargs)
        outcomes.append(shared is not None)
        return shared

    monkeypatch.setattr(jobs_module, "_lease_together", watched)
    rng = random.Random(3)
    agents = ["reference", "openai:m@e1", "openai:m@e2?max_tokens=9"]
    versions = {"reference": 0, "openai:m@e1": 7, "openai:m@e2?max_tokens=9": 9}
    at_once, alone = await Store.open(tmp_path / "at-once.db"), await Store.open(tmp_path / "alone.db")
    try:
        for _ in range(25):
            groups = [("py-func", rng.randrange(10**6), 1, rng.choice(agents), rng.randint(1, 4))
                      for _ in range(rng.randint(0, 6))]
            for store in (at_once, alone):
                await store.enqueue(groups)
            rows = await alone.db.all("SELECT id FROM jobs WHERE state='queued' ORDER BY id")
            queued = [int(r[0]) for r in rows]
            canaries = {i: rng.choice(["n1", "n2", "n3"]) for i in rng.sample(queued, len(queued) // 3)}
            later = rng.sample(queued, len(queued) // 6)
            for store in (at_once, alone):
                async with store.db.write() as db:
                    for job_id, node in canaries.items():
                        await db.execute("UPDATE jobs SET for_node=? WHERE id=?", (node, job_id))
                    for job_id in later:
                        await db.execute("UPDATE jobs SET not_before=? WHERE id=?", (time.time() + 3600, job_id))
            filters = [{}, {"exclude": ("e1",)}, {"endpoint": "e2"}]
            kind = rng.choice(filters)
            asks = [LeaseAsk(f"{rng.choice(['n1', 'n2', 'n4'])}:{rng.randrange(3)}:worker", rng.randint(0, 6),
                             **(kind if rng.random() < 0.8 else rng.choice(filters)))  # type: ignore[arg-type]
                    for _ in range(rng.randint(1, 8))]
            got = await at_once.lease_many(asks, 30, versions.__getitem__)
            want = [await alone.lease_many([ask], 30, versions.__getitem__) for ask in asks]
            assert [[(j.id, j.lease_owner, j.policy_version, j.attempts) for j in jobs] for jobs in got] == \
                   [[(j.id, j.lease_owner, j.policy_version, j.attempts) for j in jobs] for (jobs,) in want]
            state = "SELECT id, state, lease_owner, policy_version, attempts, for_node FROM jobs ORDER BY id"
            assert await at_once.db.all(state) == await alone.db.all(state)
    finally:
        await at_once.close()
        await alone.close()
    assert True in outcomes and False in outcomes, "asks were leased together, and one at a time where it could not say"


async def test_a_large_queue_is_made_known_to_the_planner_at_once(store: Store) -> None:
    """PostgreSQL's planner goes by statistics: without them, after a large run is queued, it read every queued job
    to lease a few until autovacuum looked (about a minute). Queueing ``ANALYZE_AFTER`` jobs or more brings them
    up to date before ``enqueue`` returns; a few jobs leave them alone. (SQLite's plans need none.)"""
    from farmd.store.jobs import ANALYZE_AFTER

    if not store.db.shared:
        pytest.skip("a server's planner's statistics")

    async def known() -> float:
        row = await store.db.one("SELECT reltuples FROM pg_class WHERE relname = 'jobs'")
        return float(row[0])

    await store.enqueue([("py-func", s, 1, "reference", 2) for s in range(5)])
    assert await known() < 0, "a few jobs: never analyzed yet (autovacuum would wait for 50 changes)"
    await store.enqueue_run("py-func", "reference", ANALYZE_AFTER, 8,
                            [("py-func", s, 1, "reference", 8) for s in range(ANALYZE_AFTER // 8 + 1)])
    assert await known() >= ANALYZE_AFTER
    plan = await store.db.all("EXPLAIN SELECT id FROM jobs WHERE state='queued' ORDER BY id LIMIT 2")
    assert "Sort" not in " ".join(str(r[0]) for r in plan), plan


async def test_a_runs_progress_and_its_cancellation_read_its_own_rows_never_the_whole_farms(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run``, ``runs`` and ``cancel_run`` find a run's groups, jobs and trajectories by index: a trainer polls its
    run's progress, and a farm's jobs and trajectories only grow (before, each read walked all of them)."""
    async with traced_store(tmp_path / "farm.db", monkeypatch) as (store, seen):
        await store.enqueue([("py-func", s, 1, "reference", 2) for s in range(3)])  # the demand's: run 0
        run_id, groups = await store.enqueue_run("py-func", "reference", 4, 2,
                                                 [("py-func", s, 1, "reference", 2) for s in range(2)])
        other, _ = await store.enqueue_run("py-func", "reference", 2, 2, [("py-func", 9, 1, "reference", 2)])
        jobs = [j for j in await store.lease("w", 10, 30, 0) if j.group_id == groups[0]]
        assert len(jobs) == 2
        assert await store.complete([("w", dataclasses.replace(traj(j.id, j.group_id), run_id=run_id))
                                     for j in jobs]) == [j.id for j in jobs]
        del seen[:]
        summary = await store.run(run_id)
        assert summary is not None and (summary.group_ids, summary.jobs, summary.done, summary.passed) == (
            groups, 4, 2, 2)
        assert [r.id for r in await store.runs()] == [other, run_id]
        assert await store.cancel_run(other)
        assert (await store.run(other)).state == "cancelled"  # type: ignore[union-attr]
        ran = list(seen)
    walks = whole_walks(tmp_path / "farm.db", ran, {"groups", "jobs", "trajectories", "g", "j", "t"})
    assert not walks, walks


async def test_what_every_rollout_costs_the_store_reads_by_key_never_a_whole_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queueing, leasing, extending, completing, the streams' reads and acks, expired leases, re-verification: the
    work of every rollout reads rows by key (or a range of one), never every job, group, trajectory or score the
    farm has had, however long it has run."""
    async with traced_store(tmp_path / "farm.db", monkeypatch) as (store, seen):
        await store.enqueue([("py-func", s, 1, "reference", 2) for s in range(3)])
        jobs = await store.lease("w", 4, 30, 0)
        await store.extend("w", [j.id for j in jobs], 30)
        await store.complete([("w", traj(j.id, j.group_id)) for j in jobs])
        await store.expired_leases()
        await store.requeue_expired({})
        done = await store.finished_groups(0, 10)
        await store.group_trajectories([g.id for g in done])
        page = await store.trajectories(limit=10)
        await store.cursor("trainer", "groups")
        await store.ack("trainer", "groups", done[-1].done_seq)
        await store.nodes.reverified("n1", "reverify", (page[0].id, "1", 1.0, True, "ok", [], []), "agreed",
                                     "passed", confirm=True)
        ran = list(seen)
    walks = whole_walks(tmp_path / "farm.db", ran, {"jobs", "groups", "trajectories", "scores", "j", "g", "t", "s"})
    assert not walks, walks


async def test_job_counts_read_between_every_change_are_a_full_count(store: Store) -> None:
    """A status read counts the jobs settled for good once (``JobRecords.job_counts``' mark), then only the jobs
    above its mark: read between every kind of change (queued, leased, done, retried, failed, cancelled, an expired
    lease, a second status reader at once), it says what counting every job says."""

    async def full() -> dict[str, int]:
        rows = await store.db.all("SELECT state, COUNT(*) FROM jobs WHERE for_node IS NULL GROUP BY state")
        return {str(state): int(n) for state, n in rows if n}

    async def same() -> None:
        first, second = await asyncio.gather(store.job_counts(), store.job_counts())
        assert first == second == await full()

    await same()
    await store.enqueue([("py-func", s, 1, "reference", 2) for s in range(4)])
    await same()
    jobs = await store.lease("w", 3, 30, 0)
    await same()
    await store.complete([("w", traj(jobs[0].id, jobs[0].group_id)), ("w", traj(jobs[1].id, jobs[1].group_id))])
    await same()
    assert await store.fail("w", jobs[2].id, "boom", final=False) is JobState.QUEUED
    await same()
    run_id, _ = await store.enqueue_run("py-func", "reference", 2, 2, [("py-func", 9, 1, "reference", 2)])
    await same()
    assert await store.cancel_run(run_id)
    await same()
    (job,) = await store.lease("w", 1, 30, 0)
    assert await store.fail("w", job.id, "boom", final=True) is JobState.FAILED
    await same()
    expiring = await store.lease("w2", 2, lease_s=0.01, policy_version=0)
    await asyncio.sleep(0.05)
    assert await store.requeue_expired({j.id: False for j in expiring}) == (len(expiring), 0)
    await same()
    await store.enqueue([("py-func", 20, 1, "reference", 1)])
    rest = await store.lease("w", 100, 30, 0)
    assert {j.id for j in expiring} <= {j.id for j in rest}
    await store.complete([("w", traj(j.id, j.group_id)) for j in rest])
    await same()
    assert (await store.job_counts()).keys() <= {"done", "failed", "cancelled"}
