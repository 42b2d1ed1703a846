"""The coordinator's checks of joined nodes, in process over a real store, scheduler and boxes: what a node's
record may not change, how much of its work is verified again (a share that no setting takes below its floor,
and every one of its first results), and when two verdicts agree."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from farmd.config import load
from farmd.envs import VerifyContext, get
from farmd.errors import ConfigError
from farmd.records import Job, Score, Trajectory
from farmd.rollout.reverify import Rechecker
from farmd.sandbox import Sandbox
from farmd.scheduler import Scheduler, SchedulerConfig
from farmd.scheduler.checks import answer_disagreement, verdict_disagreement
from farmd.scheduler.config import REVERIFY_FIRST_FLOOR, REVERIFY_SHARE_FLOOR
from farmd.scheduler.nodes import Hello, IsolationCheck, Nodes
from farmd.store import Store
from farmd.verifier import VerifierKey

CHAIN = "rg:chain_sum"
OK = (IsolationCheck(name="bwrap", ok=True, detail=""),)


def hello(name: str, capacity: int = 4096) -> Hello:
    return Hello(name=name, owner=f"{name}:1:aa", capacity=capacity, version="0", address="ipv4:10.0.0.2:1",
                 isolation=OK)


def honest(job: Job) -> Trajectory:
    env = get(job.env)
    task = env.generate(job.seed, job.difficulty)
    final = env.reference(task).final
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=job.policy_version, reward=1.0,
                      passed=True, status="ok", reasons=[], flags=[], verifier_version="1", final=final)


@pytest.fixture
async def farm(tmp_path: Path) -> AsyncIterator[tuple[Scheduler, VerifyContext]]:
    store = await Store.open(tmp_path / "farm.db")
    sandbox = Sandbox()
    config = SchedulerConfig(lease_s=60, reverify_share=REVERIFY_SHARE_FLOOR, reverify_first=REVERIFY_FIRST_FLOOR,
                             canary_first_within=10_000, canary_share=0.005, node_refusals_quarantine=10)
    scheduler = await Scheduler.open(store, {CHAIN: 5}, config)
    try:
        yield scheduler, VerifyContext(sandbox=sandbox, key=VerifierKey(b"k" * 32), scratch_dir=tmp_path)
    finally:
        await scheduler.stop()
        await sandbox.close()
        await store.close()


def test_no_setting_takes_the_checks_below_their_floor(tmp_path: Path) -> None:
    for bad in ({"reverify_share": 0.0}, {"reverify_share": REVERIFY_SHARE_FLOOR / 2}, {"reverify_share": 1.5},
                {"reverify_first": REVERIFY_FIRST_FLOOR - 1}, {"canary_share": 0.0}, {"reverify_share": math.nan}):
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)  # type: ignore[arg-type]
        toml = tmp_path / "farm.toml"
        name, value = next(iter(bad.items()))
        toml.write_text(f"[scheduler]\n{name} = {'nan' if value != value else value}\n")
        with pytest.raises(ConfigError, match=name):
            load(toml)
    assert SchedulerConfig().reverify_share >= REVERIFY_SHARE_FLOOR
    assert SchedulerConfig(reverify_share=REVERIFY_SHARE_FLOOR).reverify_share == REVERIFY_SHARE_FLOOR


async def test_at_the_floor_a_nodes_first_results_and_a_share_of_the_rest_are_verified_again(farm) -> None:  # type: ignore[no-untyped-def]
    scheduler, ctx = farm
    nodes = Nodes(scheduler, lost_after_s=60, checker=Rechecker(ctx, get))
    await nodes.start()
    try:
        await scheduler.create_run(CHAIN, "reference", 0, 1, seeds=range(2000), difficulty=1)
        node = nodes.join(hello("steady"))
        jobs = await nodes.lease(node, 2000)
        assert len(jobs) == 2000
        assert await nodes.complete(node, [(node.hello.owner, honest(j)) for j in jobs]) == sorted(j.id for j in jobs)
        picked = nodes.checks.counters["queued"]
        # 4 first results, then 1% of 1996: about 20 more; fewer than 3 once in about two million runs.
        assert REVERIFY_FIRST_FLOOR + 3 <= picked <= REVERIFY_FIRST_FLOOR + 80, picked
        for _ in range(600):
            if nodes.checks.waiting() == 0 and node.checked >= picked:
                break
            await asyncio.sleep(0.05)
        assert (node.checked, node.disagreed) == (picked, 0), "honest verdicts agree"
        confirmed = [t for t in await scheduler.store.trajectories(limit=2000, view="summary")
                     if t.verified_by == "coordinator"]
        assert len(confirmed) == picked and {t.id for t in confirmed} >= {j.id for j in jobs[:REVERIFY_FIRST_FLOOR]}
        evidence = await scheduler.store.nodes.checks("steady", limit=1000)
        assert sorted(c.job_id for c in evidence) == sorted(t.id for t in confirmed)
        assert {(c.kind, c.outcome) for c in evidence} == {("reverify", "agreed")}
    finally:
        await nodes.stop()


async def test_a_record_is_stored_under_its_lease_and_one_that_says_otherwise_is_refused(farm) -> None:  # type: ignore[no-untyped-def]
    scheduler, ctx = farm
    nodes = Nodes(scheduler, lost_after_s=60, checker=Rechecker(ctx, get))
    await nodes.start()
    try:
        run = await scheduler.create_run(CHAIN, "reference", 0, 1, seeds=range(4), difficulty=1)
        node = nodes.join(hello("n"))
        jobs = await nodes.lease(node, 4)
        lies = {jobs[1].id: {"run_id": run + 7}, jobs[2].id: {"seed": jobs[2].seed + 100},
                jobs[3].id: {"agent": "torch:other"}}
        records = [honest(jobs[0])] + [dataclasses.replace(honest(j), **lies[j.id]) for j in jobs[1:]]
        done = await nodes.report(node, [(node.hello.owner, t) for t in records])
        assert (done.stored, sorted(done.refused)) == ([jobs[0].id], sorted(lies))
        assert "run_id" in done.refused[jobs[1].id] and "seed" in done.refused[jobs[2].id]
        assert node.refused == 3 and node.state == "connected"
        stored = await scheduler.store.trajectory(jobs[0].id)
        assert stored is not None and (stored.run_id, stored.node, stored.verified_by) == (run, "n", "node:n")
        # Back in the queue at once, the attempt not counted: the job did nothing wrong.
        again = [j for j in await nodes.lease(node, 8) if j.id in lies]  # beside them, perhaps its first canary
        assert sorted(j.id for j in again) == sorted(lies) and {j.attempts for j in again} == {1}
    finally:
        await nodes.stop()


def test_two_verdicts_agree_only_on_the_same_outcome_and_a_finite_reward_within_tolerance() -> None:
    base = Trajectory(id=1, group_id=1, env=CHAIN, env_version="1", seed=0, difficulty=1, agent="reference",
                      policy_version=0, reward=1.0, passed=True, status="ok", reasons=[], flags=[], verifier_version="1")
    assert verdict_disagreement(base, True, 1.0, 0.05) == ""
    assert verdict_disagreement(dataclasses.replace(base, reward=0.97), True, 1.0, 0.05) == ""
    assert "a fail" in verdict_disagreement(base, False, 0.0, 0.05)
    assert verdict_disagreement(dataclasses.replace(base, reward=0.5), True, 1.0, 0.05)
    assert verdict_disagreement(dataclasses.replace(base, reward=math.nan), True, 1.0, 0.05), "NaN never agrees"
    assert verdict_disagreement(dataclasses.replace(base, reward=math.inf), True, 1.0, 0.05)
    assert verdict_disagreement(dataclasses.replace(base, status="error"), True, 1.0, 0.05)
    assert answer_disagreement(base, dataclasses.replace(base, final="<answer>1</answer>"))
    assert answer_disagreement(base, base) == ""


def test_a_timed_reward_agrees_anywhere_the_coordinators_own_timing_cannot_tell_apart() -> None:
    """A kernel's speed reward measured in two boxes differs (0.79 on a node, 0.5 on a loaded coordinator, seen
    here): inside the coordinator's interval it agrees; a claim past it, by more than the tolerance, does not."""
    from farmd.scheduler.checks import reward_interval

    node = Trajectory(id=1, group_id=1, env="kernel", env_version="1", seed=0, difficulty=1, agent="reference",
                      policy_version=0, reward=0.79, passed=True, status="ok", reasons=[], flags=[],
                      verifier_version="1")
    assert verdict_disagreement(node, True, 0.5, 0.25), "a point verdict 0.29 away disagrees"
    assert verdict_disagreement(node, True, 0.5, 0.25, (0.35, 0.9)) == ""
    assert verdict_disagreement(dataclasses.replace(node, reward=1.0), True, 0.5, 0.25, (0.35, 0.6)), \
        "twice the speed the coordinator's timing allows is a lie"
    assert verdict_disagreement(dataclasses.replace(node, passed=False, reward=0.0), True, 0.5, 0.25, (0.0, 1.0))
    assert reward_interval({"reward_interval": [0.35, 0.9]}) == (0.35, 0.9)
    for bad in ([0.9, 0.35], [0.1], [0.1, math.inf], ["0", "1"], [True, 1.0], None, "0.1-0.9"):
        assert reward_interval({"reward_interval": bad}) is None, bad


class _Timed:
    """A coordinator's checker for a timed reward (a kernel's speed), each job's measurements scripted: a timing
    cannot be made to come out a given way on a real machine, and this test is about what is made of two."""

    def __init__(self, script: dict[int, list[tuple[float, tuple[float, float]] | Exception]]) -> None:
        self.script = script

    async def verify(self, trajectory: Trajectory) -> tuple[Score, dict[str, object]]:
        measured = self.script[trajectory.id].pop(0)
        if isinstance(measured, Exception):
            raise measured
        reward, interval = measured
        return Score(verifier_version="1", reward=reward, passed=True), {"reward_interval": list(interval)}

    async def replicate(self, job: Job) -> Trajectory:
        raise AssertionError("no canary in this test")


async def test_a_timed_reward_outside_the_coordinators_timing_is_measured_again_before_it_quarantines(  # type: ignore[no-untyped-def]
        farm) -> None:
    """The node says 0.79; the coordinator first times 0.4 (0.35-0.45: outside, by more than the tolerance). Timed
    again at 0.7 (0.55-0.85), the node agrees with what the coordinator's own two timings span; timed again the
    same, or failing to be, it disagrees and is quarantined."""
    scheduler, _ = farm
    first = (0.4, (0.35, 0.45))
    script: dict[int, list[tuple[float, tuple[float, float]] | Exception]] = {}
    nodes = Nodes(scheduler, lost_after_s=60, checker=_Timed(script))
    await nodes.start()
    try:
        await scheduler.create_run(CHAIN, "reference", 0, 1, seeds=range(3), difficulty=1)
        seconds = {"busy": (0.7, (0.55, 0.85)), "fast": (0.42, (0.38, 0.46)), "broken": RuntimeError("box lost")}
        joined = {}
        for name, second in seconds.items():
            node = joined[name] = nodes.join(hello(name))
            (job,) = await nodes.lease(node, 1)
            script[job.id] = [first, second]
            assert await nodes.complete(node, [(node.hello.owner, dataclasses.replace(honest(job), reward=0.79))])
        for _ in range(600):
            if all(n.checked for n in joined.values()):
                break
            await asyncio.sleep(0.05)
        assert all(not left for left in script.values()), "each measured twice"
        assert (joined["busy"].disagreed, joined["busy"].state) == (0, "connected")
        assert joined["fast"].disagreed == 1 and joined["fast"].state == "quarantined"
        assert joined["broken"].disagreed == 1 and joined["broken"].state == "quarantined", \
            "a second timing that fails leaves the first one's word"
    finally:
        await nodes.stop()


async def test_a_canarys_timed_reward_is_measured_again_too(farm) -> None:  # type: ignore[no-untyped-def]
    """A canary's answer is the coordinator's own, its speed reward the node's timing: 0.79 against the
    coordinator's run timed at 0.4 (0.35-0.45) is timed again on the node's attempt before it fails the canary."""
    from farmd.scheduler.checks import AGREED, CANARY, DISAGREED, Check, NodeChecks

    scheduler, _ = farm
    await scheduler.create_run(CHAIN, "reference", 0, 1, seeds=range(2), difficulty=1)
    jobs = await scheduler.store.lease("w", 2, 60, 0)
    script: dict[int, list[tuple[float, tuple[float, float]] | Exception]] = {
        jobs[0].id: [(0.7, (0.55, 0.85))], jobs[1].id: [(0.41, (0.38, 0.44))]}

    class Canaried(_Timed):
        async def replicate(self, job: Job) -> Trajectory:
            return dataclasses.replace(honest(job), reward=0.4, verdict_details={"reward_interval": [0.35, 0.45]})

    found: dict[int, str] = {}

    async def outcome(node: str, kind: str, job_id: int, result: str, detail: str) -> None:
        found[job_id] = result

    checks = NodeChecks(scheduler.store, Canaried(script), tolerance=0.25, concurrency=1, outcome=outcome,
                        skip=lambda name: False)
    await checks.start()
    try:
        for job in jobs:
            checks.add(Check(CANARY, "n", job.id, dataclasses.replace(honest(job), reward=0.79)), must=True)
        for _ in range(200):
            if len(found) == 2:
                break
            await asyncio.sleep(0.05)
        assert found == {jobs[0].id: AGREED, jobs[1].id: DISAGREED}
        assert all(not left for left in script.values()), "the node's attempt timed once more"
    finally:
        await checks.stop()
