"""``kernel``: write a fast NumPy function, correct on fresh hidden inputs, rewarded for speed.

A task names an operation (scaled ReLU, cumulative sums, softmax, layer norm,
windowed means and maxima, small convolutions; harder ones at higher
difficulty), its entry point, argument shapes and dtypes. Verification is one box:

1. the judge's reference runner times the reference on fresh inputs, alone;
2. the submission's runner answers correctness tests (edge cases included: large
   magnitudes, constant rows) and then the same timed tests, each a fresh input;
3. on the host, every output is checked against the reference computed here:
   exact dtype and shape, and at SAMPLE positions drawn for this run (whole
   outputs would be megabytes through the box's stdout) within a magnitude-aware
   tolerance (NaN fails, a constant or all-zero output where the reference is not
   fails).

The recorder times each call from its own process; the reference's source lives
only in the recorder's memory and its runner has exited before the submission's
code is loaded. A submission that tries to import the reference, or anything but
numpy and math, gets nothing.
"""

from __future__ import annotations

import ast
import base64
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from farmd.envs.base import Attempt, Environment, Task, VerifyContext
from farmd.errors import FarmError
from farmd.sandbox import SandboxPolicy
from farmd.verifier.boxjudge import JudgeReport, TestOutcome, opening_verdict, run_judge
from farmd.verifier.secret import public_rng
from farmd.verifier.verdict import (
    SUSPECTED_HACK,
    TIMEOUT,
    Verdict,
    errored,
    failed,
    unreadable_source,
)

ENTRY_POINT = "kernel"
ALLOWED_IMPORTS = frozenset({"numpy", "math"})
MAX_SUBMISSION_BYTES = 100_000
CHECKS = 4
"""Correctness tests before timing (edge cases among them)."""
WARMUP = 1
TIMED = 5
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


def _rows(dtype: str = "float32") -> Callable[[random.Random, int], tuple[Arg, ...]]:
    # Big enough that a call's compute, not its data's trip through a pipe, is what gets timed.
    def make(rng: random.Random, level: int) -> tuple[Arg, ...]:
        return (Arg("x", (rng.choice((96, 128)), rng.choice((512, 640))), dtype),)
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
             _rows("float64"), _same, rtol=1e-9, atol=1e-9),
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
             _rows(), _window_out, rtol=1e-4, atol=1e-5),
    KernelOp("moving_max", 4, "the maximum of each window of 7 consecutive values along each row (valid "
             "windows only: out[i, j] = max(x[i, j:j+7]))",
             "import numpy as np\n\ndef kernel(x):\n"
             "    return np.lib.stride_tricks.sliding_window_view(x, 7, axis=1).max(axis=-1)\n",
             _rows(), _window_out, rtol=0.0, atol=0.0),
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
             lambda rng, level: (Arg("x", (rng.choice((64, 96)), 48), "float32"),
                                 Arg("y", (rng.choice((64, 96)), 48), "float32")),
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
    version = "1"
    verifier_version = "1"
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
            "A correct function is then timed against a reference implementation on fresh inputs: the reward "
            f"grows with its speed ({SPEED_AT_PARITY:g} at the reference's speed, 1.0 at twice as fast). "
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
                if a.shape == (3, 3):  # a small kernel operand: ordinary values
                    arr = rng.standard_normal(a.shape)
                elif i == 0:
                    arr = rng.standard_normal(a.shape) * 1e3  # large magnitudes: overflow if unstabilized
                elif i == 1:
                    arr = np.repeat(rng.standard_normal((a.shape[0], 1)), a.shape[1], axis=1) if len(a.shape) == 2 \
                        else rng.standard_normal(a.shape)  # constant rows
                elif i == 2:
                    arr = -np.abs(rng.standard_normal(a.shape)) * 50
                else:
                    arr = rng.standard_normal(a.shape) * rng.choice((0.1, 1.0, 10.0))
                arrays.append(np.ascontiguousarray(arr, dtype=a.dtype))
            cases.append(arrays)
        return cases

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        v = self.verifier_version
        source = attempt.final
        bad = unreadable_source(v, source, MAX_SUBMISSION_BYTES)
        if bad is not None:
            return bad
        problem = static_problem(source)
        if problem is not None:
            verdict = failed(v, problem)
            if "reference" in problem or "import" in problem or "internals" in problem or "may not" in problem:
                verdict.flag(SUSPECTED_HACK)
            return verdict
        try:
            s = self.spec(task.seed, task.difficulty)
            cases = self.inputs(s, task, ctx)
            fn = s.reference()
            expected = [np.asarray(fn(*[a.copy() for a in case])) for case in cases]
        except Exception as exc:
            return errored(v, f"the reference failed: {type(exc).__name__}: {exc}")
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
                "tests": tests, "reference_source": s.reference_source()}
        try:
            report = await run_judge(ctx.sandbox, source, spec, POLICY, blobs=blobs)
        except FarmError as exc:
            return errored(v, f"the judge's box failed: {exc}")
        samples = {t["id"]: t["sample"] for t in tests if "sample" in t}
        return judge_kernel(v, s, report, expected, samples)


def static_problem(source: str) -> str | None:
    """Why the source is refused before it runs (imports beyond numpy and math), or None."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        return f"does not compile: {exc}"
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else ["(relative import)"]
        for name in names:
            root = name.split(".")[0]
            if root not in ALLOWED_IMPORTS:
                if "reference" in name.lower():
                    return f"imports {name}: calling the reference gets nothing"
                return f"imports {name}: only numpy and math may be imported"
        if isinstance(node, ast.Name) and node.id in ("__import__", "exec", "eval", "compile", "open", "globals",
                                                       "vars", "breakpoint"):
            return f"uses {node.id}, which kernels may not"
        # Dunder names are how code reaches what it was not given (builtins, modules, frames).
        dunder = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                  else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "")
        if dunder.startswith("__") and dunder.endswith("__") and dunder not in ("__name__", "__init__"):
            return f"uses {dunder}: kernels may not reach into the interpreter's internals"
    return None


def judge_kernel(version: str, s: Spec, report: JudgeReport, expected: list[np.ndarray],
                 samples: dict[int, list[int]]) -> Verdict:
    verdict, readable = opening_verdict(version, report)
    if not readable:
        return verdict
    # The reference ran alone, before the submission existed: its failing is ours, not the attempt's.
    ref_times = []
    echo_times = []
    for i in range(len(expected)):
        ref = report.ref_outcomes.get(i)
        echo = report.ref_outcomes.get(-1 - i) if i >= CHECKS else None
        if ref is None or not ref.ok or not _matches(ref, expected[i], s, samples.get(i))[0] \
                or (i >= CHECKS and (echo is None or not echo.ok)):
            return errored(version, f"the reference's own run failed on test {i}")
        if i >= CHECKS + WARMUP and echo is not None:
            ref_times.append(ref.seconds)
            echo_times.append(echo.seconds)
    # What a call costs besides the function (moving arrays through pipes) is measured on the
    # reference's runner and taken off both sides, so that the speedup is the functions'.
    overhead = float(np.median(echo_times))
    wrong = 0
    sub_times = []
    for i, want in enumerate(expected):
        outcome = report.outcomes.get(i)
        if outcome is None or outcome.lost or not outcome.ok:
            wrong += 1
            why = "no answer" if outcome is None else (outcome.lost and f"no answer ({outcome.lost})") or outcome.error
            if outcome is not None and outcome.lost:
                verdict.flag(TIMEOUT if outcome.lost == "timeout" else SUSPECTED_HACK)
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: {why}")
            continue
        ok, why = _matches(outcome, want, s, samples.get(i))
        if not ok:
            wrong += 1
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: {why}")
        elif i >= CHECKS + WARMUP:
            sub_times.append(outcome.seconds)
    ref_median = float(np.median(ref_times))
    sub_median = float(np.median(sub_times)) if sub_times else float("inf")
    floor = MIN_COMPUTE_S
    speedup = (max(ref_median - overhead, floor) / max(sub_median - overhead, floor)) if sub_times else 0.0
    verdict.details = {"tests": len(expected), "failed": wrong, "reference_median_s": ref_median,
                       "submission_median_s": sub_median if sub_times else None, "call_overhead_s": overhead,
                       "speedup": speedup}
    if wrong == 0 and report.done and not report.anomalies and not verdict.flags:
        verdict.passed = True
        verdict.reward = max(MIN_REWARD, min(1.0, SPEED_AT_PARITY * speedup))
        verdict.reasons = [f"all {len(expected)} outputs correct; {speedup:.2f}x the reference's speed"]
    return verdict


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
