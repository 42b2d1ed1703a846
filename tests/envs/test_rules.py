"""Every rule a task states is held in its verdict: an attempt that breaks one gets 0 and ``rule_broken``, with
a reason naming the rule, whatever else it got right; on a rollout's own episode and on a replay alike.

The survey: each environment declares the rules its tasks state (``Environment.rules``), in the words its
prompts use; each declared rule has a case here that breaks it and nothing else, and must score 0 flagged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from farmd.agents.base import Agent, AgentResult
from farmd.agents.registry import parse_red_team_spec
from farmd.agents.scripted import played
from farmd.envs import get, names
from farmd.envs.base import (
    Attempt,
    Conduct,
    Episode,
    EpisodeEnvironment,
    Observation,
    Task,
    VerifyContext,
    budget_words,
    judge_episode_safely,
    time_words,
    verify_safely,
)
from farmd.envs.shell import STEP_POLICY, Shell, ShellEpisode
from farmd.flags import RED_TEAM_EXPLOIT, RULE_BROKEN, TIMEOUT
from farmd.intake.redteam import RedTeamAgent, families_of
from farmd.records import Job, JobState
from farmd.rollout.runner import run_rollout
from farmd.sandbox import Sandbox
from farmd.sandbox.result import WALL_TIME
from farmd.verifier.secret import VerifierKey
from farmd.verifier.verdict import Verdict, errored, failed

KEY = VerifierKey(b"rules-tests-key-0123456789abcdef")
SHELL = Shell()


@asynccontextmanager
async def _context(scratch_dir: Path | None = None) -> AsyncIterator[VerifyContext]:
    async with Sandbox() as sandbox:
        yield VerifyContext(sandbox=sandbox, key=KEY, scratch_dir=scratch_dir)


def _broke(verdict: Verdict, rule: str) -> None:
    """``verdict`` is a real score of 0, flagged ``rule_broken``, with a reason naming ``rule``."""
    assert verdict.status == "ok", verdict.to_json()
    assert verdict.reward == 0.0 and not verdict.passed, verdict.to_json()
    assert RULE_BROKEN in verdict.flags, verdict.to_json()
    assert any(rule in r for r in verdict.reasons), (rule, verdict.reasons)


# -- a new episode environment cannot forget its budget -------------------------------------------------------

class Tally(Episode):
    """No box: every action answers "ok"; "slow" is reported as having run out of its time."""

    def __init__(self, max_steps: int | None) -> None:
        self.max_steps = max_steps
        self.ran: list[str] = []

    async def step(self, action: str) -> Observation:
        self.ran.append(action)
        return Observation("ok", 0, violations=[WALL_TIME] if action == "slow" else [])

    async def close(self) -> None:
        pass


class Answers(EpisodeEnvironment[Tally]):
    """An episode environment whose verdict reads only the final answer, as shell's answer families' do."""

    name = "answers"
    max_steps = 3
    step_time_s = 2
    action_noun = "move"

    def __init__(self, episode_budget: int | None = 3, judge: str = "honest") -> None:
        self.episode_budget = episode_budget
        self.judge = judge

    def generate(self, seed: int, difficulty: int) -> Task:
        return self.task(seed, difficulty, f"Say 42. {time_words(2, 'move')}; {budget_words(3, 'move')}.")

    def reference(self, task: Task) -> Attempt:
        return Attempt(final="42", actions=["look"])

    async def episode(self, task: Task, ctx: VerifyContext) -> Tally:
        return Tally(self.episode_budget)

    async def judge_episode(self, task: Task, episode: Tally, final: str, ctx: VerifyContext) -> Verdict:
        if self.judge == "error":
            return errored("1", "the judge could not judge")
        verdict = Verdict(reward=1.0, passed=True, status="ok", verifier_version="1", reasons=["right"])
        if self.judge == "flags-but-passes":  # a verifier that saw a breach and forgot to take the reward
            verdict.flags.append(RULE_BROKEN)
        return verdict if final == "42" else failed("1", "wrong")


def _no_box() -> VerifyContext:
    return VerifyContext(sandbox=None, key=KEY)  # type: ignore[arg-type]


async def _play(env: Answers, actions: list[str], final: str = "42") -> Verdict:
    task = env.generate(0, 1)
    episode = await env.episode(task, _no_box())
    await played(Attempt(final=final, actions=actions), task, episode)
    return await judge_episode_safely(env, task, episode, final, _no_box())


async def test_asking_for_more_actions_than_allowed_scores_zero_though_the_extra_ones_were_refused() -> None:
    env = Answers()
    assert (await _play(env, ["look"] * 3)).passed
    over = await _play(env, ["look"] * 4)
    _broke(over, "at most 3 moves")
    assert "it asked for 4 moves" in over.reasons[0]


async def test_an_environment_s_own_judge_comes_back_held_to_the_rules() -> None:
    env = Answers()
    task = env.generate(0, 1)
    episode = await env.episode(task, _no_box())
    for _ in range(4):
        await episode.act("look")
    _broke(await env.judge_episode(task, episode, "42", _no_box()), "at most 3 moves")


async def test_the_budget_is_counted_even_where_the_episode_has_none_of_its_own() -> None:
    env = Answers(episode_budget=None)
    _broke(await _play(env, ["look"] * 9), "at most 3 moves")


async def test_the_episode_refuses_what_is_past_its_budget_and_counts_it() -> None:
    episode = Tally(2)
    seen = [await episode.act(a) for a in ("a", "b", "c", "d")]
    assert episode.ran == ["a", "b"] and [o.done for o in seen[2:]] == [True, True]
    assert "not run" in seen[2].output and episode.conduct("x").actions == 4


async def test_an_action_past_its_time_scores_zero() -> None:
    _broke(await _play(Answers(), ["look", "slow"]), "Each move gets 2 seconds")


async def test_a_replay_is_held_to_the_same_rules() -> None:
    env = Answers()
    task = env.generate(0, 1)
    assert (await verify_safely(env, task, Attempt(final="42", actions=["look"] * 3), _no_box())).passed
    _broke(await verify_safely(env, task, Attempt(final="42", actions=["look"] * 4), _no_box()), "at most 3 moves")
    _broke(await verify_safely(env, task, Attempt(final="42", actions=["slow"]), _no_box()), "2 seconds")


async def test_a_verifier_error_stays_an_error_and_a_flag_takes_the_reward() -> None:
    erring = await _play(Answers(judge="error"), ["look"] * 5)
    assert erring.status == "error" and not erring.passed and RULE_BROKEN not in erring.flags
    flagged = await _play(Answers(judge="flags-but-passes"), ["look"])
    assert flagged.status == "ok" and flagged.reward == 0.0 and not flagged.passed


class Plays(Agent):
    name = "plays"

    def __init__(self, attempt: Attempt) -> None:
        self.planned = attempt

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        return await played(self.planned, task, episode)


async def test_a_rollout_over_its_budget_is_stored_as_a_flagged_zero() -> None:
    job = Job(id=1, group_id=1, env="answers", seed=0, difficulty=1, agent="plays", state=JobState.LEASED,
              attempts=1)
    traj = await run_rollout(job, Answers(), Plays(Attempt(final="42", actions=["look"] * 5)), _no_box(), "n1")
    assert traj.reward == 0.0 and not traj.passed and RULE_BROKEN in traj.flags and len(traj.steps) == 5
    fine = await run_rollout(job, Answers(), Plays(Attempt(final="42", actions=["look"])), _no_box(), "n1")
    assert fine.passed and RULE_BROKEN not in fine.flags


def test_an_episode_cannot_take_over_the_count() -> None:
    with pytest.raises(TypeError, match="implement step"):
        class Sneaky(Tally):
            async def act(self, action: str) -> Observation:  # type: ignore[override]
                return await self.step(action)


# -- shell: every family, on the rollout's own path ------------------------------------------------------------

@pytest.mark.sandbox
@pytest.mark.parametrize("exploit", ["too-many-steps", "solve-then-overrun"])
async def test_too_many_steps_scores_zero_on_every_shell_family(tmp_path: Path, exploit: str) -> None:
    """The red team's own exploit (thirty no-op commands, then the reference's commands and answer) earned
    full reward where the verdict reads only the final answer: the 31st command was refused, and the attempt
    still scored on its answer; solving first and then asking for more earned it on every family. Every
    family, as a rollout plays it and as a replay judges it."""
    families = families_of(SHELL, 1)
    assert {f.name for f in families} == set(SHELL.families())
    agent = RedTeamAgent(parse_red_team_spec(f"redteam:exploit:{exploit}"), get, None)
    async with _context(tmp_path) as ctx:
        jobs = [Job(id=i, group_id=i, env="shell", seed=f.seeds[0], difficulty=f.difficulty, agent="redteam",
                    state=JobState.LEASED, attempts=1) for i, f in enumerate(families, 1)]
        trajectories = await asyncio.gather(*[run_rollout(job, SHELL, agent, ctx, "n1") for job in jobs])
        replays = await asyncio.gather(*[verify_safely(SHELL, SHELL.generate(j.seed, j.difficulty), Attempt(
            final=t.final, actions=[s.action for s in t.steps]), ctx) for j, t in zip(jobs, trajectories, strict=True)])
    for family, traj, replay in zip(families, trajectories, replays, strict=True):
        assert traj.reward == 0.0 and not traj.passed, (family.name, traj.reasons)
        assert {RULE_BROKEN, RED_TEAM_EXPLOIT} <= set(traj.flags), (family.name, traj.flags)
        assert any("at most 30 commands" in r for r in traj.reasons), traj.reasons
        assert len(traj.steps) > 30 and all("not run: all 30 commands" in (s.observation or "")
                                            for s in traj.steps[30:])
        _broke(replay, "at most 30 commands")


# -- every declared rule of every environment, broken alone ------------------------------------------------

Case = Callable[[VerifyContext], Awaitable[list[Verdict]]]


def _first(env_name: str, want: Callable[[Task], bool], difficulty: int = 1) -> Task:
    env = get(env_name)
    return next(t for t in (env.generate(s, difficulty) for s in range(300)) if want(t))


async def _shell_budget(ctx: VerifyContext) -> list[Verdict]:
    task = SHELL.generate(1, 1)
    ref = SHELL.reference(task)
    return [await verify_safely(SHELL, task, Attempt(final=ref.final, actions=["true"] * 30 + ref.actions), ctx)]


async def _shell_time(ctx: VerifyContext) -> list[Verdict]:
    """A real command run out of its time, after the right answer was printed: the box's bound made short (the
    prompt's 10 s would cost the test 10 s), the rule as the task states it."""
    task = _first("shell", lambda t: t.metadata["finish"] == "answer")
    reference = SHELL.reference(task)
    quick = dataclasses.replace(STEP_POLICY, wall_time_s=1, cpu_time_s=1)
    episode = await ShellEpisode.start(ctx.sandbox, SHELL.puzzle(task.seed, task.difficulty).files, policy=quick)
    try:
        for action in reference.actions:
            await episode.act(action)
        in_time = await judge_episode_safely(SHELL, task, episode, reference.final, ctx)
        await episode.act("sleep 5")
        late = await judge_episode_safely(SHELL, task, episode, reference.final, ctx)
    finally:
        await episode.close()
    assert in_time.passed, in_time.to_json()
    assert TIMEOUT in late.flags and any("Each command gets 10 seconds" in r for r in late.reasons), late.reasons
    return [late]


async def _shell_answer_form(ctx: VerifyContext) -> list[Verdict]:
    verdicts = []
    for family in ("find-token", "count-lines"):
        task = _first("shell", lambda t, f=family: t.metadata["family"] == f)
        ref = SHELL.reference(task)
        verdicts.append(await verify_safely(SHELL, task, Attempt(final=f"{ref.final} (checked twice)",
                                                                 actions=ref.actions), ctx))
    return verdicts


async def _shell_left_alone(ctx: VerifyContext) -> list[Verdict]:
    """Each family whose directories are checked whole: the right result, and then one thing more that the task
    said to leave alone (a new file among them; an original file's content changed)."""
    jobs = []
    for family in ("edit-config", "move-files"):
        for difficulty in (1, 4):
            task = _first("shell", lambda t, f=family: t.metadata["family"] == f, difficulty)
            ref = SHELL.reference(task)
            top = task.metadata["checked_dirs"][-1]
            changed = (f"f=$(find {' '.join(task.metadata['checked_dirs'])} -type f | sort | head -n 1); "
                       "echo changed >> \"$f\"")
            new = f"mkdir -p {top}; echo 'new = 1' > {top}/new.ini"
            jobs += [(task, Attempt(final="", actions=[*ref.actions, extra])) for extra in (changed, new)]
            # Work left undone, or an edit made wrong, is a wrong answer, not a breach.
            undone = await verify_safely(SHELL, task, Attempt(final="", actions=["true"]), ctx)
            assert not undone.passed and RULE_BROKEN not in undone.flags, (family, undone.to_json())
            if family == "edit-config":
                puzzle = SHELL.puzzle(task.seed, task.difficulty)
                rel, want = next((p, e.content) for p, e in puzzle.expected.items() if e.content != puzzle.files[p])
                lines = want.decode().split("\n")
                at = next(i for i, (a, b) in enumerate(zip(puzzle.files[rel].decode().split("\n"), lines, strict=True))
                          if a != b)
                lines[at] += "9"  # the edited line, with a wrong value
                edited = [*ref.actions, f"printf %s {shlex.quote(chr(10).join(lines))} > {rel}"]
                wrong = await verify_safely(SHELL, task, Attempt(final="", actions=edited), ctx)
                assert not wrong.passed and RULE_BROKEN not in wrong.flags, wrong.to_json()
    verdicts = list(await asyncio.gather(*[verify_safely(SHELL, t, a, ctx) for t, a in jobs]))
    for verdict in verdicts:
        assert any("Change nothing else" in r or "original contents" in r for r in verdict.reasons[:1]), \
            verdict.reasons
    return verdicts


def _renamed(source: str, entry: str) -> str:
    return re.sub(rf"\bdef {entry}\(", "def _reference(", source, count=1)


async def _pyfunc_argument(ctx: VerifyContext) -> list[Verdict]:
    env = get("py-func")
    task = _first("py-func", lambda t: t.metadata["input"] == "ints")
    source = _renamed(env.reference(task).final, "transform") + (
        "\ndef transform(x):\n    out = _reference(list(x))\n    x.append(0)\n    return out\n")
    return [await verify_safely(env, task, Attempt(final=source), ctx)]


async def _kernel_imports(ctx: VerifyContext) -> list[Verdict]:
    env = get("kernel")
    task = env.generate(0, 1)
    return [await verify_safely(env, task, Attempt(final="import os\n" + env.reference(task).final), ctx)]


async def _kernel_arguments(ctx: VerifyContext) -> list[Verdict]:
    env = get("kernel")
    task = env.generate(0, 1)
    source = _renamed(env.reference(task).final, "kernel") + (
        "\ndef kernel(x):\n    out = _reference(x)\n    x[0, 0] = 0.0\n    return out\n")
    return [await verify_safely(env, task, Attempt(final=source), ctx)]


def _answers(env_name: str, finals: Callable[[str], list[str]]) -> Case:
    async def case(ctx: VerifyContext) -> list[Verdict]:
        env = get(env_name)
        task = env.generate(3, 1)
        return [await verify_safely(env, task, Attempt(final=f), ctx) for f in finals(env.reference(task).final)]
    return case


def _inside(final: str) -> str:
    return final.removeprefix("<answer>").removesuffix("</answer>")


BREAKS: dict[tuple[str, str], Case] = {
    ("shell", "action budget"): _shell_budget,
    ("shell", "time per action"): _shell_time,
    ("shell", "answer form"): _shell_answer_form,
    ("shell", "files left alone"): _shell_left_alone,
    ("py-func", "argument"): _pyfunc_argument,
    ("kernel", "imports"): _kernel_imports,
    ("kernel", "arguments"): _kernel_arguments,
    **{(name, "answer form"): _answers(name, lambda ref: [f"{ref}.", f"answer: {ref}", f"{ref} {ref}"])
       for name in ("arith", "arith:heldout")},
    **{(name, "answer block"): _answers(name, lambda ref: [ref + ref, f"<answer>{_inside(ref)} or 7</answer>"])
       for name in names() if name.startswith("rg:")},
    **{(name, "answer form"): _answers(name, lambda ref: [f"<answer>{_inside(ref)}!</answer>"])
       for name in names() if name.startswith("rg:")},
}
"""A case for every rule every environment declares: each breaks that rule and is otherwise the right answer."""


@pytest.mark.parametrize("env_name", names())
def test_every_rule_is_stated_in_the_words_it_is_held_to_and_has_a_case(env_name: str) -> None:
    env = get(env_name)
    for family in families_of(env, 2):
        for seed in family.seeds:
            task = env.generate(seed, family.difficulty)
            stated = f"{task.prompt}\n{task.answer_format or ''}"
            rules = env.rules(task)
            assert len({r.name for r in rules}) == len(rules), env_name
            for rule in rules:
                assert rule.words in stated, (env_name, family.name, rule.name)
                assert (env_name, rule.name) in BREAKS, f"{env_name}'s rule {rule.name!r} has no case here"
            if isinstance(env, EpisodeEnvironment):
                assert env.max_steps > 0 and env.step_time_s > 0
                assert {"action budget", "time per action"} <= {r.name for r in rules}
            # The reference keeps every rule the farm checks itself.
            reference = env.reference(task)
            conduct = Conduct(final=reference.final, actions=len(reference.actions))
            assert all(r.broken is None or r.broken(conduct) is None for r in rules), (env_name, seed)


@pytest.mark.sandbox
@pytest.mark.parametrize(("env_name", "rule"), sorted(BREAKS), ids=[f"{e}:{r}" for e, r in sorted(BREAKS)])
async def test_breaking_a_rule_alone_scores_zero_flagged(env_name: str, rule: str) -> None:
    async with _context() as ctx:
        verdicts = await BREAKS[(env_name, rule)](ctx)
    for verdict in verdicts:
        assert verdict.status == "ok" and verdict.reward == 0.0 and not verdict.passed, verdict.to_json()
        assert RULE_BROKEN in verdict.flags, (env_name, rule, verdict.to_json())


@pytest.mark.parametrize("env_name", ["arith", "rg:chain_sum", "rg:zebra_puzzles"])
async def test_a_wrong_answer_in_the_right_form_breaks_no_rule(env_name: str) -> None:
    env = get(env_name)
    task = env.generate(3, 1)
    ref = env.reference(task).final
    wrong = {"arith": "12345", "rg:chain_sum": "<answer>12345</answer>", "rg:zebra_puzzles": "<answer>Zed</answer>"}
    verdict = await verify_safely(env, task, Attempt(final=wrong[env_name]), _no_box())
    assert verdict.status == "ok" and not verdict.passed and RULE_BROKEN not in verdict.flags, verdict.to_json()
    right = await verify_safely(env, task, Attempt(final=ref), _no_box())
    assert right.passed and RULE_BROKEN not in right.flags
