"""Scripted agents: ``reference`` (the environment's own answer), ``random`` (a plausible wrong one)
and ``skilled:S`` (one or the other, by a skill against the task's difficulty).

Both are controls. ``reference`` checks the pipeline end to end: every one of its
attempts must pass. ``random`` must usually fail while looking like an honest
attempt (the right entry point, dtype and shape, one ``<answer>`` block, a few
harmless commands), so that a verifier rewarding it, or an infrastructure path that
mangles it, stands out. It is deliberately none of the exploit library's attacks:
those are tested against the verifiers elsewhere, and a control that games a
verifier would measure the wrong thing.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
import random
import re
import shlex
import time
from collections.abc import Callable
from typing import Any

from farmd.agents.base import Agent, AgentResult, Step
from farmd.envs.base import Attempt, Environment, Episode, Task, VerifyContext
from farmd.envs.catalog import EnvLookup
from farmd.envs.registry import get as get_env
from farmd.errors import AgentError


def _submission(final: str) -> AgentResult:
    return AgentResult(attempt=Attempt(final=final), steps=[Step(final, None, None, 0.0)])


async def _run(episode: Episode, command: str, steps: list[Step]) -> bool:
    """Run ``command`` through the episode, record it; whether the episode is done."""
    started = time.monotonic()
    obs = await episode.act(command)
    steps.append(Step(command, obs.output, obs.exit_code, time.monotonic() - started, obs.violations))
    return obs.done


class ReferenceAgent(Agent):
    """Submits the environment's reference attempt; replays its actions through the episode, so the
    trajectory holds real observations."""

    name = "reference"

    def __init__(self, envs: EnvLookup | None = None, ctx: VerifyContext | None = None) -> None:
        self._envs = envs or get_env
        self._ctx = ctx
        """The node's boxes, for environments whose reference runs in one (contributed ones); None: only
        environments with a reference of their own (the built-ins) can be answered."""

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        env = self._envs(task.env)
        if env.version != task.env_version:
            raise AgentError(f"{task.env}: the task is of version {task.env_version}, the environment "
                             f"here is version {env.version}; its reference would answer another task")
        return await played(await reference_of(env, task, self._ctx), task, episode)


async def reference_of(env: Environment, task: Task, ctx: VerifyContext | None) -> Attempt:
    """``env``'s reference attempt at ``task``: in the node's boxes when it has them (a contributed
    environment's reference runs in one), else the environment's own (a built-in's)."""
    if ctx is None:
        return await asyncio.to_thread(env.reference, task)
    return await env.make_reference(task, ctx)


async def played(attempt: Attempt, task: Task, episode: Episode | None) -> AgentResult:
    """A scripted attempt as an agent's result: a submission as it is, an action task's actions replayed
    through the episode, so the trajectory holds real observations."""
    if task.kind != "actions":
        return _submission(attempt.final)
    steps: list[Step] = []
    for action in attempt.actions:
        if episode is None:
            steps.append(Step(action, None, None, 0.0))
        else:
            await _run(episode, action, steps)
    return AgentResult(attempt=Attempt(final=attempt.final, actions=list(attempt.actions)), steps=steps)


# -- random ---------------------------------------------------------------------------------------------

# Simple transforms per (input kind, output kind) of py-func-like tasks: what a model that
# misread the task might write. None of them is the exploit library's echo or zero.
_FUNCTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("ints", "ints"): ("sorted(x)", "x[::-1]", "[v + 1 for v in x]", "[v * 2 for v in x]", "x[1:]",
                       "[v for v in x if v > 0]"),
    ("ints", "int"): ("len(x)", "sum(x)", "(max(x) if x else 1)", "sum(x) // 2", "1"),
    ("ints", "str"): ("' '.join(str(v) for v in x)", "str(x)", "str(len(x))"),
    ("int", "int"): ("x + 1", "x * 2", "abs(x)", "x % 10", "1"),
    ("int", "ints"): ("[x]", "[x, x]", "[int(c) for c in str(abs(x))][::-1]"),
    ("int", "str"): ("str(x)", "str(abs(x))[::-1]"),
    ("str", "str"): ("x.upper()", "x[::-1]", "x.title()", "x.replace(' ', '')", "x.strip().lower()"),
    ("str", "int"): ("len(x)", "x.count('a')", "len(x.split())"),
    ("str", "ints"): ("[len(x)]", "[ord(c) for c in x[:3]]", "[len(w) for w in x.split()][::-1]"),
}
_ANY_FUNCTION = ("1", "None", "[]")

# Wrong but honest NumPy: the first argument, reshaped to the output by np.resize, then transformed.
_KERNELS = ("np.tanh(y)", "np.abs(y)", "y * 0.5", "np.sort(y, axis=-1)", "np.cumsum(y, axis=0)")

_NAMES = ("Hugo", "Mabel", "Otto", "Ingrid", "Quentin", "Yara", "Zeke", "Wanda")
_NUMBERS_GIVEN = re.compile(r"numbers?:\s*(-?\d+(?:\s*,\s*-?\d+)+)")


@functools.lru_cache(maxsize=64)
def _lambda(expr: str) -> Callable[[Any], Any]:
    fn: Callable[[Any], Any] = eval(f"lambda x: {expr}", {})  # our own constants above, never task text
    return fn


def _matches_examples(expr: str, task: Task) -> bool:
    """Whether ``expr`` answers every public example (it would likely pass: not a wrong attempt)."""
    if not task.examples:
        return False
    fn = _lambda(expr)
    try:
        return all(fn(*copy.deepcopy(e["input"])) == e["output"] for e in task.examples)
    except Exception:  # a transform that cannot take this input is wrong, as wanted
        return False


def random_function(task: Task, rng: random.Random) -> str:
    """A function with the task's entry point that computes something simple, chosen among those that miss
    a public example (py-func's hidden tests include its examples, so it fails there)."""
    kinds = (str(task.metadata.get("input", "")), str(task.metadata.get("output", "")))
    candidates = list(_FUNCTIONS.get(kinds, _ANY_FUNCTION))
    rng.shuffle(candidates)
    expr = next((c for c in candidates if not _matches_examples(c, task)), candidates[-1])
    return f"def {task.entry_point}(x):\n    return {expr}\n"


def random_kernel(task: Task, rng: random.Random) -> str:
    """A NumPy kernel of the right signature, output shape and dtype, computing the wrong thing."""
    args = [str(a[0]) for a in task.metadata.get("args", [])] or ["x"]
    shape, dtype = task.metadata.get("out", [[1], "float32"])
    body = rng.choice(_KERNELS)
    return (f"import numpy as np\n\n\ndef {task.entry_point}({', '.join(args)}):\n"
            f"    y = np.resize({args[0]}, {tuple(int(n) for n in shape)!r})\n"
            f"    return np.ascontiguousarray({body}, dtype={str(dtype)!r})\n")


def random_answer(task: Task, rng: random.Random) -> str:
    """One ``<answer>`` block with a plausible candidate of the right kind."""
    kind = task.metadata.get("answer_kind")
    if kind == "expression":
        found = _NUMBERS_GIVEN.search(task.prompt)
        if found:
            numbers = [n.strip() for n in found.group(1).split(",")]
            rng.shuffle(numbers)
            expr = numbers[0]
            for n in numbers[1:]:
                expr += f" {rng.choice('+-*')} {n}"
            return f"<answer>{expr}</answer>"
    if kind == "word" or (kind is None and rng.random() < 0.5):
        return f"<answer>{rng.choice(_NAMES)}</answer>"
    return f"<answer>{rng.randint(-9, 99)}</answer>"


_LIST_FILES = "find . -type f | sort | head -n 40"
_LOOK = ("cat -- {f}", "head -n 20 -- {f}", "wc -l -- {f}")


class RandomAgent(Agent):
    """A plausible wrong attempt, deterministic in the task's identity, the agent's seed and (for
    action tasks) what the episode shows."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.name = "random" if seed == 0 else f"random:{seed}"

    def rng(self, task: Task) -> random.Random:
        return random.Random(f"farm-random/{self.seed}/{task.env}/{task.env_version}/{task.seed}/{task.difficulty}")

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        rng = self.rng(task)
        if task.kind == "actions":
            return await self._act(task, episode, rng)
        if task.entry_point and "out" in task.metadata and "args" in task.metadata:
            return _submission(random_kernel(task, rng))
        if task.entry_point:
            return _submission(random_function(task, rng))
        return _submission(random_answer(task, rng))

    async def _act(self, task: Task, episode: Episode | None, rng: random.Random) -> AgentResult:
        steps: list[Step] = []
        files: list[str] = []
        if episode is None:
            steps.append(Step(_LIST_FILES, None, None, 0.0))
        else:
            done = await _run(episode, _LIST_FILES, steps)
            files = [line[2:] for line in (steps[-1].observation or "").splitlines() if line.startswith("./")]
            for _ in range(rng.randint(0, 2) if files and not done else 0):
                command = rng.choice(_LOOK).format(f=shlex.quote(rng.choice(files)))
                if await _run(episode, command, steps):
                    break
        final = self._guess(task, files, rng)
        return AgentResult(attempt=Attempt(final=final, actions=[s.action for s in steps]), steps=steps)

    @staticmethod
    def _guess(task: Task, files: list[str], rng: random.Random) -> str:
        if task.metadata.get("finish") == "files":
            return "done"  # the files are checked, not the text; the tree was only looked at
        fmt = (task.answer_format or "").lower()
        if "colon" in fmt and files:
            return f"{rng.choice(files)}:{rng.randint(1, 20)}"
        if "number" in fmt or not files:
            return str(rng.randint(0, 50))
        return rng.choice(files)


class SkilledAgent(Agent):
    """A stand-in policy of skill ``s``: on a task of difficulty ``d`` it submits the reference
    attempt with probability 1 / (1 + e^(d - s)), else a random one.

    Something for the task bank to learn on before a real policy is attached: its pass
    rate falls with difficulty as a model's would, and attempts in a group differ, so
    groups carry signal. Every attempt is still verified and scored as submitted.
    """

    def __init__(self, skill: float, envs: EnvLookup | None = None, ctx: VerifyContext | None = None) -> None:
        self.skill = skill
        self.name = f"skilled:{skill:g}"
        self._reference = ReferenceAgent(envs, ctx)
        self._random = RandomAgent()
        self._rng = random.SystemRandom()

    def p_solve(self, difficulty: int) -> float:
        return 1.0 / (1.0 + math.exp(difficulty - self.skill))

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        if self._rng.random() < self.p_solve(task.difficulty):
            return await self._reference.attempt(task, episode, policy_version, rollout_id=rollout_id)
        return await self._random.attempt(task, episode, policy_version, rollout_id=rollout_id)
