"""Verifications per second per environment, side by side with a naive inline verifier.

The baseline is what a verifier without any of farm's guarantees would do: exec the
submission in its own process and compare return values with ``==`` (or, for text
answers, the same host-side check; for shell tasks, plain subprocesses in a temp
dir). The ratio is the price of soundness. The verifier's share of a rollout is
measured with the reference agent, whose "thinking" costs nothing: it is the upper
bound of the share; with a model in the loop the share shrinks by the model's time.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from farmd.envs import VerifyContext, get
from farmd.envs.base import Environment
from farmd.sandbox import Sandbox, SandboxConfig
from farmd.verifier import VerifierKey

ENVS = ("py-func", "kernel", "rg:chain_sum", "rg:countdown", "shell")
KEY = VerifierKey(b"bench-key-bench-key-bench-key!!")


def _inline_pyfunc(env: Any, task: Any, source: str) -> bool:
    namespace: dict[str, Any] = {}
    exec(compile(source, "submission", "exec"), namespace)  # the unsound way, on purpose
    fn = namespace[task.entry_point]
    ref = env._chain(task.seed, task.difficulty).function()
    ctx = VerifyContext(sandbox=None, key=KEY)  # type: ignore[arg-type]
    return all(fn(copy.deepcopy(x)) == ref(copy.deepcopy(x)) for x in env.hidden_inputs(task, ctx))


def _inline_kernel(env: Any, task: Any, source: str) -> bool:
    import numpy as np

    namespace: dict[str, Any] = {}
    exec(compile(source, "submission", "exec"), namespace)
    fn = namespace["kernel"]
    spec = env.spec(task.seed, task.difficulty)
    ref = spec.reference()
    ctx = VerifyContext(sandbox=None, key=KEY)  # type: ignore[arg-type]
    ok = True
    for case in env.inputs(spec, task, ctx):
        t0 = time.perf_counter()
        got = fn(*[a.copy() for a in case])
        time.perf_counter() - t0
        ok &= bool(np.allclose(got, ref(*[a.copy() for a in case]), rtol=1e-3, atol=1e-3))
    return ok


async def _boxed_rate(env: Environment, tasks: list[Any], sandbox: Sandbox) -> tuple[float, list[float], int]:
    ctx = VerifyContext(sandbox=sandbox, key=KEY)
    limit = asyncio.Semaphore(2)
    durations: list[float] = []
    passed = 0

    async def one(task: Any) -> None:
        nonlocal passed
        async with limit:
            t0 = time.perf_counter()
            verdict = await env.verify(task, env.reference(task), ctx)
            durations.append(time.perf_counter() - t0)
            passed += int(verdict.passed)

    t0 = time.perf_counter()
    await asyncio.gather(*[one(t) for t in tasks])
    return len(tasks) / (time.perf_counter() - t0), durations, passed


def _inline_rate(env: Environment, tasks: list[Any]) -> float | None:
    check = {"py-func": _inline_pyfunc, "kernel": _inline_kernel}.get(env.name)
    if check is None:
        return None
    t0 = time.perf_counter()
    for task in tasks:
        check(env, task, env.reference(task).final)
    return len(tasks) / (time.perf_counter() - t0)


async def measure(n: int, progress: Progress) -> list[dict[str, Any]]:
    rows = []
    bar = progress.add_task("verifying", total=len(ENVS))
    async with Sandbox(SandboxConfig(warm_boxes=2)) as sandbox:
        for name in ENVS:
            progress.update(bar, description=f"verifying {name}")
            env = get(name)
            tasks = [env.generate(seed, level) for level in range(1, env.max_difficulty + 1)
                     for seed in range(max(1, n // env.max_difficulty))]
            t0 = time.perf_counter()
            for task in tasks:
                env.generate(task.seed, task.difficulty)
                env.reference(task)
            make_s = (time.perf_counter() - t0) / len(tasks)
            rate, durations, passed = await _boxed_rate(env, tasks, sandbox)
            inline = _inline_rate(env, tasks)
            verify_s = statistics.median(durations)
            rows.append({
                "env": name, "tasks": len(tasks), "passed": passed, "boxed_per_s": rate, "inline_per_s": inline,
                "ratio": rate / inline if inline else None, "verify_median_s": verify_s,
                "verifier_share": verify_s / (verify_s + make_s),
            })
            progress.advance(bar)
    return rows


def render(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table("environment", "verified/s (farm)", "verified/s (inline, unsound)", "farm / inline",
                  "median verify ms", "verifier share of a reference rollout", title="farm verifier, 2 cores")
    for r in rows:
        table.add_row(r["env"], f"{r['boxed_per_s']:.1f}", f"{r['inline_per_s']:.1f}" if r["inline_per_s"] else "-",
                      f"{r['ratio']:.3f}" if r["ratio"] else "-", f"{r['verify_median_s'] * 1000:.0f}",
                      f"{r['verifier_share']:.1%}")
    console.print(table)
    console.print("  inline baseline: exec the code in-process and compare with == (no box, no hidden-test "
                  "secrecy, no process separation); rg and shell have no such baseline here")
    console.print("  share: verification over (task generation + reference + verification); a model's time "
                  "would come on top of the denominator")
