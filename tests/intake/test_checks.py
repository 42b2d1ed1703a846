"""Tier-1 checks: every built-in environment passes them, and each broken environment gets its finding."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from farmd.envs import Attempt, Task, VerifyContext, get, names
from farmd.envs.rg import ReasoningGym
from farmd.intake.checks import Finding, check_environment
from farmd.sandbox import Sandbox, SandboxConfig
from farmd.verifier import Verdict, VerifierKey

KEY = VerifierKey(b"intake-check-key" * 2)
# Answer tasks are judged on the host: this sandbox is never started.
HOST_CTX = VerifyContext(sandbox=Sandbox(), key=KEY)
HOST_JUDGED = [n for n in names() if n.startswith(("rg:", "arith"))]
BOXED = [n for n in names() if n not in HOST_JUDGED]


@pytest.fixture
async def boxed_ctx() -> AsyncIterator[VerifyContext]:
    async with Sandbox(SandboxConfig(warm_boxes=2)) as sandbox:
        yield VerifyContext(sandbox=sandbox, key=KEY)


@pytest.mark.parametrize("name", names())
async def test_every_builtin_passes_the_checks_that_need_no_box(name: str) -> None:
    assert await check_environment(get(name)) == []


@pytest.mark.parametrize("name", HOST_JUDGED)
async def test_answer_environments_pass_every_check(name: str) -> None:
    assert await check_environment(get(name), HOST_CTX) == []


@pytest.mark.sandbox
@pytest.mark.parametrize("name", BOXED)
async def test_boxed_environments_pass_every_check(name: str, boxed_ctx: VerifyContext) -> None:
    assert await check_environment(get(name), boxed_ctx, seeds=(0, 1)) == []


class _Arithmetic(ReasoningGym):
    def __init__(self) -> None:
        super().__init__("basic_arithmetic")


class Nondeterministic(_Arithmetic):
    _calls = itertools.count()

    def generate(self, seed: int, difficulty: int) -> Task:
        task = super().generate(seed, difficulty)
        return replace(task, prompt=f"{task.prompt}\n(request {next(self._calls)})")


class PassesEverything(_Arithmetic):
    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        return Verdict(reward=1.0, passed=True, status="ok", verifier_version=self.verifier_version)


class WrongReference(_Arithmetic):
    def reference(self, task: Task) -> Attempt:
        return Attempt(final="<answer>not a number</answer>")


class OneTaskForAll(_Arithmetic):
    def generate(self, seed: int, difficulty: int) -> Task:
        return replace(super().generate(0, difficulty), seed=seed)


class FlatLevels(_Arithmetic):
    def generate(self, seed: int, difficulty: int) -> Task:
        return replace(super().generate(seed, 1), difficulty=difficulty)


class LeaksTheAnswer(_Arithmetic):
    def generate(self, seed: int, difficulty: int) -> Task:
        task = super().generate(seed, difficulty)
        return replace(task, prompt=f"{task.prompt}\nHint: {super().reference(task).final}")


class Unnamed(_Arithmetic):
    def __init__(self) -> None:
        super().__init__()  # which sets its own name and levels: unset them after
        self.name, self.verifier_version, self.max_difficulty = "", "", 0


def _checks(found: list[Finding]) -> set[str]:
    return {f.check for f in found}


@pytest.mark.parametrize(("env", "check"), [
    (Nondeterministic(), "check_deterministic"),
    (PassesEverything(), "check_empty_fails"),
    (WrongReference(), "check_reference_passes"),
    (OneTaskForAll(), "check_seeds_distinct"),
    (FlatLevels(), "check_levels_differ"),
    (LeaksTheAnswer(), "check_answer_not_public"),
    (Unnamed(), "check_attributes"),
])
async def test_a_broken_environment_gets_its_finding(env: ReasoningGym, check: str) -> None:
    found = await check_environment(env, HOST_CTX)
    assert check in _checks(found), found
    for finding in found:
        assert finding.evidence and finding.fix  # says what is wrong and what to do about it


async def test_findings_name_the_evidence() -> None:
    found = await check_environment(WrongReference(), HOST_CTX, levels=[1])
    assert _checks(found) == {"check_reference_passes"}
    assert all("seed" in f.evidence and "reference" in f.evidence for f in found)
    attrs = await check_environment(Unnamed(), HOST_CTX)
    assert {f.evidence.split(" is ")[0] for f in attrs} == {"name", "verifier_version", "max_difficulty"}


async def test_checks_that_judge_run_only_with_a_context() -> None:
    assert await check_environment(PassesEverything()) == []
    assert await check_environment(WrongReference()) == []
