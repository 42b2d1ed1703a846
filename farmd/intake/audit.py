"""``farmctl audit``: how well a verifier tells right from wrong, with counts.

- recall: the share of reference attempts that pass (over ``n`` seeds of every level);
- precision: P(reference | rewarded) over references and the built-in exploit library
  run on the same tasks. Every rewarded exploit is a false positive: a lesson in
  cheating the model would be taught.
"""

from __future__ import annotations

import asyncio
from typing import Any

from farmd.envs.base import Attempt, Environment, Task, VerifyContext, verify_safely
from farmd.intake.exploits import for_kind
from farmd.sandbox import Sandbox
from farmd.sandbox.config import SandboxConfig
from farmd.verifier.secret import VerifierKey
from farmd.verifier.verdict import SUSPECTED_HACK, Verdict

_CONCURRENCY = 4


async def run_audit(env: Environment, n: int, key: VerifierKey, sandbox_config: SandboxConfig,
                    progress: bool = False) -> dict[str, Any]:
    exploits = for_kind(env.exploit_kind)
    tasks: list[Task] = [env.generate(seed, level) for level in range(1, env.max_difficulty + 1)
                         for seed in range(n)]
    jobs: list[tuple[str, Task, Attempt]] = []
    for task in tasks:
        jobs.append(("reference", task, env.reference(task)))
        for exploit in exploits:
            jobs.append((exploit.name, task, exploit.make(task)))
    async with Sandbox(sandbox_config) as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=key)
        verdicts = await _verify_all(env, ctx, jobs, progress)
    return summarize(env, n, exploits, jobs, verdicts)


async def _verify_all(env: Environment, ctx: VerifyContext, jobs: list[tuple[str, Task, Attempt]],
                      progress: bool) -> list[Verdict]:
    limit = asyncio.Semaphore(_CONCURRENCY)
    bar = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("auditing {task.fields[env]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), transient=True)
        bar.start()
        handle = bar.add_task("audit", total=len(jobs), env=env.name)

    async def one(task: Task, attempt: Attempt) -> Verdict:
        async with limit:
            verdict = await verify_safely(env, task, attempt, ctx)
        if bar is not None:
            bar.advance(handle)
        return verdict

    try:
        return list(await asyncio.gather(*[one(task, attempt) for _, task, attempt in jobs]))
    finally:
        if bar is not None:
            bar.stop()


def summarize(env: Environment, n: int, exploits: list[Any], jobs: list[tuple[str, Task, Attempt]],
              verdicts: list[Verdict]) -> dict[str, Any]:
    ref_total = ref_passed = errors = 0
    per_exploit: dict[str, dict[str, Any]] = {
        e.name: {"name": e.name, "description": e.description, "attempts": 0, "rewarded": 0, "flagged": 0}
        for e in exploits
    }
    failures: list[dict[str, Any]] = []
    for (name, task, _), verdict in zip(jobs, verdicts, strict=True):
        if verdict.status == "error":
            errors += 1
            failures.append({"attempt": name, "seed": task.seed, "difficulty": task.difficulty,
                             "reasons": verdict.reasons})
            continue
        if name == "reference":
            ref_total += 1
            ref_passed += int(verdict.passed)
            if not verdict.passed:
                failures.append({"attempt": name, "seed": task.seed, "difficulty": task.difficulty,
                                 "reasons": verdict.reasons})
            continue
        entry = per_exploit[name]
        entry["attempts"] += 1
        entry["rewarded"] += int(verdict.reward > 0)
        entry["flagged"] += int(SUSPECTED_HACK in verdict.flags)
        if verdict.reward > 0:
            failures.append({"attempt": name, "seed": task.seed, "difficulty": task.difficulty,
                             "reward": verdict.reward})
    false_positives = sum(e["rewarded"] for e in per_exploit.values())
    rewarded = ref_passed + false_positives
    return {
        "env": env.name,
        "verifier_version": env.verifier_version,
        "seeds_per_level": n,
        "levels": env.max_difficulty,
        "recall": {"passed": ref_passed, "total": ref_total, "rate": ref_passed / ref_total if ref_total else 0.0},
        "precision": {"true_positives": ref_passed, "false_positives": false_positives,
                      "rate": ref_passed / rewarded if rewarded else 0.0},
        "exploits": list(per_exploit.values()),
        "errors": errors,
        "failures": failures[:50],
    }
