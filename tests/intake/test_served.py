"""An approved contributed environment served as an ordinary one: its tasks, references and verdicts come
from its boxes, a rollout of it is stored like any other, and its verifier failing is never a pass."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from farmd.agents import make_agent
from farmd.api.trajectories import trajectory_pb
from farmd.envs import Attempt, VerifyContext, verify_safely
from farmd.envs.catalog import Catalog
from farmd.errors import InfraFailure, TaskError
from farmd.flags import VERIFIER_FAULT
from farmd.intake.boxed import MAX_FINAL_CHARS
from farmd.intake.package import read_package
from farmd.intake.served import ContributedEnvironment
from farmd.records import Job, JobState, Trajectory
from farmd.rollout.runner import run_rollout
from farmd.rollout.worker import Worker
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.intake.contrib_example import EXAMPLE, WORD_COUNT, answer, files

pytestmark = [pytest.mark.sandbox]

NAME = "contrib:word-count@1.0.0"


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[VerifyContext]:
    sandbox = Sandbox()
    try:
        yield VerifyContext(sandbox=sandbox, key=VerifierKey(b"served-contributed-env-key-32byt"),
                            scratch_dir=tmp_path)
    finally:
        await sandbox.close()


def served(tmp_path: Path, verify_first: str = "") -> ContributedEnvironment:
    """word-count as approved; with ``verify_first``, its verify runs that before judging."""
    if not verify_first:
        return ContributedEnvironment(read_package(EXAMPLE))
    source = WORD_COUNT.replace("    def verify(self, task, final):\n",
                                "    def verify(self, task, final):\n" + textwrap.indent(verify_first, " " * 8))
    assert source != WORD_COUNT
    root = tmp_path / "submission"
    for rel, text in files(source).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return ContributedEnvironment(read_package(root))


def job(agent: str, seed: int = 5, difficulty: int = 2) -> Job:
    return Job(id=11, group_id=4, env=NAME, seed=seed, difficulty=difficulty, agent=agent, state=JobState.LEASED,
               attempts=1)


async def test_tasks_come_from_boxes_named_by_the_approved_version(tmp_path: Path, ctx: VerifyContext) -> None:
    env = served(tmp_path)
    assert (env.name, env.version, env.max_difficulty, env.exploit_kind) == (NAME, "1.0.0", 3, "answer")
    assert env.verifier_version == f"1.0.0+{env.package.digest[:12]}"
    task = await env.make_task(7, 2, ctx)
    assert (task.env, task.env_version, task.seed, task.difficulty, task.kind) == (NAME, "1.0.0", 7, 2, "submission")
    assert task.prompt.startswith("How many times") and set(task.metadata) == {"target"}, "hidden stays hidden"
    assert await env.make_task(7, 2, ctx) == task, "the same seed, the same task"
    assert await env.make_task(8, 2, ctx) != task
    with pytest.raises(TaskError, match="make_task"):
        env.generate(7, 2)
    with pytest.raises(TaskError, match=r"1\.\.3"):
        await env.make_task(7, 4, ctx)


async def test_the_reference_passes_and_a_wrong_answer_scores_zero(tmp_path: Path, ctx: VerifyContext) -> None:
    env = served(tmp_path)
    task = await env.make_task(3, 1, ctx)
    reference = await env.make_reference(task, ctx)
    assert reference.final == answer(3, 1)
    right = await verify_safely(env, task, reference, ctx)
    assert (right.status, right.passed, right.reward, right.verifier_version) == ("ok", True, 1.0,
                                                                                  env.verifier_version)
    wrong = await verify_safely(env, task, Attempt(final=str(int(reference.final) + 1)), ctx)
    assert (wrong.status, wrong.passed, wrong.reward, wrong.reasons, wrong.flags) == ("ok", False, 0.0,
                                                                                      ["wrong count"], [])
    long = await verify_safely(env, task, Attempt(final=reference.final + " " * MAX_FINAL_CHARS), ctx)
    assert (long.status, long.passed) == ("ok", False), "never judged on a cut answer"


async def test_a_verifier_failing_on_an_attempt_but_not_the_reference_scores_it_zero_flagged(
        tmp_path: Path, ctx: VerifyContext) -> None:
    env = served(tmp_path, "if final.strip() == 'crash':\n    raise KeyError('a path the author never tried')\n")
    task = await env.make_task(3, 1, ctx)
    verdict = await verify_safely(env, task, Attempt(final="crash"), ctx)
    assert (verdict.status, verdict.passed, verdict.reward) == ("ok", False, 0.0)
    assert VERIFIER_FAULT in verdict.flags and "KeyError" in verdict.reasons[0], verdict.reasons


async def test_a_verifier_failing_on_the_reference_too_is_an_infrastructure_failure(
        tmp_path: Path, ctx: VerifyContext) -> None:
    env = served(tmp_path, "raise KeyError('broken for every attempt')\n")
    with pytest.raises(InfraFailure, match="could not judge"):
        await run_rollout(job("random"), env, make_agent("random"), ctx, "n1")


@pytest.mark.parametrize(("agent", "reward"), [("reference", 1.0), ("random", 0.0)])
async def test_a_rollout_is_stored_like_any_other(tmp_path: Path, ctx: VerifyContext, agent: str,
                                                  reward: float) -> None:
    catalog = Catalog()
    catalog.add(served(tmp_path))
    env = catalog.get(NAME)
    traj = await run_rollout(job(agent), env, make_agent(agent, envs=catalog.get, ctx=ctx), ctx, "n1")
    assert (traj.env, traj.env_version, traj.agent, traj.status) == (NAME, "1.0.0", agent, "ok")
    assert (traj.reward, traj.passed, traj.verifier_version) == (reward, reward == 1.0, env.verifier_version)
    assert (traj.final == answer(5, 2)) is (reward == 1.0)
    assert traj.task.prompt.startswith("How many times") and traj.task.kind == "submission"
    assert traj == traj.sealed()
    trajectory_pb(traj).SerializeToString()  # every field encodes: the record can travel


class OneJob:
    """Leases that hand out ``job`` once and keep what comes back."""

    def __init__(self, job: Job) -> None:
        self.jobs = [job]
        self.done: asyncio.Queue[Trajectory | str] = asyncio.Queue()

    async def lease(self, owner: str, n: int, *, endpoint: str | None = None, exclude: Sequence[str] = ()
                    ) -> list[Job]:
        if endpoint is not None:  # the worker asks for each endpoint's jobs apart: this job is no model's
            return []
        jobs, self.jobs = self.jobs, []
        return jobs

    async def heartbeat(self, owner: str, job_ids: list[int]) -> int:
        return len(job_ids)

    async def complete(self, owner: str, trajectories: list[Trajectory]) -> list[int]:
        for t in trajectories:
            self.done.put_nowait(t)
        return [t.id for t in trajectories]

    async def fail(self, owner: str, job_id: int, error: str, *, transient: bool = True) -> JobState | None:
        self.done.put_nowait(error)
        return None

    async def release(self, owner: str) -> int:
        return 0

    async def recover(self, node: str, owner: str) -> int:
        return 0


async def test_a_worker_given_the_catalog_runs_a_contributed_job(tmp_path: Path, ctx: VerifyContext) -> None:
    catalog = Catalog()
    catalog.add(served(tmp_path))
    leases = OneJob(job("reference"))
    worker = Worker(leases, ctx, slots=1, lease_s=30.0, node="n1", envs=catalog.get)
    await worker.start()
    try:
        done = await asyncio.wait_for(leases.done.get(), 30)
    finally:
        await worker.stop(grace_s=5.0)
    assert isinstance(done, Trajectory), done
    assert (done.env, done.env_version, done.reward, done.node) == (NAME, "1.0.0", 1.0, "n1")
