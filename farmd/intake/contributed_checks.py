"""Tier 1 for a submitted environment: the ``check_*`` questions of ``checks``, asked of its own code
running in boxes (``BoxedEnvironment``), and of its example submissions.

Each check returns findings (``Finding``: the check, the evidence, what to fix); none means it holds. A
call the environment's code fails (``ContributedError``) is a finding of the check that made it, never a
pass. ``run_tier1`` asks every question, cheapest first, and stops early only where a later check would
be meaningless (no task can be generated).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from farmd.errors import ContributedError
from farmd.intake.boxed import BoxedEnvironment, ContributedTask, ContributedVerdict
from farmd.intake.checks import Finding
from farmd.intake.forms import frame, near_miss
from farmd.intake.mutants import Coverage, coverage_findings, measure
from farmd.intake.scan import scan_package

SEEDS = (0, 1, 2, 3)
PARALLEL = 3
"""Boxes one check runs at once: calls are independent, and a box mostly waits on its own start-up."""
T = TypeVar("T")
MIN_TRAP_ANSWER_CHARS = 1
_MAX_EXAMPLE_BYTES = 64 * 1024


def _fail(check: str, exc: ContributedError, fix: str) -> Finding:
    return Finding(check, f"{exc.op} failed: {exc.evidence}", fix)


async def check_generates(env: BoxedEnvironment, levels: Sequence[int], seeds: Sequence[int] = SEEDS
                          ) -> tuple[list[Finding], dict[tuple[int, int], ContributedTask]]:
    """Every level makes a task for every seed, the same one twice: hidden data is regenerated from it."""
    keys = [(seed, level) for level in levels for seed in seeds]
    try:
        made = await _each([env.generate(*k) for k in keys for _ in range(2)], env.parallel)
    except ContributedError as exc:
        return [_fail("check_generates", exc, "make `generate` return {'prompt': str, 'public': dict, 'hidden': "
                      "dict} for every seed and level, within bounds.generate_s")], {}
    found: list[Finding] = []
    tasks: dict[tuple[int, int], ContributedTask] = {}
    for i, (seed, level) in enumerate(keys):
        first, second = made[2 * i], made[2 * i + 1]
        if first != second:
            found.append(Finding("check_generates", f"generate({seed}, {level}) made two different tasks",
                                 "draw every random choice from the `rng` argument, never from global state, "
                                 "time or counters"))
        tasks[(seed, level)] = first
    return found, tasks


async def _each(calls: Sequence[Awaitable[T]], parallel: int = PARALLEL) -> list[T]:
    """``calls`` a few boxes at a time (each is one box; ``parallel`` more where calls share boxes): the first
    error raised ends the rest."""
    limit = asyncio.Semaphore(parallel)

    async def one(call: Awaitable[T]) -> T:
        async with limit:
            return await call

    tasks = [asyncio.ensure_future(one(c)) for c in calls]
    for task, call in zip(tasks, calls, strict=True):
        if asyncio.iscoroutine(call):  # one cancelled before it started is closed, not left unawaited
            task.add_done_callback(functools.partial(_close, call))
    try:
        return list(await asyncio.gather(*tasks))
    except asyncio.CancelledError:
        await asyncio.gather(*tasks, return_exceptions=True)  # gather cancelled them once: let them clean up
        raise
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _close(call: Coroutine[Any, Any, Any], _done: object) -> None:
    call.close()


def _shown(task: ContributedTask) -> str:
    """All an agent is shown of a task: two tasks alike in this are the same task (a code task's prompt may
    stay while its examples change)."""
    return task.prompt + "\n" + json.dumps(task.public, sort_keys=True, default=str)


def check_seeds_distinct(tasks: dict[tuple[int, int], ContributedTask]) -> list[Finding]:
    """Different seeds make different tasks at each level."""
    found = []
    for level in sorted({lv for _, lv in tasks}):
        prompts = {_shown(t) for (_, lv), t in tasks.items() if lv == level}
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
        if all(_shown(tasks[(s, low)]) == _shown(tasks[(s, high)]) for s in seeds):
            found.append(Finding("check_levels_differ", f"levels {low} and {high} make the same tasks",
                                 "make each level change the task, or declare fewer `levels`"))
    return found


async def check_reference_passes(env: BoxedEnvironment, keys: Sequence[tuple[int, int]],
                                 tasks: dict[tuple[int, int], ContributedTask] | None = None
                                 ) -> tuple[list[Finding], dict[tuple[int, int], str]]:
    """The reference earns full reward on every task asked, and its answer is not in the public task.
    Returns the findings and the reference's answers (what later checks measure against)."""
    try:
        made = tasks if tasks is not None else dict(zip(keys, await _each([env.generate(*k) for k in keys], env.parallel),
                                                        strict=True))
        answers = dict(zip(keys, await _each([env.reference(*k) for k in keys], env.parallel), strict=True))
        verdicts = await _each([env.verify(*k, answers[k]) for k in keys], env.parallel)
    except ContributedError as exc:
        return [_fail("check_reference_passes", exc, "make `reference` and `verify` work on every task")], {}
    found = []
    for (seed, level), verdict in zip(keys, verdicts, strict=True):
        answer, task = answers[(seed, level)], made[(seed, level)]
        if not (verdict.passed and verdict.reward == 1.0):
            found.append(Finding("check_reference_passes",
                                 f"the reference's answer to ({seed}, {level}) scored {verdict.reward} "
                                 f"({'; '.join(verdict.reasons)[:200]})",
                                 "fix the reference or the verifier: the reference must pass every task"))
        public = task.prompt + json.dumps(task.public, sort_keys=True)
        # A short answer ("3") appears in a prompt by chance; as a public field's whole value it is a leak. The
        # answer inside its frame counts too: a verifiers package's reference is ``<answer>\n42\n</answer>``.
        if any((len(said) >= 8 and said in public) or said in _leaves(task.public)
               for said in {answer.strip(), frame(answer).core.strip()} if said):
            found.append(Finding("check_reference_passes", f"the answer to ({seed}, {level}) is in the public task",
                                 "keep the expected answer in 'hidden', never in 'prompt' or 'public'"))
    return found, answers


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
    padded = f"the answer is maybe {answer} or not"
    framed = frame(answer)
    if framed.before.strip() or framed.after.strip():
        # An answer in a frame (``<answer>42</answer>``, a verifiers parser's format): text around the frame is
        # the attempt's reasoning, which such a verifier rightly ignores; the near miss and the hedge go inside.
        near, padded = near_miss(answer), framed.holding(f"maybe {framed.core} or not")
    return {"empty": "", "whitespace": " \n", "junk": "zq#7 lorem", "echo": prompt[:2000],
            "near miss": near, "answer padded": padded}


async def check_rejects_wrong(env: BoxedEnvironment, keys: Sequence[tuple[int, int]],
                              tasks: dict[tuple[int, int], ContributedTask], answers: dict[tuple[int, int], str]
                              ) -> list[Finding]:
    """Empty, junk, echoed, near-miss and hedged submissions all fail, on every task asked."""
    trials = [(k, name, final) for k in keys for name, final in _traps(answers[k], tasks[k].prompt).items()
              if final.strip() != answers[k].strip()]
    try:
        verdicts = await _each([env.verify(*k, final) for k, _, final in trials], env.parallel)
    except ContributedError as exc:
        return [_fail("check_rejects_wrong", exc, "make `verify` judge any text, failing what is wrong")]
    passed: dict[str, list[tuple[int, int]]] = {}
    for (k, name, _), verdict in zip(trials, verdicts, strict=True):
        if verdict.passed or verdict.reward > 0.5:
            passed.setdefault(name, []).append(k)
    return [Finding("check_rejects_wrong", f"a {name} submission passed on {where[:4]}",
                    "compare the submission with the expected answer from 'hidden' exactly (after trimming), and "
                    "fail everything else") for name, where in passed.items()]


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
    judged: list[tuple[str, str, bool, int, int, str]] = []
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
            judged.append((which, name, should_pass, seed, level, final))
    # Judged together: where calls share boxes (a verifiers package) the examples share one.
    outcomes = await _each([_verdict(env, seed, level, final) for *_, seed, level, final in judged], env.parallel)
    for (which, name, should_pass, *_), verdict in zip(judged, outcomes, strict=True):
        if isinstance(verdict, ContributedError):
            found.append(_fail("check_examples", verdict, "make `verify` judge the examples"))
            continue
        if verdict.passed != should_pass:
            found.append(Finding("check_examples", f"{which} example {name} {'failed' if should_pass else 'passed'}"
                                 f" (reward {verdict.reward})",
                                 "fix the verifier, or the example if it is the example that is wrong"))
    return found


async def _verdict(env: BoxedEnvironment, seed: int, level: int, final: str
                   ) -> ContributedVerdict | ContributedError:
    try:
        return await env.verify(seed, level, final)
    except ContributedError as exc:
        return exc


@dataclass(frozen=True)
class Tier1Report:
    findings: list[Finding]
    coverage: Coverage | None
    """The mutants' measure (None: tier 1 stopped before it)."""


async def run_tier1(env: BoxedEnvironment, seeds: Sequence[int] = SEEDS) -> list[Finding]:
    """Every tier 1 question of a contributed environment; its findings (none: it passes tier 1)."""
    return (await tier1_report(env, seeds, stop_early=False)).findings


async def tier1_report(env: BoxedEnvironment, seeds: Sequence[int] = SEEDS, *, stop_early: bool = True
                       ) -> Tier1Report:
    """Tier 1 in stages, cheapest first: the scan and the generator, then the reference, the traps and the
    examples, then the mutants. ``stop_early``: a stage with a blocking finding ends it there (the funnel's
    way: lazy fraud costs seconds, and what a later stage would say about a broken generator means little)."""
    levels = range(1, env.manifest.levels + 1)
    found = await asyncio.to_thread(scan_package, env.package)
    generated, tasks = await check_generates(env, levels, seeds)
    found += generated
    if not tasks:
        return Tier1Report(found, None)
    found += check_seeds_distinct(tasks) + check_levels_differ(tasks)
    if stop_early and _blocking(found):
        return Tier1Report(found, None)
    keys = sorted(tasks)
    passes, answers = await check_reference_passes(env, keys, tasks)
    found += passes
    if answers:
        found += await check_rejects_wrong(env, keys[: max(2, len(keys) // 2)], tasks, answers)
    found += await check_examples(env)
    if stop_early and _blocking(found):
        return Tier1Report(found, None)
    coverage = await measure(env, keys[:3], answers=answers, posed=tasks)
    return Tier1Report(found + coverage_findings(coverage), coverage)


def _blocking(found: Sequence[Finding]) -> bool:
    return any(getattr(f, "blocking", True) for f in found)
