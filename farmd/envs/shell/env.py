"""The ``shell`` environment: tasks from puzzles, episodes over their trees, verdicts on what is left."""

from __future__ import annotations

import asyncio
import re

from farmd.envs.base import Attempt, Conduct, EpisodeEnvironment, Rule, Task, VerifyContext
from farmd.envs.shell.checks import check_answer, check_tree, disturbed, normalize_answer, read_regular
from farmd.envs.shell.episode import ShellEpisode
from farmd.envs.shell.puzzle import Puzzle
from farmd.envs.shell.puzzles import FAMILIES, build_puzzle, family_of
from farmd.envs.shell.rules import ACTION_NOUN, COMMON, MAX_FINAL_CHARS, MAX_STEPS, STEP_POLICY
from farmd.errors import GeneratorBug, TaskError
from farmd.text import valid_text
from farmd.verifier.verdict import (
    NO_ANSWER,
    RULE_BROKEN,
    SANDBOX_VIOLATION,
    SUSPECTED_HACK,
    TIMEOUT,
    Verdict,
    errored,
    failed,
)

_LINK_REASONS = ("symbolic link", "not a regular file", "hard link")


class Shell(EpisodeEnvironment[ShellEpisode]):
    """Filesystem and text puzzles solved with shell commands, checked on the final answer or file state."""

    name = "shell"
    version = "1"
    verifier_version = "2"
    """2: the task's rules held (a 31st command asked for, a command past its time, an answer out of its form:
    0); 1 judged an episode by its answer or files alone, and rewarded an attempt that asked for more commands
    than allowed once the ones run had solved it. Rescoring judges version 1's trajectories again."""
    max_difficulty = 5
    exploit_kind = "shell"
    max_steps = MAX_STEPS
    step_time_s = STEP_POLICY.wall_time_s
    action_noun = ACTION_NOUN

    def puzzle(self, seed: int, difficulty: int) -> Puzzle:
        """The whole truth of a task (its tree, goal and expected result); public data only."""
        self.check_difficulty(difficulty)
        return build_puzzle(self.name, self.version, seed, difficulty)

    def generate(self, seed: int, difficulty: int) -> Task:
        puzzle = self.puzzle(seed, difficulty)
        # Single output files are named; where whole directories are checked, the directories are.
        outputs = sorted(puzzle.expected) if puzzle.finish == "files" and not puzzle.scope else []
        return self.task(
            seed, difficulty, f"{puzzle.goal}\n\n{COMMON}", answer_format=puzzle.answer_format,
            metadata={"family": puzzle.family, "finish": puzzle.finish, "outputs": outputs,
                      "checked_dirs": list(puzzle.scope), "max_steps": MAX_STEPS, "files": len(puzzle.files)},
        )

    def reference(self, task: Task) -> Attempt:
        puzzle = self.puzzle(task.seed, task.difficulty)
        return Attempt(final=puzzle.answer, actions=list(puzzle.actions))

    async def episode(self, task: Task, ctx: VerifyContext) -> ShellEpisode:
        puzzle = self.puzzle(task.seed, task.difficulty)
        return await ShellEpisode.start(ctx.sandbox, puzzle.files, ctx.scratch_dir)

    def rules(self, task: Task) -> tuple[Rule, ...]:
        """The episode's rules (the command budget, each command's time), and for answer tasks the answer's
        form (``Puzzle.answer_form``), which the prompt states in ``answer_format``."""
        rules = super().rules(task)
        puzzle = self.puzzle(task.seed, task.difficulty)
        if puzzle.scope:  # what it sees of the tree is the verifier's: it flags a breach itself (_verdict)
            rules = (*rules, Rule("files left alone", puzzle.left_alone))
        if puzzle.finish != "answer":
            return rules
        form = re.compile(puzzle.answer_form)

        def malformed(c: Conduct) -> str | None:
            if len(c.final) > MAX_FINAL_CHARS:
                return f"the answer is longer than {MAX_FINAL_CHARS} characters"
            got = normalize_answer(c.final)
            return None if not got or form.fullmatch(got) else "the answer is not in that form"

        return (*rules, Rule("answer form", puzzle.answer_format, malformed))

    def families(self) -> tuple[str, ...]:
        return tuple(name for name, _ in FAMILIES)

    def family_of(self, seed: int, difficulty: int) -> str:
        return family_of(seed, difficulty)

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        """Replay the actions in a fresh episode (``EpisodeEnvironment.verify``), then check the final answer
        or the final tree.

        Everything is computed from the task's public identity: the agent saw the whole tree, so there is
        nothing to hide, and ``ctx.key`` is not used; guessing is defeated by exact, complete checks instead.
        """
        v = self.verifier_version
        try:
            self.puzzle(task.seed, task.difficulty)
        except (TaskError, GeneratorBug) as exc:
            return errored(v, f"cannot rebuild the task: {exc}")
        if not attempt.actions and not attempt.final.strip():
            return failed(v, "no actions and no answer", flags=(NO_ANSWER,))
        return await super().verify(task, attempt, ctx)

    async def judge_episode(self, task: Task, episode: ShellEpisode, final: str, ctx: VerifyContext) -> Verdict:
        """The verdict on an episode the agent has just played (a rollout's, not a replay)."""
        v = self.verifier_version
        final = valid_text(final)[0]
        try:
            puzzle = self.puzzle(task.seed, task.difficulty)
            problems = (check_answer(puzzle, final) if puzzle.finish == "answer"
                        else await asyncio.to_thread(check_tree, puzzle, episode.tree))
            planted = await asyncio.to_thread(_planted, puzzle, episode)
            moved = await asyncio.to_thread(disturbed, puzzle, episode.tree) if problems else []
        except (TaskError, GeneratorBug, OSError) as exc:
            return errored(v, f"cannot check the episode: {type(exc).__name__}: {exc}")
        verdict = _verdict(v, puzzle, episode, problems, planted)
        if moved:
            verdict.flag(RULE_BROKEN)
            verdict.reasons.insert(0, f"broke the task's rule on the files left alone ('{puzzle.left_alone}'): "
                                      f"{moved[0]}")
        return verdict


def _planted(puzzle: Puzzle, episode: ShellEpisode) -> dict[str, str]:
    """Expected files that are absent because a step left a link or a special file there instead."""
    return {p: why for p in puzzle.expected if (why := episode.dropped.get(p, "")) in _LINK_REASONS
            and read_regular(episode.tree, p) is None}


def _verdict(version: str, puzzle: Puzzle, episode: ShellEpisode, problems: list[str],
             planted: dict[str, str]) -> Verdict:
    verdict = failed(version)
    verdict.details = {"family": puzzle.family, "steps": episode.steps}
    if episode.violations:
        verdict.flag(SANDBOX_VIOLATION)
        verdict.details["violations"] = episode.violations[:10]
    if episode.timed_out:
        verdict.flag(TIMEOUT)
    # A link or special file left where the check expects a regular file is an attempt at the checker.
    if planted:
        verdict.flag(SUSPECTED_HACK)
        path, why = next(iter(planted.items()))
        problems = [f"{path} was left as a {why}: only regular files count", *problems]
    if problems:
        verdict.reasons = problems[:5]
        return verdict
    verdict.passed = True
    verdict.reward = 1.0
    verdict.reasons = ["the final answer is right" if puzzle.finish == "answer" else "the final files are right"]
    return verdict
