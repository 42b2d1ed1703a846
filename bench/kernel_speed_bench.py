"""Is the kernel speed reward signal or noise? Today's timing and farm's, side by side, in one run.

The same kernels are verified, run after run, by two methods, alternating so that both see the
machine in the same state:

- **1fa4647** (the baseline): the judge of commit 1fa4647, pinned in ``bench/pinned/``, with that
  commit's sizes (about 100 x 600 float32), inputs and statistic: the reference timed first,
  alone, on 5 inputs, then the submission on the same 5; wall time; median minus the median of
  the echoes;
- **farm** (today's code): ``Kernel.verify`` itself, unchanged: CPU time of each runner, paired
  rounds in ABBA order, the median log ratio, credit only when the sign test says so.

Three kernels per op, each the op's reference, so that the true speedup is known:

- *itself*: the reference submitted against itself (true speedup 1: the reward should be 0.5);
- *2x faster*: timed against a reference that does its work twice (true speedup 2: 1.0);
- *2x slower*: a submission that does its work twice (true speedup 0.5: 0.25).

The verifier is not weakened for any of this: the doubled reference is the task's reference
(the host computes the expected outputs with it too), and every check still runs.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from farmd.envs import Attempt, VerifyContext
from farmd.envs.kernel import OPS, POLICY, Arg, Kernel, KernelOp, Spec
from farmd.sandbox import Sandbox, SandboxConfig
from farmd.verifier import VerifierKey
from farmd.verifier.boxjudge import JUDGE_COMMAND
from farmd.verifier.kernels import MIN_REWARD, SPEED_AT_PARITY

KEY = VerifierKey(b"kernel-speed-bench-key-32-bytes!")
PINNED_JUDGE = (Path(__file__).parent / "pinned" / "kernel_judge_1fa4647.txt").read_bytes()
KINDS = ("itself", "2x faster", "2x slower")
GOALS = {"itself": (0.4, 0.6), "2x faster": (0.8, 1.0)}
"""The reward must land in this range in at least 19 runs of 20."""


def _twice(source: str) -> str:
    return source + "\n_once = kernel\n\n\ndef kernel(*args):\n    _once(*args)\n    return _once(*args)\n"


def _doubled(s: Spec) -> Spec:
    return Spec(replace(s.op, source=_twice(s.op.source)), s.args, s.out, s.consts)


class _DoubledReference(Kernel):
    """The kernel environment, except that each task's reference does its work twice."""

    def spec(self, seed: int, difficulty: int) -> Spec:
        return _doubled(super().spec(seed, difficulty))


def _tasks(env: Kernel) -> list[tuple[KernelOp, int, int]]:
    """(op, seed, level) for every op: the first seed whose task is that op."""
    found = []
    for op in OPS:
        seed = next(seed for seed in range(10_000) if env.spec(seed, op.level).op.name == op.name)
        found.append((op, seed, op.level))
    return found


# -- 1fa4647's method, as it was: its judge (pinned), sizes, inputs and statistic ---------------

_OLD_CHECKS, _OLD_WARMUP, _OLD_TIMED, _OLD_SAMPLE = 4, 1, 5, 4096


def _old_sizes(s: Spec, rng: np.random.Generator) -> Spec:
    def shape(a: Arg) -> tuple[int, ...]:
        if a.shape == (3, 3):
            return a.shape
        if s.op.name == "conv2d":
            side = int(rng.choice((192, 256)))
            return (side, side)
        if s.op.name == "pairwise_sqdist":
            return (int(rng.choice((64, 96))), 48)
        return (int(rng.choice((96, 128))), int(rng.choice((512, 640))))

    args = tuple(Arg(a.name, shape(a), a.dtype) for a in s.args)
    return Spec(s.op, args, s.op.out(args), s.consts)


async def _old_verify(sandbox: Sandbox, s: Spec, submission: str, run: int) -> float:
    """1fa4647's kernel verification of ``submission`` against ``s``'s reference: the reward."""
    rng = np.random.default_rng(run)
    cases = []
    for i in range(_OLD_CHECKS + _OLD_WARMUP + _OLD_TIMED):
        arrays = []
        for a in s.args:
            if a.shape == (3, 3):
                arr = rng.standard_normal(a.shape)
            elif i == 0:
                arr = rng.standard_normal(a.shape) * 1e3
            elif i == 1:
                arr = np.repeat(rng.standard_normal((a.shape[0], 1)), a.shape[1], axis=1)
            elif i == 2:
                arr = -np.abs(rng.standard_normal(a.shape)) * 50
            else:
                arr = rng.standard_normal(a.shape) * rng.choice((0.1, 1.0, 10.0))
            arrays.append(np.ascontiguousarray(arr, dtype=a.dtype))
        cases.append(arrays)
    fn = s.reference()
    expected = [np.asarray(fn(*[a.copy() for a in case])) for case in cases]
    tests, blobs = [], {}
    for i, case in enumerate(cases):
        blobs[f"in{i}.bin"] = b"".join(a.tobytes() for a in case)
        test: dict[str, Any] = {"id": i, "arrays": [[a.dtype.str, list(a.shape)] for a in case],
                                "blob": f"in{i}.bin", "timed": i >= _OLD_CHECKS}
        if i >= _OLD_CHECKS:
            test["echo"] = [expected[i].dtype.str, list(expected[i].shape)]
        size = int(expected[i].size)
        test["sample"] = np.sort(rng.choice(size, min(_OLD_SAMPLE, size), replace=False)).tolist()
        tests.append(test)
    nonce = f"bench{run}-{time.monotonic_ns()}"
    head = {"mode": "array", "entry_point": "kernel", "per_call_s": 5.0, "reference": True}
    secret = {"nonce": nonce, "tests": tests, "reference_source": s.reference_source()}
    files = {"submission.py": submission.encode(), ".judge/judge.py": PINNED_JUDGE,
             ".judge/head.json": json.dumps(head).encode(), ".judge/secret.json": json.dumps(secret).encode(),
             **{f".judge/{name}": blob for name, blob in blobs.items()}}
    result = await sandbox.run(JUDGE_COMMAND, POLICY, files=files)
    ref: dict[int, float] = {}
    sub: dict[int, float] = {}
    prefix = f"FARM {nonce} "
    for line in result.stdout.decode(errors="replace").splitlines():
        if line.startswith(prefix):
            record = json.loads(line[len(prefix):])
            if record.get("kind") in ("ref_result", "result") and record.get("ok"):
                (ref if record["kind"] == "ref_result" else sub)[record["id"]] = float(record["seconds"])
                if record["kind"] == "result" and 0 <= record["id"] < len(expected):
                    base64.b64decode(record.get("data", ""))  # the host's share of reading an answer
    timed = range(_OLD_CHECKS + _OLD_WARMUP, len(cases))
    if not all(i in ref and -1 - i in ref and i in sub for i in timed):
        raise RuntimeError(f"1fa4647's judge did not answer every timed test: {result.stderr[-400:]!r}")
    overhead = statistics.median(ref[-1 - i] for i in timed)
    ref_median = statistics.median(ref[i] for i in timed)
    sub_median = statistics.median(sub[i] for i in timed)
    speedup = max(ref_median - overhead, 20e-6) / max(sub_median - overhead, 20e-6)
    return max(MIN_REWARD, min(1.0, SPEED_AT_PARITY * speedup))


# -- the runs -------------------------------------------------------------------------------------

async def _farm_verify(sandbox: Sandbox, kind: str, op: KernelOp, seed: int, level: int) -> float:
    env: Kernel = _DoubledReference() if kind == "2x faster" else Kernel()
    task = env.generate(seed, level)
    plain = Kernel().spec(seed, level).reference_source()
    submission = _twice(plain) if kind == "2x slower" else plain
    verdict = await env.verify(task, Attempt(final=submission), VerifyContext(sandbox=sandbox, key=KEY))
    if not verdict.passed:
        raise RuntimeError(f"farm did not pass a correct kernel ({op.name}, {kind}): {verdict.reasons}")
    return verdict.reward


async def _baseline_verify(sandbox: Sandbox, kind: str, op: KernelOp, seed: int, level: int, run: int) -> float:
    s = _old_sizes(Kernel().spec(seed, level), np.random.default_rng(1000 + run))
    plain = s.reference_source()
    reference = _doubled(s) if kind == "2x faster" else s
    return await _old_verify(sandbox, reference, _twice(plain) if kind == "2x slower" else plain, run)


def _summary(rewards: list[float], times: list[float], kind: str) -> dict[str, Any]:
    q = np.percentile(rewards, [25, 75])
    lo, hi = GOALS.get(kind, (0.0, 1.0))
    return {"runs": len(rewards), "median": statistics.median(rewards), "p25": float(q[0]), "p75": float(q[1]),
            "min": min(rewards), "max": max(rewards), "in_goal": sum(lo <= r <= hi for r in rewards),
            "verify_median_s": statistics.median(times), "rewards": [round(r, 3) for r in rewards]}


async def measure(runs: int, progress: Progress) -> dict[str, Any]:
    """``runs`` verifications per method and kind, spread over every op in turn."""
    tasks = _tasks(Kernel())
    methods = {"1fa4647": _baseline_verify, "farm": None}
    rewards: dict[tuple[str, str], list[float]] = {(m, k): [] for m in methods for k in KINDS}
    times: dict[tuple[str, str], list[float]] = {(m, k): [] for m in methods for k in KINDS}
    bar = progress.add_task("kernel speed reward", total=runs * len(KINDS))
    load_before = os.getloadavg()
    async with Sandbox(SandboxConfig(warm_boxes=2)) as sandbox:
        # One of each first, unrecorded: the first box of a sandbox pays for warming it.
        await _farm_verify(sandbox, "itself", *tasks[0])
        for run in range(runs):
            op, seed, level = tasks[run % len(tasks)]
            for kind in KINDS:
                order = list(methods) if run % 2 == 0 else list(reversed(methods))
                for method in order:
                    t0 = time.perf_counter()
                    if method == "farm":
                        reward = await _farm_verify(sandbox, kind, op, seed, level)
                    else:
                        reward = await _baseline_verify(sandbox, kind, op, seed, level, run)
                    times[method, kind].append(time.perf_counter() - t0)
                    rewards[method, kind].append(reward)
                progress.advance(bar)
    return {"runs": runs, "load_before": load_before, "load_after": os.getloadavg(),
            "methods": {m: {k: _summary(rewards[m, k], times[m, k], k) for k in KINDS} for m in methods},
            "verify_median_s": {m: statistics.median(t for k in KINDS for t in times[m, k]) for m in methods}}


def render(out: dict[str, Any], console: Console) -> None:
    n = out["runs"]
    table = Table("method", f"itself: in 0.5±0.1 (of {n})", "itself: median [IQR] (min to max)",
                  f"2x faster: above 0.8 (of {n})", "2x faster: median [IQR] (min to max)",
                  "2x slower: median [IQR]", "median verify ms (vs 1fa4647)",
                  title="kernel speed reward: the reference against itself and 2x apart, one run")
    for method, kinds in out["methods"].items():
        cells = []
        for kind in KINDS:
            k = kinds[kind]
            spread = f"{k['median']:.2f} [{k['p25']:.2f}, {k['p75']:.2f}]"
            if kind in GOALS:
                cells += [f"{k['in_goal']}/{k['runs']}", f"{spread} ({k['min']:.2f} to {k['max']:.2f})"]
            else:
                cells.append(spread)
        verify = out["verify_median_s"][method]
        ratio = verify / out["verify_median_s"]["1fa4647"]
        table.add_row(method, *cells, f"{verify * 1000:.0f} ({ratio:.2f}x)")
    console.print(table)
    goal = ", ".join(f"{m} {'met' if all(kinds[k]['in_goal'] >= 0.95 * n for k in GOALS) else 'missed'}"
                     for m, kinds in out["methods"].items())
    console.print(f"  goal (19 of 20 in band, both kernels): {goal}; load average before "
                  f"{out['load_before'][0]:.2f}, after {out['load_after'][0]:.2f}")
    console.print("  1fa4647: that commit's judge (pinned), sizes, inputs and statistic; farm: Kernel.verify as it is. "
                  "Runs alternate between the two and cycle through every op; a true 2x is a reference that "
                  "does its work twice (or a submission that does)")
