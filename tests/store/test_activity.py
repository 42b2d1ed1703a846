"""The store's reads over time: activity per bucket, a policy's learning curve, and the filters an operator
narrows trajectories by. A real SQLite file; finished times are moved with plain SQL to spread them out."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from farmd.records import RED_TEAM_PREFIX, Trajectory
from farmd.store import Store, TrajectoryFilter
from tests.store.test_store import traj


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await Store.open(tmp_path / "farm.db")
    yield s
    await s.close()


async def stored(store: Store, *made: Trajectory) -> list[Trajectory]:
    """``made``, stored in order as the jobs they stand for (ids and groups are the store's)."""
    groups = await store.enqueue([(t.env, t.seed, t.difficulty, t.agent, 1) for t in made])
    out = []
    for t, group in zip(made, groups, strict=True):
        (job,) = await store.lease("w", 1, 30, policy_version=t.policy_version)
        assert job.group_id == group
        out.append(dataclasses.replace(t, id=job.id, group_id=group))
        assert await store.complete([("w", out[-1])]) == [job.id]
    return out


def attempt(env: str = "arith", level: int = 1, agent: str = "torch:tiny", version: int = 1, reward: float = 1.0,
            flags: tuple[str, ...] = (), node: str = "n1", status: str = "ok") -> Trajectory:
    return dataclasses.replace(traj(0, 0, reward, status), env=env, difficulty=level, agent=agent,
                               policy_version=version, flags=list(flags), node=node)


async def finished_at(store: Store, ids: list[int], at: float) -> None:
    async with store.db.write() as db:  # whichever the database
        await db.executemany("UPDATE trajectories SET finished_at = ? WHERE id = ?", [(at, i) for i in ids])


async def test_activity_counts_each_environment_per_bucket_with_its_flags(store: Store, tmp_path: Path) -> None:
    now = time.time()
    old = await stored(store, attempt(reward=1.0), attempt(reward=0.0, flags=("timeout",), version=2))
    new = await stored(store, attempt(level=3, reward=1.0, version=5), attempt(env="py-func", reward=0.0,
                                                                                flags=("timeout", "suspected_hack")))
    red = await stored(store, attempt(agent=f"{RED_TEAM_PREFIX}exploit:x", reward=1.0, flags=("red_team_exploit",)))
    failed = await stored(store, attempt(status="error", reward=0.0))
    await finished_at(store, [t.id for t in old], now - 50 * 60)
    await finished_at(store, [t.id for t in new + red + failed], now - 5 * 60)

    since, width = now - 3600, 600.0
    buckets = {(round((b.start - since) / width), b.env): b for b in await store.activity.buckets(since, width)}
    assert set(buckets) == {(1, "arith"), (5, "arith"), (5, "py-func")}, "red-team attempts are left out"
    first = buckets[(1, "arith")]
    assert (first.trajectories, first.passed, first.max_policy_version, first.flags) == (2, 1, 2, {"timeout": 1})
    late = buckets[(5, "arith")]
    assert (late.trajectories, late.passed, late.errors, late.mean_difficulty) == (2, 1, 1, 2.0)
    assert buckets[(5, "py-func")].flags == {"timeout": 1, "suspected_hack": 1}
    assert await store.activity.buckets(now + 1, width) == [], "nothing after now"


async def test_a_learning_curve_follows_one_agent_in_stream_order(store: Store) -> None:
    made = [attempt(version=1 + i // 4, reward=float(i >= 6), level=1 + i // 6) for i in range(12)]
    mixed = [m for pair in zip(made, [attempt(agent="reference", version=0)] * 12, strict=True) for m in pair]
    await stored(store, *mixed)

    curve = await store.activity.learning_curve("torch:tiny", None, points=4)
    assert [p.rollouts for p in curve] == [3, 6, 9, 12], "counted in the agent's own rollouts, not seqs"
    assert [p.passed for p in curve] == [0, 0, 3, 3]
    assert [p.policy_version for p in curve] == [1, 2, 3, 3]
    assert [p.mean_difficulty for p in curve] == [1.0, 1.0, 2.0, 2.0]
    assert len(await store.activity.learning_curve("torch:tiny", None, points=1000)) == 12
    assert await store.activity.learning_curve("torch:tiny", "py-func", points=4) == []
    assert await store.activity.policy_agents() == ["torch:tiny"], "a scripted agent runs no farm policy"


async def test_filters_keep_only_what_matches(store: Store) -> None:
    made = await stored(store, attempt(version=3, reward=0.25, node="a"), attempt(version=4, reward=1.0, node="b",
                                                                                  flags=("truncated",)),
                        attempt(agent="reference", version=0, reward=0.0, node="a"))

    async def ids(**where: object) -> list[int]:
        rows = await store.trajectories(view="summary", where=TrajectoryFilter(**where))  # type: ignore[arg-type]
        return [t.id for t in rows]

    a, b, ref = (t.id for t in made)
    assert await ids() == [a, b, ref]
    assert await ids(policy_version=4) == [b]
    assert await ids(min_reward=0.2) == [a, b]
    assert await ids(max_reward=0.5) == [a, ref]
    assert await ids(node="a") == [a, ref]
    assert await ids(agent="reference") == [ref]
    assert await ids(flag="truncated") == [b]
    await store.add_scores([(ref, "2", 0.0, False, "ok", ["withdrawn"], ["withdrawn"])])
    assert await ids(flag="withdrawn") == [ref], "a later score's flags count too"
    assert await ids(node="a", min_reward=0.1) == [a]
