"""Production canaries: an approved contributed version keeps being checked by known-wrong attempts mixed into
its jobs, on the bank's own seeds, never streamed or counted; any reward to one quarantines the version.

The plan and the scheduler's side run on a real store; end to end, a real farmd serves a version whose verifier
passes anything once a date has gone by (it behaved while it was checked) and one that is honest: rollouts
run on both, the canaries mixed into them catch the first, withdraw its trajectories and name the canary as
the finding, and leave the honest one serving with its canaries out of every trainer's stream."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient

from farmd.envs.base import VerifyContext, verify_safely
from farmd.intake.canaries import KNOWN_WRONG, ProductionCanaries
from farmd.intake.exploits import fingerprint, for_kind
from farmd.intake.package import pack, read_package
from farmd.intake.redteam import make_red_team_agent
from farmd.intake.served import ContributedEnvironment
from farmd.intake.settings import MIN_CANARY_SHARE, IntakeConfig
from farmd.records import CANARY_PREFIX, Trajectory
from farmd.sandbox import Sandbox
from farmd.scheduler import Scheduler
from farmd.store import Store
from farmd.taskbank import SeedSequence
from farmd.verifier import VerifierKey
from tests.conftest import RunningFarm
from tests.intake import defects
from tests.intake.contrib_example import EXAMPLE

KEY = VerifierKey(b"canary-test-key-canary-test-key!")
ENV = "contrib:word-count@1.0.0"


def test_a_share_of_a_served_versions_jobs_are_canaries_with_a_floor_and_one_at_once() -> None:
    plan = ProductionCanaries(0.05, random.Random(4))
    assert plan(ENV, [(11, 1)], 8) == [], "a version not served gets none (a built-in environment never does)"
    plan.serve(ENV, "answer")
    first = plan(ENV, [(11, 1), (12, 2)], 8)
    assert 1 <= len(first) <= 2, "the first jobs of a version carry a canary at once"
    assert all(spec.startswith(CANARY_PREFIX) and (seed, level) in {(11, 1), (12, 2)} for seed, level, spec in first)
    later = [c for _ in range(400) for c in plan(ENV, [(13, 1)], 19)]
    assert len(later) == pytest.approx(400, rel=0.1), "19 jobs each carry one on average: 5% of all"
    names = {spec.removeprefix(CANARY_PREFIX) for _, _, spec in later}
    assert set(KNOWN_WRONG) <= names and names - set(KNOWN_WRONG) <= {e.name for e in for_kind("answer")}
    assert "hang" not in names, "hangs are tier 2's: they cost a verifier's whole time limit"
    plan.unserve(ENV)
    assert plan(ENV, [(13, 1)], 1000) == []
    for share in (0.0, MIN_CANARY_SHARE / 2, 1.0):  # production keeps checking: never off, never everything
        with pytest.raises(ValueError):
            ProductionCanaries(share)
        with pytest.raises(ValueError):
            IntakeConfig(canary_share=share)


def scored(job: Any, reward: float) -> Trajectory:
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=0, reward=reward, passed=reward > 0,
                      status="ok", reasons=[], flags=[], verifier_version="1", steps=[], final="x", node="n1")


async def test_canaries_are_queued_beside_a_versions_jobs_on_its_seeds_and_kept_out_of_streams_bank_and_rates(
        tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    seeds = SeedSequence.keyed(KEY.seed)
    scheduler = await Scheduler.open(store, {"arith": 5}, seeds=seeds)
    try:
        scheduler.bank.add_env(ENV, 3)
        plan = ProductionCanaries(0.2, random.Random(1))
        plan.serve(ENV, "answer")
        scheduler.canaries = plan
        run = await scheduler.create_run(ENV, "skilled:3", 8, 4)
        await scheduler.create_run("arith", "reference", 4, 4)
        await scheduler.create_run(ENV, "redteam:exploit:hedge-or", 2, 2)
        jobs = await scheduler.lease("w:1:a", 100)
        canaries = [j for j in jobs if j.agent.startswith(CANARY_PREFIX)]
        ours = [j for j in jobs if j.agent == "skilled:3"]
        assert len(canaries) == 3 and {j.env for j in canaries} == {ENV}, "1 at once + 8 x 0.25; none elsewhere"
        assert {(j.seed, j.difficulty) for j in canaries} <= {(j.seed, j.difficulty) for j in ours}, "the bank's tasks"
        assert {j.seed for j in ours} == {seeds.nth(ENV, 1, n) for n in range(2)}, "the bank's keyed seeds"
        assert all(j.source == "canary" for j in canaries) and len({j.group_id for j in canaries}) == 3
        assert (await store.run(run)).rollouts == 8, "a run counts its own jobs only"
        assert scheduler.counters["canaries"] == 3
        stored = await scheduler.complete("w:1:a", [scored(j, 1.0 if j in canaries else 0.5) for j in jobs])
        assert len(stored) == len(jobs)
        streamed = await store.trajectories(streamed=True, limit=100)
        assert streamed and not [t for t in streamed if t.agent.startswith(CANARY_PREFIX)], "never to a trainer"
        groups = await store.finished_groups(0, 100, streamed=True)
        assert groups and not [g for g in groups if g.agent.startswith(CANARY_PREFIX)]
        rates = {r.env: r for r in await store.pass_rates()}
        assert rates[ENV].trajectories == 8 and rates[ENV].passed == 8, "nor in pass rates"
        found = await store.intake.canary_results(0, await store.last_seq())
        assert len(found) == 3 and all(r.reward == 1.0 for r in found), "what the funnel reads"
    finally:
        await scheduler.stop()
        await store.close()


@pytest.mark.sandbox
@pytest.mark.parametrize("example", ["word-count", "running-max"])
async def test_every_known_wrong_canary_is_wrong_and_an_honest_verifier_gives_it_nothing(example: str) -> None:
    """A canary must never be the right answer (an honest version would be quarantined): each known-wrong kind,
    and an exploit that is only the right answer repackaged (on a bare-answer task it is the answer), are made by
    the agent a node runs and judged by the version's own verifier in its boxes."""
    package = read_package(EXAMPLE.parent / example)
    served = ContributedEnvironment(package)
    plan = ProductionCanaries(0.05)
    names = [*KNOWN_WRONG, "no-tags" if package.manifest.kind == "answer" else "echo-input"]
    assert set(names) <= set(plan.names(package.manifest.kind))
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        task = await served.make_task(SeedSequence.keyed(KEY.seed).nth(served.name, 1, 0), 1, ctx)
        reference = (await served.make_reference(task, ctx)).final
        for name in names:
            agent = make_red_team_agent(CANARY_PREFIX + name, {served.name: served}.__getitem__, ctx)
            result = await agent.attempt(task, None, 0)
            assert result.attempt.final.strip() != reference.strip(), name
            verdict = await verify_safely(served, task, result.attempt, ctx)
            assert (verdict.reward, verdict.passed) == (0.0, False), (name, result.attempt.final[:200], verdict)
            assert "red_team_exploit" in result.flags


# -- end to end -------------------------------------------------------------------------------------------------

TOKENS = {"op": "op-token", "trainer": "trainer-token"}
ROLES = {"op": "operator", "trainer": "trainer"}
BOMB = "contrib:date-bomb@1.0.0"


def approved(data_dir: Path, contributor: str, data: bytes) -> int:
    """A version approved before this farm started (its checks passed then): what the farm serves."""

    async def put() -> int:
        store = await Store.open(data_dir / "farm.db")
        try:
            package = read_package(data)
            m = package.manifest
            sid = await store.intake.add_submission(
                contributor=contributor, name=m.name, version=m.version, domain=m.domain, kind=m.kind,
                levels=m.levels, digest=package.digest, package=data, bounty_id=0, seeds=2, attack_budget=2)
            assert sid is not None
            await store.intake.set_state(sid, "approved", tier=3, decided=True, reviewer="rita", note="checked")
            await store.intake.set_library(sid, fingerprint(m.kind))  # attacked by today's library already
            return sid
        finally:
            await store.close()

    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return asyncio.run(put())


def as_op(farm: RunningFarm, *args: str) -> Any:
    return json.loads(farm.farmctl("--token", TOKENS["op"], *args, "--json").stdout)


@pytest.mark.sandbox
def test_a_version_that_passes_anything_after_its_checks_is_caught_by_production_canaries(
        running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data_dir = tmp_path / "farm"
    honest_id = approved(data_dir, "ada", pack((str(p.relative_to(EXAMPLE)), p.read_bytes())
                                               for p in EXAMPLE.rglob("*") if p.is_file()))
    bomb = defects.WORD_COUNT.replace(*defects.TIME_BOMB)
    bomb_id = approved(data_dir, "mallory", defects.packed("date-bomb", bomb, entry="env.py:WordCount"))
    config = tmp_path / "farm.toml"
    config.write_text("[intake]\ncanary_share = 0.2\ncanary_check_s = 0.3\n" + "".join(
        f'\n[[credentials]]\nname = "{who}"\nroles = ["{ROLES[who]}"]\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n' for who, token in TOKENS.items()))
    farm = running_farm("--workers", "2", "--config", str(config), data_dir=data_dir)
    for env in (ENV, BOMB):
        run = as_op(farm, "run", "--env", env, "--agent", "reference", "--rollouts", "4", "--wait")
        # The bomb's canary may quarantine it before the run is read: its passes, withdrawn, count none then.
        assert run["done"] == 4 and (env == BOMB or run["passed"] == 4), run

    deadline = time.monotonic() + 90
    while True:
        caught = as_op(farm, "submission", "show", str(bomb_id))
        honest = as_op(farm, "trajectories", "list", "--env", ENV, "--limit", "100")
        honest_canaries = [t for t in honest if t["agent"].startswith(CANARY_PREFIX)]
        if (caught["state"] == "quarantined" and len(honest_canaries) >= 2) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert caught["state"] == "quarantined", caught["detail"]
    [finding] = [f for f in caught["findings"] if f["check"] == "production_canary"]
    assert "earned reward 1" in finding["evidence"] and "after the version was approved" in finding["evidence"]
    assert "quarantined by a production canary" in caught["detail"]
    assert caught["withdrawn"] == 4, "its rollouts are withdrawn from every stream"

    assert len(honest_canaries) == 2 and all(t["reward"] == 0 for t in honest_canaries), honest_canaries
    time.sleep(1.0)  # a few more looks at the canaries
    assert as_op(farm, "submission", "show", str(honest_id))["state"] == "approved"
    key = VerifierKey.load_or_create(data_dir)
    served = {t["seed"] for t in honest if t["agent"] == "reference"}
    assert served == {SeedSequence.keyed(key.seed).nth(ENV, 1, 0)}, "the bank's keyed sequence, first seed"
    assert {t["seed"] for t in honest_canaries} == served, "canaries on the very tasks production served"
    with FarmClient(farm.addr, token=TOKENS["trainer"]) as trainer:
        batch = next(trainer.batches("learner", batch_size=4, envs=[ENV]))
        assert [t.agent for t in batch.trajectories] == ["reference"] * 4, "no canary reaches a trainer"
    rates = {(r["env"], r["difficulty"]): r for r in as_op(farm, "status")["pass_rates"]}
    assert rates[(ENV, 1)]["trajectories"] == 4, "nor the pass rates"
