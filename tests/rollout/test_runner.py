"""The rollout runner is where an attempt enters the farm: whatever the attempt's content causes is its own
0, never an infrastructure failure; its text is made valid and its record bounded before it is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from farm.v1 import trajectory_pb2

from farmd.agents import Agent, AgentResult
from farmd.agents.base import Step
from farmd.api.trajectories import trajectory_pb
from farmd.envs import Attempt, Episode, SubmissionEnvironment, Task, VerifyContext, get
from farmd.errors import (
    ContributedError,
    ContributedVerifierFailed,
    EndpointError,
    GeneratorBug,
    PolicyError,
    SandboxError,
    TaskError,
)
from farmd.flags import INVALID_TEXT, TRUNCATED, VERIFIER_FAULT
from farmd.records import MAX_FINAL_CHARS, Job, JobState
from farmd.rollout.runner import InfraFailure, run_rollout
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from farmd.verifier.verdict import Verdict, failed


class Says(Agent):
    """An agent that submits ``final`` as it is: what a hostile policy can make a model reply hold."""

    name = "says"

    def __init__(self, final: str) -> None:
        self.final = final

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        return AgentResult(attempt=Attempt(final=self.final), steps=[Step(self.final, None, None, 0.0)])


class Brittle(SubmissionEnvironment):
    """Its verifier crashes on an attempt holding "boom" (as a verifier bug an attempt found would), and
    on every attempt when ``broken`` (a verifier that cannot judge this task at all)."""

    name = "brittle"
    verifier_version = "1"

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def generate(self, seed: int, difficulty: int) -> Task:
        return Task(env=self.name, env_version="1", seed=seed, difficulty=difficulty, prompt="say ok")

    def reference(self, task: Task) -> Attempt:
        return Attempt(final="ok")

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        if self.broken or "boom" in attempt.final:
            raise KeyError("a path the verifier's author never tried")
        if attempt.final == "ok":
            return Verdict(reward=1.0, passed=True, status="ok", verifier_version="1")
        return failed("1", "not ok")


def job(env: str, difficulty: int = 1) -> Job:
    return Job(id=7, group_id=3, env=env, seed=5, difficulty=difficulty, agent="says", state=JobState.LEASED,
               attempts=1)


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[VerifyContext]:
    sandbox = Sandbox()
    try:
        yield VerifyContext(sandbox=sandbox, key=VerifierKey(b"k" * 32), scratch_dir=tmp_path)
    finally:
        await sandbox.close()


def no_box(tmp_path: Path) -> VerifyContext:
    return VerifyContext(sandbox=None, key=VerifierKey(b"k" * 32), scratch_dir=tmp_path)  # type: ignore[arg-type]


async def test_a_verifier_crash_an_attempt_causes_is_its_zero(tmp_path: Path) -> None:
    traj = await run_rollout(job("brittle"), Brittle(), Says("boom"), no_box(tmp_path), "n1")
    assert (traj.status, traj.reward, traj.passed) == ("ok", 0.0, False)
    assert VERIFIER_FAULT in traj.flags and "KeyError" in traj.reasons[0]
    fine = await run_rollout(job("brittle"), Brittle(), Says("ok"), no_box(tmp_path), "n1")
    assert fine.reward == 1.0 and not fine.flags


async def test_a_verifier_that_cannot_judge_the_reference_is_an_infrastructure_failure(tmp_path: Path) -> None:
    with pytest.raises(InfraFailure, match="reference"):
        await run_rollout(job("brittle"), Brittle(broken=True), Says("boom"), no_box(tmp_path), "n1")


class Unmakeable(Brittle):
    """Its task cannot be made: ``make_task`` raises ``error``, as an environment's generator or box would."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def make_task(self, seed: int, difficulty: int, ctx: VerifyContext) -> Task:
        raise self.error


@pytest.mark.parametrize(("error", "retried"), [
    (TaskError("no environment 'gone'"), False),
    (GeneratorBug("a puzzle broke its own invariant"), False),
    (PolicyError("a bound out of range"), False),
    (SandboxError("bwrap did not start"), True),
    (ContributedError("generate", "the box was killed"), True),
], ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v))
async def test_a_task_that_cannot_be_made_fails_the_job_as_its_error_kind_says(
        tmp_path: Path, error: Exception, retried: bool) -> None:
    with pytest.raises(InfraFailure, match="cannot make the task") as caught:
        await run_rollout(job("brittle"), Unmakeable(error), Says("ok"), no_box(tmp_path), "n1")
    assert caught.value.transient is retried and caught.value.__cause__ is error


class ContributedBrittle(Brittle):
    """A contributed verifier whose code an attempt broke: it fails as ``served`` reports it, a farm error."""

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        if "boom" in attempt.final:
            raise ContributedVerifierFailed("verify: the verifier's box ran out of memory")
        return await super().verify(task, attempt, ctx)


async def test_a_contributed_verifier_an_attempt_broke_gives_the_attempt_its_zero(tmp_path: Path) -> None:
    traj = await run_rollout(job("brittle"), ContributedBrittle(), Says("boom"), no_box(tmp_path), "n1")
    assert (traj.status, traj.reward, traj.passed) == ("ok", 0.0, False)
    assert VERIFIER_FAULT in traj.flags and "ContributedVerifierFailed" in traj.reasons[0]


class Refused(Agent):
    """An agent whose endpoint answers as ``error`` says."""

    name = "refused"

    def __init__(self, error: EndpointError) -> None:
        self.error = error

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        raise self.error


@pytest.mark.parametrize("transient", [True, False])
async def test_an_endpoint_failure_is_an_infrastructure_failure_that_says_whether_to_retry(
        tmp_path: Path, transient: bool) -> None:
    error = EndpointError("http://model/v1: 400 bad request", status=400, transient=transient)
    with pytest.raises(InfraFailure, match="endpoint failed") as caught:
        await run_rollout(job("brittle"), Brittle(), Refused(error), no_box(tmp_path), "n1")
    assert caught.value.transient is transient and caught.value.__cause__ is error


@pytest.mark.sandbox
@pytest.mark.parametrize("suffix", ["\n" + "x = " + "+".join(["1"] * 8000) + "\n", "\nx = " + "-" * 20000 + "1\n",
                                    "\nx = " + "(" * 300 + "1" + ")" * 300 + "\n"])
async def test_a_wrong_function_with_a_monster_expression_is_stored_with_its_zero(
        ctx: VerifyContext, suffix: str) -> None:
    env = get("py-func")
    task = env.generate(5, 1)
    wrong = f"def {task.entry_point}(x):\n    return None\n"
    plain = await run_rollout(job("py-func"), env, Says(wrong), ctx, "n1")
    assert (plain.status, plain.reward) == ("ok", 0.0)
    monster = await run_rollout(job("py-func"), env, Says(wrong + suffix), ctx, "n1")
    assert (monster.status, monster.reward, monster.passed) == ("ok", 0.0, False), monster.reasons


@pytest.mark.sandbox
@pytest.mark.parametrize("env_name", ["py-func", "kernel", "rg:chain_sum"])
async def test_a_lone_surrogate_is_repaired_flagged_and_storable(ctx: VerifyContext, env_name: str) -> None:
    env = get(env_name)
    task = env.generate(5, 1)
    final = env.reference(task).final + "\n# \ud800 \udfff\n" if env_name != "rg:chain_sum" else "\ud800"
    traj = await run_rollout(job(env_name), env, Says(final), ctx, "n1")
    assert traj.status == "ok" and INVALID_TEXT in traj.flags
    assert "\ufffd" in traj.final
    trajectory_pb(traj).SerializeToString()  # every field encodes: the record can travel


@pytest.mark.sandbox
async def test_a_reason_quoting_the_attempt_is_valid_text(ctx: VerifyContext) -> None:
    env = get("py-func")
    task = env.generate(5, 1)
    raising = f"def {task.entry_point}(x):\n    raise ValueError(chr(0xD800) * 3)\n"
    traj = await run_rollout(job("py-func"), env, Says(raising), ctx, "n1")
    assert (traj.status, traj.reward) == ("ok", 0.0)
    for reason in traj.reasons:
        reason.encode("utf-8")
    trajectory_pb(traj).SerializeToString()


@pytest.mark.sandbox
async def test_a_huge_reply_is_stored_once_and_within_bounds(ctx: VerifyContext) -> None:
    env = get("rg:chain_sum")
    huge = "<answer>1</answer>" + "x" * (30 << 20)
    traj = await run_rollout(job("rg:chain_sum"), env, Says(huge), ctx, "n1")
    assert traj.status == "ok" and TRUNCATED in traj.flags
    assert len(traj.final) <= MAX_FINAL_CHARS
    assert traj.steps and all(s.action == "" for s in traj.steps), "a submission step never repeats it"
    message: trajectory_pb2.Trajectory = trajectory_pb(traj)
    assert message.ByteSize() < 2 << 20
    assert message.steps[0].action == "" and message.task.prompt == traj.task.prompt != ""
