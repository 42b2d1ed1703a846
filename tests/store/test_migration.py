"""A data dir made by an older farmd (schema 4, trajectories before the typed record) opens, migrates and
serves every trajectory it holds, upgraded on read; new runs and records go in beside the old ones."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import zlib
from pathlib import Path

import pytest

from farmd.records import ChatMessage, JobState, Step, Trajectory, Turn
from farmd.store import Store
from farmd.store.schema import MIGRATIONS

OLD_SCHEMA = 4


def make_old_data_dir(data: Path) -> None:
    """What schema 4's farmd left: a finished group of two, stored with the old body (steps with
    ``seconds``, timings with ``_s`` names, details holding the verdict and usage), and a cursor."""
    data.mkdir(mode=0o700)
    with sqlite3.connect(data / "farm.db") as db:
        for version in range(OLD_SCHEMA):
            db.executescript(f"BEGIN; {MIGRATIONS[version]}; PRAGMA user_version={version + 1}; COMMIT;")
        db.execute("INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at, done_seq, done_total) "
                   "VALUES (1, 'py-func', 5, 2, 'reference', 2, 'request', 1.0, 1, 2)")
        for job in (1, 2):
            db.execute("INSERT INTO jobs(id, group_id, env, seed, difficulty, agent, state, attempts, policy_version, "
                       "source, created_at, updated_at) VALUES (?, 1, 'py-func', 5, 2, 'reference', 'done', 1, 3, "
                       "'request', 1.0, 2.0)", (job,))
            body = {"steps": [{"action": None, "observation": None, "exit_code": None, "seconds": 0.5}],
                    "final": f"def f(x): return {job}", "timings": {"task_s": 0.1, "agent_s": 0.2, "verify_s": 0.3,
                                                                  "total_s": 0.6},
                    "details": {"verdict": {"tests": 10, "failed": job - 1},
                                "usage": {"requests": 1, "prompt_tokens": 40, "completion_tokens": 9}}}
            db.execute("INSERT INTO trajectories(id, seq, group_id, env, env_version, seed, difficulty, agent, "
                       "policy_version, reward, passed, status, reasons, flags, verifier_version, body, node, "
                       "finished_at) VALUES (?, ?, 1, 'py-func', '1', 5, 2, 'reference', 3, ?, ?, 'ok', '[]', "
                       "'[\"truncated\"]', '1', ?, 'old-node', 100.5)",
                       (job, job, 1.0 if job == 1 else 0.0, int(job == 1), zlib.compress(json.dumps(body).encode())))
        db.execute("INSERT INTO consumers(name, kind, acked_seq, updated_at) VALUES ('trainer', 'groups', 1, 3.0)")
        db.execute("INSERT INTO policies(version, sha256, size, blob, uri, created_at) "
                   "VALUES (3, ?, 0, NULL, 'http://inference/v1', 1.0)", ("c" * 64,))


@pytest.mark.sqlite_only
async def test_an_old_data_dir_migrates_and_its_trajectories_upgrade_on_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_old_data_dir(data)
    store = await Store.open(data / "farm.db")
    try:
        old = await store.trajectory(1)
        assert old is not None
        assert (old.final, old.passed, old.flags, old.node, old.policy_version) == \
            ("def f(x): return 1", True, ["truncated"], "old-node", 3)
        assert old.steps == [Step(action="", observation="", exit_code=None, duration=0.5)]
        assert (old.timings.task, old.timings.total) == (0.1, 0.6)
        assert old.verdict_details == {"tests": 10, "failed": 0}
        assert (old.usage.prompt_tokens, old.usage.completion_tokens, old.usage.requests) == (40, 9, 1)
        assert old.run_id == 0 and old.messages == [] and old.turns == [] and old.task.prompt == ""
        assert await store.cursor("trainer", "groups") == 1 and await store.consumed("groups", 1) == 2
        # Policies from before lines are the line "": still found, and the next one numbers on from them.
        assert await store.publications() == [("", 3)]
        named = await store.add_policy("d" * 64, None, "http://inference/v2", "tiny")
        assert (named.version, named.name) == (4, "tiny") and (await store.latest_policy("")).version == 3
        again = await store.add_policy("c" * 64, None, "http://inference/v1", "tiny")
        assert again.version == 3 and (await store.latest_policy("tiny")).version == 3, \
            "the same content published again is the same version, and its line's current one"
        assert await store.publications() == [("", 3), ("tiny", 4), ("tiny", 3)]
        listed = await store.trajectories(after_seq=0, limit=10)
        assert [t.id for t in listed] == [1, 2] and listed[1].verdict_details == {"tests": 10, "failed": 1}

        # New runs and typed records go in beside the old ones.
        run_id, (group,) = await store.enqueue_run("py-func", "reference", 1, 1, [("py-func", 6, 2, "reference", 1)])
        (job,) = await store.lease("w", 1, 30, 4)
        turn = Turn(message_index=2, prompt_messages=2, completion="hi", token_ids=[1, 2], logprobs=[-0.5, -1.0],
                    has_logprobs=True)
        fresh = Trajectory(id=job.id, group_id=group, env="py-func", env_version="1", seed=6, difficulty=2,
                           agent="reference", policy_version=4, reward=1.0, passed=True, status="ok", reasons=[],
                           flags=[], verifier_version="1", final="x", node="new-node",
                           messages=[ChatMessage("system", "s"), ChatMessage("user", "u"),
                                     ChatMessage("assistant", "hi")], turns=[turn])
        assert await store.complete([("w", fresh)]) == [job.id]
        got = await store.trajectory(job.id)
        assert got is not None and got.run_id == run_id and got.turns == [turn] and got.seq == 3
        run = await store.run(run_id)
        assert run is not None and (run.state, run.done, run.passed) == ("succeeded", 1, 1)
    finally:
        await store.close()
    with sqlite3.connect(data / "farm.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


@pytest.mark.sqlite_only
async def test_a_cancelled_runs_jobs_never_go_back_to_the_queue(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        run_id, _ = await store.enqueue_run("py-func", "reference", 4, 1, [("py-func", s, 1, "reference", 1)
                                                                                for s in range(4)])
        failing, expiring, handed_back, _ = await store.lease("w", 3, 0.01, 0) + [None]
        assert await store.cancel_run(run_id)
        run = await store.run(run_id)
        assert run is not None and run.cancelled == 1  # the one still queued
        # Each way a running job could go back to the queue ends it instead.
        assert await store.fail("w", failing.id, "endpoint down", final=False) == JobState.CANCELLED
        await store.extend("w", [handed_back.id], 60)
        await asyncio.sleep(0.05)  # `expiring`'s lease runs out
        expired = await store.expired_leases()
        assert await store.requeue_expired({job_id: False for job_id in expired}) == (0, 0)
        run = await store.run(run_id)
        assert run is not None and run.cancelled == 3 and expiring is not None
        assert await store.requeue_owner("w") == 0
        assert await store.lease("w2", 10, 30, 0) == []
        run = await store.run(run_id)
        assert run is not None and (run.state, run.cancelled, run.jobs) == ("cancelled", 4, 4)
        assert len(await store.finished_groups(0, 10)) == 4, "whole-group streams are not held back"
    finally:
        await store.close()


@pytest.mark.sqlite_only
async def test_a_schema_5_queue_migrates_and_its_jobs_lease_at_once(tmp_path: Path) -> None:
    """Migration 6 adds a job's backoff (``not_before``); jobs queued before it have none to wait out."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    with sqlite3.connect(data / "farm.db") as db:
        for version in range(5):
            db.executescript(f"BEGIN; {MIGRATIONS[version]}; PRAGMA user_version={version + 1}; COMMIT;")
        db.execute("INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at) "
                   "VALUES (1, 'py-func', 5, 2, 'reference', 1, 'request', 1.0)")
        db.execute("INSERT INTO jobs(id, group_id, env, seed, difficulty, agent, state, attempts, source, last_error, "
                   "created_at, updated_at) VALUES (1, 1, 'py-func', 5, 2, 'reference', 'queued', 1, 'request', "
                   "'endpoint down', 1.0, 2.0)")
    store = await Store.open(data / "farm.db")
    try:
        (job,) = await store.lease("w", 5, 30, 0)
        assert (job.id, job.attempts) == (1, 2)
        assert await store.fail("w", job.id, "endpoint down", final=False, not_before=time.time() + 60) \
            == JobState.QUEUED
        assert await store.lease("w", 5, 30, 0) == [], "a backoff the scheduler set is kept"
    finally:
        await store.close()
    with sqlite3.connect(data / "farm.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
