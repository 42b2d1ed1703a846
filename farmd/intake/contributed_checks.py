"""Tier 1 for a submitted environment: the ``check_*`` questions of ``checks``, asked of its own code
running in boxes (``BoxedEnvironment``), and of its example submissions.

Each check returns findings (``Finding``: the check, the evidence, what to fix); none means it holds. A
call the environment's code fails (``ContributedError``) is a finding of the check that made it, never a
pass. ``run_tier1`` asks every question, cheapest first, and stops early only where a later check would
be meaningless (no task can be generated).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from typing import Any

from farmd.intake.boxed import BoxedEnvironment, ContributedError, ContributedTask
from farmd.intake.checks import Finding
from farmd.intake.mutants import coverage_findings, measure
from farmd.intake.scan import scan_package

SEEDS = (0, 1, 2, 3)
MIN_TRAP_ANSWER_CHARS = 1
_MAX_EXAMPLE_BYTES = 64 * 1024


def _fail(check: str, exc: ContributedError, fix: str) -> Finding:
    return Finding(check, f"{exc.op} failed: {exc.evidence}", fix)


async def check_generates(env: BoxedEnvironment, levels: Sequence[int], seeds: Sequence[int] = SEEDS
                          ) -> tuple[list[Finding], dict[tuple[int, int], ContributedTask]]:
    """Every level makes a task for every seed, the same one twice: hidden data is regenerated from it."""
    found: list[Finding] = []
    tasks: dict[tuple[int, int], ContributedTask] = {}
    for level in levels:
        for seed in seeds:
            try:
                first = await env.generate(seed, level)
                second = await env.generate(seed, level)
            except ContributedError as exc:
                found.append(_fail("check_generates", exc, "make `generate` return {'prompt': str, 'public': "
                                   "dict, 'hidden': dict} for every seed and level, within bounds.generate_s"))
                return found, tasks
            if first != second:
                found.append(Finding("check_generates", f"generate({seed}, {level}) made two different tasks",
                                     "draw every random choice from the `rng` argument, never from global state, "
                                     "time or counters"))
            tasks[(seed, level)] = first
    return found, tasks


def check_seeds_distinct(tasks: dict[tuple[int, int], ContributedTask]) -> list[Finding]:
    """Different seeds make different tasks at each level."""
    found = []
    for level in sorted({lv for _, lv in tasks}):
        prompts = {t.prompt for (_, lv), t in tasks.items() if lv == level}
        seeds = [s for s, lv in tasks if lv == level]
        if len(seeds) > 1 and len(prompts) < 2:
            found.append(Finding("check_seeds_distinct", f"seeds {seeds} all make the same task at level {level}",
                                 "let the seed (through `rng`) choose the task's content"))
    return found


def check_levels_differ(tasks: dict[tuple[int, int], ContributedTask]) -> list[Finding]:
    """Neighbouring levels make different tasks for some seed."""
    found = []
    levels = sorted({lv for _, lv in tasks})
    seeds = sorted({s for s, _ in tasks})
    for low, high in itertools.pairwise(levels):
        if all(tasks[(s, low)].prompt == tasks[(s, high)].prompt for s in seeds):
            found.append(Finding("check_levels_differ", f"levels {low} and {high} make the same tasks",
                                 "make each level change the task, or declare fewer `levels`"))
    return found


async def check_reference_passes(env: BoxedEnvironment, keys: Sequence[tuple[int, int]]) -> list[Finding]:
    """The reference earns full reward on every task asked, and its answer is not in the public task."""
    found = []
    for seed, level in keys:
        try:
            answer = await env.reference(seed, level)
            verdict = await env.verify(seed, level, answer)
        except ContributedError as exc:
            return [_fail("check_reference_passes", exc, "make `reference` and `verify` work on every task")]
        if not (verdict.passed and verdict.reward == 1.0):
            found.append(Finding("check_reference_passes",
                                 f"the reference's answer to ({seed}, {level}) scored {verdict.reward} "
                                 f"({'; '.join(verdict.reasons)[:200]})",
                                 "fix the reference or the verifier: the reference must pass every task"))
        task = await env.generate(seed, level)
        public = task.prompt + json.dumps(task.public, sort_keys=True)
        # A short answer ("3") appears in a prompt by chance; as a public field's whole value it is a leak.
        if (len(answer.strip()) >= 8 and answer.strip() in public) or answer.strip() in _leaves(task.public):
            found.append(Finding("check_reference_passes", f"the answer to ({seed}, {level}) is in the public task",
                                 "keep the expected answer in 'hidden', never in 'prompt' or 'public'"))
    return found


def _leaves(value: Any) -> set[str]:
    """Every scalar in a public structure, as text."""
    if isinstance(value, dict):
        return set().union(*(_leaves(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_leaves(v) for v in value)) if value else set()
    return {str(value).strip()}


def _traps(answer: str, prompt: str) -> dict[str, str]:
    """Submissions a sound verifier fails: nothing, junk, the task echoed, a near miss of the answer."""
    near = answer.strip()
    if near.lstrip("-").isdigit():
        near = str(int(near) + 1)
    else:
        near = near[::-1] if len(set(near)) > 1 else near + "x"
    return {"empty": "", "whitespace": " \n", "junk": "zq#7 lorem", "echo": prompt[:2000],
            "near miss": near, "answer padded": f"the answer is maybe {answer} or not"}


async def check_rejects_wrong(env: BoxedEnvironment, keys: Sequence[tuple[int, int]]) -> list[Finding]:
    """Empty, junk, echoed, near-miss and hedged submissions all fail, on every task asked."""
    found: list[Finding] = []
    passed: dict[str, list[tuple[int, int]]] = {}
    for seed, level in keys:
        try:
            answer = await env.reference(seed, level)
            prompt = (await env.generate(seed, level)).prompt
            for name, final in _traps(answer, prompt).items():
                if final.strip() == answer.strip():
                    continue
                verdict = await env.verify(seed, level, final)
                if verdict.passed or verdict.reward > 0.5:
                    passed.setdefault(name, []).append((seed, level))
        except ContributedError as exc:
            return [_fail("check_rejects_wrong", exc, "make `verify` judge any text, failing what is wrong")]
    for name, where in passed.items():
        found.append(Finding("check_rejects_wrong", f"a {name} submission passed on {where[:4]}",
                             "compare the submission with the expected answer from 'hidden' exactly "
                             "(after trimming), and fail everything else"))
    return found


def _example(name: str, data: bytes) -> tuple[int, int, str] | str:
    try:
        record: Any = json.loads(data[:_MAX_EXAMPLE_BYTES])
        seed, level, final = record["seed"], record["difficulty"], record["final"]
    except (ValueError, KeyError, TypeError):
        return f"{name} is not {{\"seed\": int, \"difficulty\": int, \"final\": str}}"
    if not (isinstance(seed, int) and isinstance(level, int) and isinstance(final, str)):
        return f"{name}: seed and difficulty are whole numbers, final is text"
    return seed, level, final


async def check_examples(env: BoxedEnvironment) -> list[Finding]:
    """The package's good examples pass and its bad examples fail."""
    found = []
    for which, should_pass in (("good", True), ("bad", False)):
        for name, data in env.package.examples(which):
            example = _example(name, data)
            if isinstance(example, str):
                found.append(Finding("check_examples", example, "write each example as that JSON object"))
                continue
            seed, level, final = example
            if not 1 <= level <= env.manifest.levels:
                found.append(Finding("check_examples", f"{name}: difficulty {level} is not a level",
                                     f"use a difficulty from 1 to {env.manifest.levels}"))
                continue
            try:
                verdict = await env.verify(seed, level, final)
            except ContributedError as exc:
                found.append(_fail("check_examples", exc, "make `verify` judge the examples"))
                continue
            if verdict.passed != should_pass:
                found.append(Finding("check_examples", f"{which} example {name} {'failed' if should_pass else 'passed'}"
                                     f" (reward {verdict.reward})",
                                     "fix the verifier, or the example if it is the example that is wrong"))
    return found


async def run_tier1(env: BoxedEnvironment, seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """Every tier 1 question of a contributed environment; its findings (none: it passes tier 1)."""
    levels = range(1, env.manifest.levels + 1)
    smells = await asyncio.to_thread(scan_package, env.package)
    found, tasks = await check_generates(env, levels, seeds)
    found = smells + found
    if not tasks:
        return found
    found += check_seeds_distinct(tasks) + check_levels_differ(tasks)
    keys = sorted(tasks)
    found += await check_reference_passes(env, keys)
    found += await check_rejects_wrong(env, keys[: max(2, len(keys) // 2)])
    found += await check_examples(env)
    found += coverage_findings(await measure(env, keys[:3]))
    return found
