"""``kernel``: write a fast NumPy function, correct on fresh hidden inputs, rewarded for speed.

A task names an operation (scaled ReLU, cumulative sums, softmax, layer norm,
windowed means and maxima, small convolutions; harder ones at higher
difficulty), its entry point, argument shapes and dtypes. Verification is one box:

1. the judge's reference runner answers the correctness tests (edge cases
   included: large magnitudes, constant rows) alone, before the submission is
   loaded; then the submission's runner answers them;
2. timed rounds: each a fresh input, answered by the reference and by the
   submission one right after the other (alternating which goes first), each
   call timed by the recorder as the CPU time its runner spent on it;
3. on the host, every output is checked against the reference computed here:
   exact dtype and shape, and at SAMPLE positions drawn for this run (whole
   outputs would be megabytes through the box's stdout) within a magnitude-aware
   tolerance (NaN fails, a constant or all-zero output where the reference is not
   fails); the speedup is the median over rounds of the reference's time over the
   submission's, credited only when the sign test tells it from parity
   (``farmd.verifier.speed``).

The recorder times each call from its own process; the reference's source lives
only in the recorder's memory and its runner's. A reference stopped or disturbed
once the submission is loaded fails the submission; work done out of the
runners' sight (another process) shows in the box's CPU count and fails it too.
A submission that tries to import the reference, or anything but numpy and math,
gets nothing.
"""

from __future__ import annotations

import asyncio
import base64
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from farmd.envs.base import Attempt, Environment, Task, VerifyContext
from farmd.errors import FarmError
from farmd.sandbox import SandboxPolicy
from farmd.verifier import judge
from farmd.verifier.boxjudge import JudgeReport, TestOutcome, broke_a_rule, opening_verdict, run_judge
from farmd.verifier.secret import public_rng
from farmd.verifier.speed import Speed, paired_speed
from farmd.verifier.verdict import (
    SUSPECTED_HACK,
    TIMEOUT,
    Verdict,
    errored,
    unreadable_source,
)

ENTRY_POINT = "kernel"
ALLOWED_IMPORTS = frozenset({"numpy", "math"})
MAX_SUBMISSION_BYTES = 100_000
CHECKS = 4
"""Correctness tests before timing (edge cases among them)."""
WARMUP = 1
"""Timed rounds whose times are thrown away: the first calls of a process grow its heap."""
TIMED = 12
"""Timed rounds that count: each a fresh input answered by the reference and by the submission,
in alternating order. Even, so that each side goes first equally often."""
CONFIDENCE = 0.95
"""Speed is credited only when the sign test's interval for the median speedup, at this confidence,
leaves out parity; otherwise the kernel is as fast as the reference, as far as can be told."""
SAMPLE = 4096
"""Elements of each output that come out of the box and are checked, at positions drawn with the
verifier's key for this run (the runner never learns which)."""
POLICY = SandboxPolicy(wall_time_s=60, cpu_time_s=60, memory_mb=1024, pids=32, disk_mb=128, tmp_mb=16,
                       output_kb=32 * 1024)
PER_CALL_S = 5.0
SPEED_AT_PARITY = 0.5
"""Reward of a correct kernel exactly as fast as the reference; twice as fast earns 1.0."""
MIN_REWARD = 0.05
"""A correct kernel, however slow, is worth more than a wrong one."""
MIN_COMPUTE_S = 20e-6
"""Below this, a call's time net of its overhead is noise: speedups are capped through it."""
UNSEEN_CPU_S = 0.02
UNSEEN_CPU_SHARE = 0.05
"""CPU time the box spends beyond what its judge's processes account for, over which the attempt is
taken to have worked out of its runner's sight: this much, plus this share of the box's total (the
box's init and the counts' skew made 2 to 6 ms here)."""
UNSEEN_TREE_CPU_S = 0.001
"""CPU time of processes the submission's runner started and reaped, over which the same holds (a
correct kernel starts none: under a microsecond was measured here, the counts' own skew)."""


@dataclass(frozen=True)
class Arg:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class KernelOp:
    name: str
    level: int
    words: str
    """What the kernel computes, in words, with {placeholders} for the op's constants."""
    source: str
    """The reference: defines ``kernel(...)``; {placeholders} as above."""
    args: Callable[[random.Random, int], tuple[Arg, ...]]
    out: Callable[[tuple[Arg, ...]], Arg]
    consts: Callable[[random.Random], dict[str, Any]] = lambda rng: {}
    rtol: float = 1e-4
    atol: float = 1e-5


def _rows(dtype: str = "float32", rows: tuple[int, int] = (384, 512)) -> Callable[[random.Random, int], tuple[Arg, ...]]:
    # Sizes are chosen per op so that the reference's own work is a good part of a call's CPU time
    # (a quarter to a half of it for the cheapest ops, whose work is a few passes over the data,
    # like the call's own copies in and out; most of it for the others), and the arrays stay
    # about a MiB, in reach of the caches, so that a verification stays cheap.
    def make(rng: random.Random, level: int) -> tuple[Arg, ...]:
        return (Arg("x", (rng.choice(rows), rng.choice((512, 640))), dtype),)
    return make


def _same(args: tuple[Arg, ...]) -> Arg:
    return Arg("out", args[0].shape, args[0].dtype)


def _window_out(args: tuple[Arg, ...]) -> Arg:
    b, n = args[0].shape
    return Arg("out", (b, n - 7 + 1), args[0].dtype)  # the windowed ops use windows of 7


def _conv_args(rng: random.Random, level: int) -> tuple[Arg, ...]:
    return (Arg("x", (rng.choice((192, 256)), rng.choice((192, 256))), "float32"), Arg("k", (3, 3), "float32"))


def _conv_out(args: tuple[Arg, ...]) -> Arg:
    h, w = args[0].shape
    return Arg("out", (h - 2, w - 2), "float32")


OPS: tuple[KernelOp, ...] = (
    KernelOp("scaled_relu", 1, "max(x, 0) * {a} + {b}, elementwise",
             "import numpy as np\n\ndef kernel(x):\n    return (np.maximum(x, 0) * np.float32({a}) + np.float32({b})).astype(np.float32)\n",
             _rows(), _same, lambda rng: {"a": rng.choice((0.5, 2.0, 3.0)), "b": rng.choice((-1.0, 0.25, 1.0))}),
    KernelOp("row_cumsum", 1, "the running sum along each row (axis 1), in float64",
             "import numpy as np\n\ndef kernel(x):\n    return np.cumsum(x, axis=1)\n",
             _rows("float64", (192, 256)), _same, rtol=1e-9, atol=1e-9),
    KernelOp("softmax", 2, "the softmax of each row (axis 1): exp(x - max) / sum(exp(x - max))",
             "import numpy as np\n\ndef kernel(x):\n    e = np.exp(x - x.max(axis=1, keepdims=True))\n"
             "    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)\n",
             _rows(), _same, rtol=1e-4, atol=1e-7),
    KernelOp("log_softmax", 2, "the log-softmax of each row (axis 1)",
             "import numpy as np\n\ndef kernel(x):\n    m = x.max(axis=1, keepdims=True)\n"
             "    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)\n",
             _rows(), _same, rtol=1e-4, atol=1e-4),
    KernelOp("layer_norm", 3, "layer normalization of each row (axis 1): (x - mean) / sqrt(var + {eps}), "
             "with the population variance",
             "import numpy as np\n\ndef kernel(x):\n    mean = x.mean(axis=1, keepdims=True)\n"
             "    var = x.var(axis=1, keepdims=True)\n    return ((x - mean) / np.sqrt(var + {eps})).astype(np.float32)\n",
             _rows(), _same, lambda rng: {"eps": rng.choice((1e-5, 1e-3))}, rtol=1e-3, atol=1e-3),
    KernelOp("standardize_cols", 3, "each column (axis 0) minus its mean, divided by its population standard "
             "deviation plus {eps}",
             "import numpy as np\n\ndef kernel(x):\n    return ((x - x.mean(axis=0)) / (x.std(axis=0) + {eps})).astype(np.float32)\n",
             _rows(), _same, lambda rng: {"eps": rng.choice((1e-5, 1e-3))}, rtol=1e-3, atol=1e-3),
    KernelOp("moving_mean", 4, "the mean of each window of 7 consecutive values along each row (valid "
             "windows only: out[i, j] = mean(x[i, j:j+7]))",
             "import numpy as np\n\ndef kernel(x):\n"
             "    return np.lib.stride_tricks.sliding_window_view(x, 7, axis=1).mean(axis=-1).astype(np.float32)\n",
             _rows(rows=(48, 64)), _window_out, rtol=1e-4, atol=1e-5),
    KernelOp("moving_max", 4, "the maximum of each window of 7 consecutive values along each row (valid "
             "windows only: out[i, j] = max(x[i, j:j+7]))",
             "import numpy as np\n\ndef kernel(x):\n"
             "    return np.lib.stride_tricks.sliding_window_view(x, 7, axis=1).max(axis=-1)\n",
             _rows(rows=(48, 64)), _window_out, rtol=0.0, atol=0.0),
    KernelOp("conv2d", 5, "the 2-D cross-correlation of x with the 3x3 kernel k, valid positions only: "
             "out[i, j] = sum over a, b of x[i + a, j + b] * k[a, b]",
             "import numpy as np\n\ndef kernel(x, k):\n"
             "    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3))\n"
             "    return np.einsum('ijab,ab->ij', win, k).astype(np.float32)\n",
             _conv_args, _conv_out, rtol=1e-4, atol=1e-4),
    KernelOp("pairwise_sqdist", 5, "the squared Euclidean distance between every row of x and every row of "
             "y: out[i, j] = sum((x[i] - y[j]) ** 2)",
             "import numpy as np\n\ndef kernel(x, y):\n"
             "    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(axis=-1).astype(np.float32)\n",
             lambda rng, level: (Arg("x", (rng.choice((96, 128)), 48), "float32"),
                                 Arg("y", (rng.choice((96, 128)), 48), "float32")),
             lambda args: Arg("out", (args[0].shape[0], args[1].shape[0]), "float32"), rtol=1e-3, atol=1e-3),
)


@dataclass(frozen=True)
class Spec:
    op: KernelOp
    args: tuple[Arg, ...]
    out: Arg
    consts: dict[str, Any]

    def reference_source(self) -> str:
        return self.op.source.format(**self.consts)

    def reference(self) -> Callable[..., np.ndarray]:
        namespace: dict[str, Any] = {}
        exec(compile(self.reference_source(), "<kernel reference>", "exec"), namespace)  # our own code
        fn: Callable[..., np.ndarray] = namespace[ENTRY_POINT]
        return fn


class Kernel(Environment):
    name = "kernel"
    version = "2"
    """2: arrays sized for timing (1: about 100 x 600, calls shorter than their overhead)."""
    verifier_version = "2"
    """2: CPU time of paired rounds, credit only when significant (1: wall time of 5 calls each, alone)."""
    max_difficulty = 5
    exploit_kind = "kernel"

    def spec(self, seed: int, difficulty: int) -> Spec:
        self.check_difficulty(difficulty)
        rng = public_rng(self.name, self.version, seed, difficulty)
        op = rng.choice([op for op in OPS if op.level == difficulty])
        args = op.args(rng, difficulty)
        return Spec(op, args, op.out(args), op.consts(rng))

    def generate(self, seed: int, difficulty: int) -> Task:
        s = self.spec(seed, difficulty)
        signature = ", ".join(a.name for a in s.args)
        arg_lines = "\n".join(f"- `{a.name}`: a {a.dtype} array of shape {a.shape}" for a in s.args)
        prompt = (
            f"Write a fast NumPy function `{ENTRY_POINT}({signature})` that returns "
            f"{s.op.words.format(**s.consts)}.\n\nArguments:\n{arg_lines}\n\n"
            f"Return a {s.out.dtype} array of shape {s.out.shape}; it must not modify its arguments.\n\n"
            f"It is checked on fresh hidden inputs (including large magnitudes and constant rows), within a "
            f"tolerance of rtol={s.op.rtol:g} scaled by the output's magnitude; the dtype and shape must be exact. "
            "A correct function is then timed against a reference implementation on fresh inputs, by the CPU "
            "time each takes on one thread: the reward grows with its speed "
            f"({SPEED_AT_PARITY:g} at the reference's speed, 1.0 at twice as fast). "
            "Only numpy and math may be imported. Submit Python source code that defines the function."
        )
        return Task(env=self.name, env_version=self.version, seed=seed, difficulty=difficulty, prompt=prompt,
                    entry_point=ENTRY_POINT,
                    metadata={"op": s.op.name, "args": [[a.name, list(a.shape), a.dtype] for a in s.args],
                              "out": [list(s.out.shape), s.out.dtype], "rtol": s.op.rtol})

    def reference(self, task: Task) -> Attempt:
        return Attempt(final=self.spec(task.seed, task.difficulty).reference_source())

    def inputs(self, s: Spec, task: Task, ctx: VerifyContext) -> list[list[np.ndarray]]:
        """Hidden inputs: CHECKS correctness cases (edge cases first), then WARMUP + TIMED fresh ones."""
        rng = np.random.default_rng(ctx.key.seed(self.name, self.version, task.seed, task.difficulty, "hidden"))
        cases: list[list[np.ndarray]] = []
        for i in range(CHECKS + WARMUP + TIMED):
            arrays = []
            for a in s.args:
                # Drawn in the array's own dtype (float32 normals cost half of float64 ones) and scaled
                # in place: arrays of a MiB, and a verification draws seventeen of them.
                kind = np.dtype(a.dtype).type
                if a.shape == (3, 3):  # a small kernel operand: ordinary values
                    arr = rng.standard_normal(a.shape)
                elif i == 0:
                    arr = rng.standard_normal(a.shape, dtype=kind)
                    arr *= 1e3  # large magnitudes: overflow if unstabilized
                elif i == 1:
                    arr = np.repeat(rng.standard_normal((a.shape[0], 1)), a.shape[1], axis=1) if len(a.shape) == 2 \
                        else rng.standard_normal(a.shape)  # constant rows
                elif i == 2:
                    arr = rng.standard_normal(a.shape, dtype=kind)
                    np.abs(arr, out=arr)
                    arr *= -50
                elif i < CHECKS:
                    arr = rng.standard_normal(a.shape, dtype=kind)
                    arr *= rng.choice((0.1, 1.0, 10.0))
                else:
                    # The timed inputs: uniform values, a third of the cost of normal ones to draw.
                    arr = rng.random(a.shape, dtype=kind)
                    arr -= 0.5
                    arr *= 2 * rng.choice((0.1, 1.0, 10.0))
                arrays.append(np.ascontiguousarray(arr, dtype=a.dtype))
            cases.append(arrays)
        return cases

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        v = self.verifier_version
        source = attempt.final
        # Only what needs no parsing is checked here. The source is compiled, and held to the rules
        # (static_problem's, then an audit hook while it runs), in the judge's box.
        bad = unreadable_source(v, source, MAX_SUBMISSION_BYTES)
        if bad is not None:
            return bad
        try:
            # Megabytes of inputs and the reference's outputs: made off the event loop, which runs every
            # box's timer and the API.
            s, expected, spec, blobs = await asyncio.to_thread(self._prepare, task, ctx)
        except Exception as exc:
            return errored(v, f"the reference failed: {type(exc).__name__}: {exc}")
        try:
            report = await run_judge(ctx.sandbox, source, spec, POLICY, blobs=blobs)
        except FarmError as exc:
            return errored(v, f"the judge's box failed: {exc}")
        samples = {t["id"]: t["sample"] for t in spec["tests"] if "sample" in t}
        return await asyncio.to_thread(judge_kernel, v, s, report, expected, samples)

    def _prepare(self, task: Task, ctx: VerifyContext) -> tuple[Spec, list[np.ndarray], dict[str, Any],
                                                                dict[str, bytes]]:
        """The task's spec, the expected outputs, the judge's spec (tests, samples) and its input blobs."""
        s = self.spec(task.seed, task.difficulty)
        cases = self.inputs(s, task, ctx)
        fn = s.reference()
        expected = [np.asarray(fn(*[a.copy() for a in case])) for case in cases]
        tests, blobs = [], {}
        sample_rng = np.random.default_rng(
            ctx.key.seed(self.name, self.version, task.seed, task.difficulty, "sample", ctx.key.nonce()))
        for i, case in enumerate(cases):
            blobs[f"in{i}.bin"] = b"".join(a.tobytes() for a in case)
            test: dict[str, Any] = {"id": i, "arrays": [[a.dtype.str, list(a.shape)] for a in case],
                                    "blob": f"in{i}.bin", "timed": i >= CHECKS}
            if i >= CHECKS:  # each timed input also measures the call's overhead, on the reference's runner
                test["echo"] = [expected[i].dtype.str, list(expected[i].shape)]
            size = int(expected[i].size)
            test["sample"] = np.sort(sample_rng.choice(size, min(SAMPLE, size), replace=False)).tolist()
            tests.append(test)
        spec = {"nonce": ctx.key.nonce(), "mode": "array", "entry_point": ENTRY_POINT, "per_call_s": PER_CALL_S,
                "tests": tests, "reference_source": s.reference_source(),
                "rules": {"imports": sorted(ALLOWED_IMPORTS)}}
        return s, expected, spec, blobs


def static_problem(source: str) -> str | None:
    """Why the source is refused before it runs (does not compile, imports beyond numpy and math,
    dynamic code, the interpreter's internals), or None: the judge's first line of rules.

    For tools and tests; ``verify`` never parses a submission on the host: the judge checks the same
    rules in its box, before any of the code runs. Never raises, whatever the source.
    """
    problem = judge.source_problem(source, {"imports": sorted(ALLOWED_IMPORTS)})  # type: ignore[no-untyped-call]
    if problem is None:
        return None
    if problem["kind"] == "unparseable":
        return f"does not compile: {problem['error']}"
    return str(problem["why"])


def judge_kernel(version: str, s: Spec, report: JudgeReport, expected: list[np.ndarray],
                 samples: dict[int, list[int]]) -> Verdict:
    verdict, readable = opening_verdict(version, report)
    if not readable:
        return verdict
    # The correctness checks: the reference answered them alone, before the submission was loaded,
    # so its failing there is ours, not the attempt's.
    for i in range(CHECKS):
        ref = report.ref_outcomes.get(i)
        if ref is None or not ref.ok or not _matches(ref, expected[i], s, samples.get(i))[0]:
            return errored(version, f"the reference's own run failed on test {i}")
    wrong = 0
    for i, want in enumerate(expected):
        outcome = report.outcomes.get(i)
        if outcome is None or outcome.lost or not outcome.ok:
            wrong += 1
            why = "no answer" if outcome is None else (outcome.lost and f"no answer ({outcome.lost})") or outcome.error
            if outcome is not None and outcome.lost:
                verdict.flag(TIMEOUT if outcome.lost == "timeout" else SUSPECTED_HACK)
            if outcome is not None and broke_a_rule(outcome):
                verdict.flag(SUSPECTED_HACK)
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: {why}")
            continue
        ok, why = _matches(outcome, want, s, samples.get(i))
        if not ok:
            wrong += 1
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: {why}")
    rounds = _timed_rounds(verdict, s, report, expected, samples)
    unseen = _unseen_work(report)
    if unseen is not None:
        verdict.flag(SUSPECTED_HACK)
        verdict.reasons.insert(0, unseen)
    speed, details = _speed(rounds)
    verdict.details = {"tests": len(expected), "failed": wrong, **details}
    if wrong == 0 and report.done and not report.anomalies and not verdict.flags:
        verdict.passed = True
        verdict.reward = max(MIN_REWARD, min(1.0, SPEED_AT_PARITY * speed))
        verdict.reasons = [f"all {len(expected)} outputs correct; {speed:.2f}x the reference's speed"
                           + ("" if details["significant"] else " (no difference the timing can tell)")]
    return verdict


@dataclass(frozen=True)
class _Round:
    ref: TestOutcome
    echo: TestOutcome
    sub: TestOutcome
    ref_first: bool
    """The judge's order: the reference first in even rounds, the submission first in odd ones."""


def _timed_rounds(verdict: Verdict, s: Spec, report: JudgeReport, expected: list[np.ndarray],
                  samples: dict[int, list[int]]) -> list[_Round]:
    """The rounds that count, with both sides' answers. From the first timed test on, the reference
    ran beside the loaded submission: a reference that stopped answering or answered wrong there
    was stopped or disturbed by the submission (it cannot fail by itself on a test the host's copy
    of it passed), and the attempt is flagged for it."""
    rounds = []
    for i in range(CHECKS, len(expected)):
        ref = report.ref_outcomes.get(i)
        echo = report.ref_outcomes.get(-1 - i)
        if any(o is not None and (o.lost or "").startswith("not run") for o in (ref, echo)):
            continue  # the submission had stopped answering: the reference was not asked
        if ref is None or echo is None or not ref.ok or not echo.ok \
                or not _matches(ref, expected[i], s, samples.get(i))[0]:
            verdict.flag(SUSPECTED_HACK)
            lost = (ref.lost if ref is not None else None) or (echo.lost if echo is not None else None)
            verdict.reasons.insert(0, f"test {i}: the reference, running beside the submission, "
                                      + (f"stopped answering ({lost})" if lost else "was disturbed"))
            return []
        sub = report.outcomes.get(i)
        if i >= CHECKS + WARMUP and sub is not None and sub.ok:
            rounds.append(_Round(ref, echo, sub, ref_first=(i - CHECKS) % 2 == 0))
    return rounds


def _speed(rounds: list[_Round]) -> tuple[float, dict[str, Any]]:
    """The speedup the reward is computed from, and the figures behind it.

    Timed by the runners' CPU time: on a machine shared with other work, time spent preempted is
    most of the noise of a wall clock (measured here: a true 2x read as 0.4x to 3x by wall time on
    a loaded machine, 1.9x to 2.1x by CPU time), and a runner's CPU clock does not count it, nor
    the time a neighbour holds the box's CPU quota. What a call costs besides the function (moving
    arrays through pipes, checking them) is measured by the reference's echoes and taken off both
    sides, so that the speedup is the functions'. Going first in a round costs more (measured
    here: about 100 us more for the echo and the call alike), so the overhead taken off a call is
    that of the reference's echoes in the same place: the first-goer's in the rounds where the
    reference went first, the second's in the others. Work a runner's CPU clock cannot see (a
    helper process) is caught by the box's CPU count instead: see ``_unseen_work``.
    """
    cpu_known = bool(rounds) and all(x.ref.cpu_seconds is not None and x.echo.cpu_seconds is not None
                                     and x.sub.cpu_seconds is not None for x in rounds)

    def clock(outcome: TestOutcome) -> float:
        return outcome.cpu_seconds if cpu_known and outcome.cpu_seconds is not None else outcome.seconds

    def wall(outcome: TestOutcome) -> float:
        return outcome.seconds

    def measure(of: Callable[[TestOutcome], float]) -> tuple[Speed, float]:
        if not rounds:
            return paired_speed([], []), 0.0
        echoes = {first: [of(x.echo) for x in rounds if x.ref_first == first] or [of(x.echo) for x in rounds]
                  for first in (True, False)}
        overhead = {first: float(np.median(e)) for first, e in echoes.items()}  # keyed by "went first"
        ref = [of(x.ref) - overhead[x.ref_first] for x in rounds]
        sub = [of(x.sub) - overhead[not x.ref_first] for x in rounds]
        speed = paired_speed(ref, sub, floor_s=MIN_COMPUTE_S, confidence=CONFIDENCE)
        return speed, float(np.median([of(x.echo) for x in rounds]))

    def median(side: str) -> float | None:
        return float(np.median([clock(getattr(x, side)) for x in rounds])) if rounds else None

    speed, overhead = measure(clock)
    credited = speed.credited if rounds else 0.0
    return credited, {
        "clock": "cpu" if cpu_known else "wall", "rounds": speed.rounds, "speedup": credited,
        "speedup_median": speed.ratio, "speedup_interval": [speed.low, speed.high],
        "significant": speed.significant, "wall_speedup_median": measure(wall)[0].ratio,
        "call_overhead_s": overhead, "reference_median_s": median("ref"), "submission_median_s": median("sub"),
    }


def _unseen_work(report: JudgeReport) -> str | None:
    """Why the box's CPU time does not add up to what its runners' clocks saw, or None.

    The recorder counts its own CPU time and its reaped runners' (the submission's runner's with and
    without the children it reaped); the box's cgroup counts every process's. A correct kernel works
    on its runner's own thread, so the counts agree. Work done in another process (reaped by the
    submission's runner, or left behind) is invisible to the runner's CPU clock and would read as
    speed: it shows up here instead."""
    cpu = report.cpu_s
    if "runner" in cpu and "runner_tree" in cpu and cpu["runner_tree"] - cpu["runner"] > UNSEEN_TREE_CPU_S:
        return (f"{cpu['runner_tree'] - cpu['runner']:.3f} s of CPU time was spent by processes the submission "
                "started (kernels run on their caller's thread only)")
    if "all" in cpu and report.box.cpu_s - cpu["all"] > UNSEEN_CPU_S + UNSEEN_CPU_SHARE * report.box.cpu_s:
        return (f"{report.box.cpu_s - cpu['all']:.3f} s of the box's CPU time was spent outside the judge's "
                "processes (kernels run on their caller's thread only)")
    return None


def _matches(outcome: TestOutcome, want: np.ndarray, s: Spec, sample: list[int] | None = None) -> tuple[bool, str]:
    if outcome.dtype != want.dtype.str:
        return False, f"dtype {outcome.dtype}, expected {want.dtype.str}"
    if outcome.shape != list(want.shape):
        return False, f"shape {outcome.shape}, expected {list(want.shape)}"
    if sample is not None:
        want = want.ravel()[np.asarray(sample, dtype=np.int64)]
    try:
        raw = base64.b64decode(outcome.data or "", validate=True)
        got = np.frombuffer(raw, dtype=want.dtype).reshape(want.shape)
    except (ValueError, TypeError):
        return False, "unreadable output"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        tol = s.op.atol * scale + s.op.rtol * np.abs(want.astype(np.float64))
        # "not err <= tol", element by element: NaN anywhere in the output fails.
        if not bool(np.all(err <= tol)):
            return False, f"wrong values (max error {float(np.nanmax(err)) if np.isfinite(err).any() else 'nan'})"
    if want.size > 1 and np.ptp(want) > 0 and np.ptp(got) == 0:
        return False, "constant output where the reference varies"
    if np.any(want != 0) and not np.any(got):
        return False, "all-zero output"
    return True, ""
