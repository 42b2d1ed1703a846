"""Tier 1 of intake: cheap checks every environment must pass, in the manner of Gymnasium's ``env_checker``.

Each ``check_*`` function looks at one property and returns findings; an empty list means it holds.
A finding names the check, shows the evidence and says what to fix, so a contributor can act on it
without reading this file. ``check_environment`` runs them all.

The checks that judge attempts need a ``VerifyContext`` (boxes and the key); without one they are
not run, so the rest stay cheap enough for a submission form or a unit test.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from farmd.envs.base import Attempt, Environment, Task, VerifyContext, verify_safely

SEEDS = (0, 1, 2)
"""Seeds per level: enough to catch a constant or a random generator, few enough to run on every submission."""

_KNOWN_KINDS = ("function", "answer", "bare-answer", "kernel", "shell")
_MIN_LEAK_CHARS = 8
"""An answer shorter than this (``"3"``, ``"yes"``) appears in prompts by coincidence, not by a leak."""


@dataclass(frozen=True)
class Finding:
    """One thing wrong with an environment: which check found it, the evidence, and what to fix."""

    check: str
    evidence: str
    fix: str
    blocking: bool = True
    """False: a note for the reviewer (the check could not run, or saw something short of a fault), never
    a reason to reject."""

    def __str__(self) -> str:
        note = "" if self.blocking else " [note]"
        return f"{self.check}{note}: {self.evidence} (fix: {self.fix})"


def check_attributes(env: Environment) -> list[Finding]:
    """``name``, ``version``, ``verifier_version``, ``max_difficulty`` and ``exploit_kind`` are set and sane."""
    found = []
    name = getattr(env, "name", None)
    if not isinstance(name, str) or not name or name != name.strip() or any(c.isspace() for c in name):
        found.append(Finding("check_attributes", f"name is {name!r}",
                             "set the class attribute `name` to a non-empty string without whitespace"))
    for attr in ("version", "verifier_version"):
        value = getattr(env, attr, None)
        if not isinstance(value, str) or not value.strip():
            found.append(Finding("check_attributes", f"{attr} is {value!r}",
                                 f"set the class attribute `{attr}` to a non-empty string, and change it "
                                 f"whenever {'tasks' if attr == 'version' else 'verdicts'} change"))
    levels = getattr(env, "max_difficulty", None)
    if not isinstance(levels, int) or isinstance(levels, bool) or not 1 <= levels <= 100:
        found.append(Finding("check_attributes", f"max_difficulty is {levels!r}",
                             "set `max_difficulty` to the number of difficulty levels, an int in 1..100"))
    kind = getattr(env, "exploit_kind", None)
    if kind not in _KNOWN_KINDS:
        found.append(Finding("check_attributes", f"exploit_kind is {kind!r}",
                             f"set `exploit_kind` to the part of the exploit library that attacks this "
                             f"environment: one of {', '.join(_KNOWN_KINDS)}"))
    return found


def check_deterministic(env: Environment, levels: Sequence[int], seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """The same ``(seed, difficulty)`` twice makes the same public task: hidden data is regenerated from it."""
    found = []
    for level in levels:
        for seed in seeds:
            first, second = _generate(env, seed, level), _generate(env, seed, level)
            if isinstance(first, Finding):
                return [first]
            if isinstance(second, Finding):
                return [second]
            if first.public() != second.public():
                found.append(Finding("check_deterministic",
                                     f"generate({seed}, {level}) made two different tasks: "
                                     f"{_differ(first.public(), second.public())}",
                                     "derive every random choice in `generate` from the seed and difficulty "
                                     "(e.g. random.Random(f'{seed}:{difficulty}')), never from global state, "
                                     "time or the environment's own counters"))
    return found


def check_seeds_distinct(env: Environment, levels: Sequence[int], seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """Different seeds make different tasks: a farm that asks one question many times teaches it by heart."""
    if len(seeds) < 2:
        return []
    found = []
    for level in levels:
        tasks = [_generate(env, seed, level) for seed in seeds]
        if any(isinstance(t, Finding) for t in tasks):
            return [t for t in tasks if isinstance(t, Finding)][:1]
        contents = {_content(t) for t in tasks if isinstance(t, Task)}
        if len(contents) < 2:
            found.append(Finding("check_seeds_distinct",
                                 f"seeds {list(seeds)} all make the same task at difficulty {level}",
                                 "let the seed choose the task's content (numbers, names, structure), "
                                 "not only its `seed` field"))
    return found


def check_levels_differ(env: Environment, levels: Sequence[int], seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """Neighbouring difficulty levels make different tasks for some seed: otherwise the knob does nothing."""
    found = []
    for low, high in itertools.pairwise(levels):
        pairs = [(_generate(env, seed, low), _generate(env, seed, high)) for seed in seeds]
        if any(isinstance(t, Finding) for pair in pairs for t in pair):
            return [t for pair in pairs for t in pair if isinstance(t, Finding)][:1]
        if all(_content(a) == _content(b) for a, b in pairs if isinstance(a, Task) and isinstance(b, Task)):
            found.append(Finding("check_levels_differ",
                                 f"difficulty {low} and {high} make the same tasks for seeds {list(seeds)}",
                                 "make each level change the task (size, steps, constraints), or lower "
                                 "`max_difficulty` to the number of levels that differ"))
    return found


def check_answer_not_public(env: Environment, levels: Sequence[int], seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """For answer tasks, the public task does not hold the reference's answer verbatim."""
    found = []
    for level in levels:
        for seed in seeds:
            task = _generate(env, seed, level)
            if isinstance(task, Finding):
                return [task]
            if task.answer_format is None:
                continue
            answer = _reference(env, task)
            if isinstance(answer, Finding):
                return [answer]
            text = answer.final.strip()
            if len(text) >= _MIN_LEAK_CHARS and text in json.dumps(task.public(), ensure_ascii=False) + task.prompt:
                found.append(Finding("check_answer_not_public",
                                     f"the answer of seed {seed} difficulty {level} ({text[:80]!r}) is in the "
                                     "public task",
                                     "keep the answer out of the prompt, examples and metadata; "
                                     "an agent would copy it instead of solving the task"))
    return found


async def check_reference_passes(env: Environment, ctx: VerifyContext, levels: Sequence[int],
                                 seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """The reference attempt passes the verifier for a few seeds of every level (the verifier's recall)."""
    found = []
    for level in levels:
        for seed in seeds:
            task = _generate(env, seed, level)
            if isinstance(task, Finding):
                return [task]
            attempt = _reference(env, task)
            if isinstance(attempt, Finding):
                return [attempt]
            verdict = await verify_safely(env, task, attempt, ctx)
            if verdict.status != "ok" or not verdict.passed:
                found.append(Finding("check_reference_passes",
                                     f"seed {seed} difficulty {level}: the reference got {verdict.status}, "
                                     f"reward {verdict.reward}: {'; '.join(verdict.reasons)[:300]}",
                                     "make `reference` solve the task it is given, and `verify` accept a "
                                     "correct attempt"))
    return found


async def check_empty_fails(env: Environment, ctx: VerifyContext, levels: Sequence[int],
                            seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """An empty attempt (no text, no actions) is judged, soundly, and gets nothing."""
    found = []
    for level in levels:
        task = _generate(env, seeds[0], level)
        if isinstance(task, Finding):
            return [task]
        verdict = await verify_safely(env, task, Attempt(), ctx)
        if verdict.status != "ok":
            found.append(Finding("check_empty_fails",
                                 f"difficulty {level}: an empty attempt made the verifier fail "
                                 f"({'; '.join(verdict.reasons)[:300]})",
                                 "judge a missing answer as a failed attempt (reward 0), not as an error"))
        elif verdict.passed or verdict.reward > 0:
            found.append(Finding("check_empty_fails",
                                 f"difficulty {level}: an empty attempt got reward {verdict.reward}",
                                 "fail an attempt with no answer; check what it submitted, not what it "
                                 "failed to show was wrong"))
    return found


async def check_environment(env: Environment, ctx: VerifyContext | None = None, *,
                            seeds: Sequence[int] = SEEDS, levels: Iterable[int] | None = None) -> list[Finding]:
    """Every tier-1 check of ``env``; an empty list means it passed them all.

    ``levels`` defaults to every level. The checks that verify attempts run only with a ``ctx``.
    """
    found = check_attributes(env)
    if any("max_difficulty" in f.evidence for f in found):
        return found  # every other check walks the levels
    chosen = list(levels) if levels is not None else list(range(1, env.max_difficulty + 1))
    found += check_deterministic(env, chosen, seeds)
    found += check_seeds_distinct(env, chosen, seeds)
    found += check_levels_differ(env, chosen, seeds)
    found += check_answer_not_public(env, chosen, seeds)
    if ctx is not None:
        found += await check_reference_passes(env, ctx, chosen, seeds)
        found += await check_empty_fails(env, ctx, chosen, seeds)
    return found


def _generate(env: Environment, seed: int, level: int) -> Task | Finding:
    try:
        return env.generate(seed, level)
    except Exception as exc:
        return Finding("generate", f"generate({seed}, {level}) raised {type(exc).__name__}: {str(exc)[:300]}",
                       "make `generate` accept every seed and every difficulty in 1..max_difficulty")


def _reference(env: Environment, task: Task) -> Attempt | Finding:
    try:
        return env.reference(task)
    except Exception as exc:
        return Finding("reference", f"reference() of seed {task.seed} difficulty {task.difficulty} raised "
                                    f"{type(exc).__name__}: {str(exc)[:300]}",
                       "make `reference` return an Attempt for every task `generate` makes")


def _content(task: Task) -> str:
    """What an agent is asked, without the identity fields that differ by construction."""
    public = task.public()
    for identity in ("seed", "difficulty"):
        public.pop(identity, None)
    metadata = {k: v for k, v in public.pop("metadata", {}).items() if k not in ("seed", "difficulty")}
    return json.dumps([public, metadata], sort_keys=True, default=str)


def _differ(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return "they differ in " + ", ".join(keys)
