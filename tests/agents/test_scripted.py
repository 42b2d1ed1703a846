"""The scripted agents: ``random`` is deterministic, well formed, usually wrong and no exploit;
``reference`` passes in every environment."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

from farmd.agents import AgentError, AgentResult, RandomAgent, ReferenceAgent
from farmd.agents.scripted import SkilledAgent
from farmd.envs import get, names
from farmd.envs.base import Observation, Task, VerifyContext
from farmd.envs.kernel import static_problem
from farmd.envs.rg import ReasoningGym
from farmd.intake.exploits import for_kind
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from farmd.verifier.answer import extract_single_answer, several_candidates
from farmd.verifier.verdict import SUSPECTED_HACK
from tests.agents.fakes import ListEpisode

SUBMISSION_ENVS = [n for n in names() if n != "shell"]
SEEDS = range(4)


def tasks(env_name: str, seeds: range = SEEDS) -> list[Task]:
    env = get(env_name)
    return [env.generate(seed, 1 + seed % env.max_difficulty) for seed in seeds]


@asynccontextmanager
async def context(scratch: Path) -> AsyncIterator[VerifyContext]:
    sandbox = Sandbox()
    try:
        yield VerifyContext(sandbox=sandbox, key=VerifierKey(b"k" * 32), scratch_dir=scratch)
    finally:
        await sandbox.close()


async def run(agent: RandomAgent | ReferenceAgent, task: Task, ctx: VerifyContext | None) -> AgentResult:
    """One attempt, with a real episode for action tasks when there is a context (the runner's part)."""
    if task.kind != "actions" or ctx is None:
        return await agent.attempt(task, None, 0)
    episode = await get(task.env).episode(task, ctx)
    try:
        return await agent.attempt(task, episode, 0)
    finally:
        await episode.close()


# -- random, without boxes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("env_name", SUBMISSION_ENVS)
async def test_random_is_deterministic_per_task_and_seed(env_name: str) -> None:
    for task in tasks(env_name):
        first = await RandomAgent().attempt(task, None, 0)
        again = await RandomAgent().attempt(task, None, 5)
        assert first.attempt == again.attempt
    finals = {(await RandomAgent(seed).attempt(task, None, 0)).attempt.final
              for seed in range(8) for task in tasks(env_name, range(1))}
    assert len(finals) > 1, "the agent's seed changes nothing"


async def test_random_functions_compile_define_the_entry_point_and_miss_the_examples() -> None:
    for task in tasks("py-func", range(12)):
        result = await RandomAgent().attempt(task, None, 0)
        tree = ast.parse(result.attempt.final)
        assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == [task.entry_point]
        namespace: dict[str, object] = {}
        exec(result.attempt.final, namespace)  # our own agent's code, in a test
        fn = namespace[str(task.entry_point)]
        assert callable(fn)
        outputs = []
        for example in task.examples:
            try:
                outputs.append(fn(*example["input"]) == example["output"])
            except Exception:
                outputs.append(False)
        assert not all(outputs), f"seed {task.seed}: {result.attempt.final!r} answers every example"
        assert [(s.action, s.observation) for s in result.steps] == [(result.attempt.final, None)]


async def test_random_kernels_have_the_right_signature_shape_and_dtype() -> None:
    for task in tasks("kernel", range(10)):
        result = await RandomAgent().attempt(task, None, 0)
        assert static_problem(result.attempt.final) is None
        namespace: dict[str, object] = {}
        exec(result.attempt.final, namespace)  # our own agent's code, in a test
        fn = namespace["kernel"]
        assert callable(fn)
        args = [np.ones(shape, dtype=dtype) for _, shape, dtype in task.metadata["args"]]
        out = fn(*args)
        shape, dtype = task.metadata["out"]
        assert (list(out.shape), str(out.dtype)) == (shape, dtype)


@pytest.mark.parametrize("env_name", [n for n in SUBMISSION_ENVS if n.startswith("rg:")])
async def test_random_answers_are_one_clean_block(env_name: str) -> None:
    for task in tasks(env_name):
        result = await RandomAgent().attempt(task, None, 0)
        answer, problem = extract_single_answer(result.attempt.final)
        assert problem is None and answer
        assert several_candidates(answer, task.metadata["answer_kind"]) is None


async def test_random_shell_without_an_episode_still_gives_actions_and_a_guess() -> None:
    for task in tasks("shell", range(6)):
        result = await RandomAgent().attempt(task, None, 0)
        assert result.attempt.actions == ["find . -type f | sort | head -n 40"]
        assert result.attempt.final
        assert result.steps[0].observation is None


class TreeEpisode(ListEpisode):
    """Lists two files (one with a space in its name) for ``find``."""

    async def step(self, action: str) -> Observation:
        obs = await super().step(action)
        return Observation("./data/a.txt\n./data/b c.txt\n", 0) if action.startswith("find") else obs


async def test_random_shell_looks_at_what_the_episode_shows() -> None:
    task = tasks("shell", range(1))[0]
    episode = TreeEpisode()
    results = [await RandomAgent(seed).attempt(task, episode, 0) for seed in range(12)]
    actions = [a for r in results for a in r.attempt.actions]
    assert any(a.endswith("'data/b c.txt'") for a in actions), actions  # quoted for the shell
    assert all(1 <= len(r.attempt.actions) <= 3 for r in results)
    assert episode.commands == actions and not episode.closed


@pytest.mark.parametrize("env_name", [n for n in SUBMISSION_ENVS if n.startswith("rg:")])
async def test_random_answers_rarely_pass(env_name: str) -> None:
    env = get(env_name)
    assert isinstance(env, ReasoningGym)  # judged without a box: rg needs none
    verdicts = [env.judge(task, (await RandomAgent().attempt(task, None, 0)).attempt.final)
                for task in [env.generate(seed, 1) for seed in range(20)]]
    assert all(v.status == "ok" for v in verdicts)
    assert sum(v.passed for v in verdicts) <= 2


@pytest.mark.parametrize("env_name", names())
async def test_random_is_no_known_exploit(env_name: str) -> None:
    env = get(env_name)
    exploits = for_kind(env.exploit_kind)
    assert exploits
    for task in tasks(env_name):
        for seed in range(3):
            attempt = (await RandomAgent(seed).attempt(task, None, 0)).attempt
            for exploit in exploits:
                assert exploit.make(task) != attempt, f"random is the exploit {exploit.name}"


async def test_reference_without_an_episode() -> None:
    env = get("shell")
    task = env.generate(2, 3)
    result = await ReferenceAgent().attempt(task, None, 0)
    assert result.attempt == env.reference(task)
    assert [s.action for s in result.steps] == env.reference(task).actions


async def test_skilled_solves_less_as_tasks_get_harder() -> None:
    env = get("rg:chain_sum")
    agent = SkilledAgent(2.5)
    assert agent.p_solve(1) > 0.8 > agent.p_solve(2) > 0.5 > agent.p_solve(3) > agent.p_solve(5)
    rates = {}
    for difficulty in (1, 4):
        task = env.generate(9, difficulty)
        reference = env.reference(task).final
        finals = [(await agent.attempt(task, None, 0)).attempt.final for _ in range(200)]
        rates[difficulty] = sum(f == reference for f in finals) / len(finals)
    assert rates[1] > 0.7 and rates[4] < 0.4, rates  # 0.82 and 0.18 expected


async def test_reference_refuses_a_task_of_another_version() -> None:
    task = get("py-func").generate(1, 1)
    old = Task(**{**task.__dict__, "env_version": "0"})
    with pytest.raises(AgentError, match="version 0"):
        await ReferenceAgent().attempt(old, None, 0)


# -- with boxes -------------------------------------------------------------------------------------------

@pytest.mark.sandbox
@pytest.mark.parametrize("env_name", names())
async def test_reference_passes_and_random_fails_in_every_environment(env_name: str, tmp_path: Path) -> None:
    env = get(env_name)
    task = env.generate(7, 2)
    async with context(tmp_path) as ctx:
        reference = await run(ReferenceAgent(), task, ctx)
        randoms = [await run(RandomAgent(seed), task, ctx) for seed in range(2)]
        verdicts = await asyncio.gather(env.verify(task, reference.attempt, ctx),
                                        *[env.verify(task, r.attempt, ctx) for r in randoms])
    ref_verdict, *random_verdicts = verdicts
    assert ref_verdict.passed, ref_verdict.reasons
    for result, verdict in zip(randoms, random_verdicts, strict=True):
        assert verdict.status == "ok" and not verdict.passed, (result.attempt, verdict.reasons)
        assert SUSPECTED_HACK not in verdict.flags, (result.attempt, verdict.reasons)
    if task.kind == "actions":
        assert reference.attempt.actions and all(s.observation is not None for s in reference.steps)
        for result in randoms:
            assert 1 <= len(result.steps) <= 3
            assert result.steps[0].observation and result.steps[0].exit_code == 0
