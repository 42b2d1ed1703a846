"""Completions judged for the Verify API, stored as finished groups (``Store.store_finished``), on SQLite and on a
real PostgreSQL server: given ids, groups and places in the stream after queued work, the farm's own verdicts, and
read back as the bank and the streams read every finished group."""

from __future__ import annotations

from pathlib import Path

from farmd.records import VERIFIED_LOCAL, Trajectory
from farmd.store import Store
from farmd.store.codec import pack_body


def judged(seed: int, reward: float) -> Trajectory:
    return Trajectory(id=0, group_id=0, env="arith", env_version="1", seed=seed, difficulty=1, agent="verify:run",
                      policy_version=0, reward=reward, passed=reward > 0, status="ok", reasons=[], flags=[],
                      verifier_version="1", final=str(seed), node="n1")


async def test_judged_groups_are_stored_finished_after_queued_work(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        (queued,) = await store.enqueue([("arith", 9, 1, "reference", 2)])  # ids the queue gave out already
        groups = [[judged(1, 1.0), judged(1, 0.0)], [judged(2, 0.0)]]
        await store.store_finished(groups, [pack_body(t) for g in groups for t in g], source="verify")
        ids = [t.id for g in groups for t in g]
        assert len(set(ids)) == 3 and min(ids) > 0
        assert groups[0][0].group_id == groups[0][1].group_id != groups[1][0].group_id
        assert queued not in {groups[0][0].group_id, groups[1][0].group_id}
        finished = await store.finished_groups(0, 10)
        assert [(g.seed, g.agent, g.rewards) for g in finished] == [(1, "verify:run", [1.0, 0.0]),
                                                                             (2, "verify:run", [0.0])]
        back = await store.trajectory(ids[0])
        assert back is not None and (back.reward, back.verified_by, back.agent) == (1.0, VERIFIED_LOCAL, "verify:run")
        # The queue goes on giving ids past them: a later job is never one of theirs.
        await store.enqueue([("arith", 10, 1, "reference", 2)])
        jobs = await store.lease("w", 4, 30, 0)
        assert len(jobs) == 4
        assert not {j.id for j in jobs} & set(ids)
    finally:
        await store.close()
