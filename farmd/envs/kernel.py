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

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from farmd.envs.base import Attempt, JudgeRun, Rule, SourceEnvironment, Task, VerifyContext
from farmd.sandbox import SandboxPolicy
from farmd.verifier import judge
from farmd.verifier.kernels import CHECKS, SPEED_AT_PARITY, WARMUP, Tolerance, judge_kernel

if TYPE_CHECKING:  # numpy is imported where a kernel task is made: a farmd that serves none never loads it
    import numpy as np

ENTRY_POINT = "kernel"
ALLOWED_IMPORTS = frozenset({"numpy", "math"})
IMPORTS_RULE = "Only numpy and math may be imported"
NO_MODIFYING = "it must not modify its arguments"
RULES = (Rule("imports", IMPORTS_RULE), Rule("arguments", NO_MODIFYING))
"""What every kernel task states beyond being right, as it states it: held in the judge's box (imports refused
before the code runs, the audit hook while it runs, each call's inputs compared with what was sent), where a
breach fails the attempt flagged ``rule_broken``."""
MAX_SUBMISSION_BYTES = 100_000
TIMED = 12
"""Timed rounds that count: each a fresh input answered by the reference and by the submission,
in alternating order. Even, so that each side goes first equally often."""
SAMPLE = 4096
"""Elements of each output that come out of the box and are checked, at positions drawn with the
verifier's key for this run (the runner never learns which)."""
POLICY = SandboxPolicy(wall_time_s=60, cpu_time_s=60, memory_mb=1024, pids=32, disk_mb=128, tmp_mb=16,
                       output_kb=32 * 1024)
PER_CALL_S = 5.0


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

    @property
    def tolerance(self) -> Tolerance:
        return Tolerance(atol=self.op.atol, rtol=self.op.rtol)

    def reference_source(self) -> str:
        return self.op.source.format(**self.consts)

    def reference(self) -> Callable[..., np.ndarray]:
        namespace: dict[str, Any] = {}
        exec(compile(self.reference_source(), "<kernel reference>", "exec"), namespace)  # our own code
        fn: Callable[..., np.ndarray] = namespace[ENTRY_POINT]
        return fn


class Kernel(SourceEnvironment):
    name = "kernel"
    version = "2"
    """2: arrays sized for timing (1: about 100 x 600, calls shorter than their overhead)."""
    verifier_version = "2"
    max_submission_bytes = MAX_SUBMISSION_BYTES
    judge_policy = POLICY
    """2: CPU time of paired rounds, credit only when significant (1: wall time of 5 calls each, alone)."""
    max_difficulty = 5
    exploit_kind = "kernel"

    def spec(self, seed: int, difficulty: int) -> Spec:
        rng = self.public_rng(seed, difficulty)
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
            f"Return a {s.out.dtype} array of shape {s.out.shape}; {NO_MODIFYING}.\n\n"
            f"It is checked on fresh hidden inputs (including large magnitudes and constant rows), within a "
            f"tolerance of rtol={s.op.rtol:g} scaled by the output's magnitude; the dtype and shape must be exact. "
            "A correct function is then timed against a reference implementation on fresh inputs, by the CPU "
            "time each takes on one thread: the reward grows with its speed "
            f"({SPEED_AT_PARITY:g} at the reference's speed, 1.0 at twice as fast). "
            f"{IMPORTS_RULE}. Submit Python source code that defines the function."
        )
        return self.task(seed, difficulty, prompt, entry_point=ENTRY_POINT,
                         metadata={"op": s.op.name, "args": [[a.name, list(a.shape), a.dtype] for a in s.args],
                                   "out": [list(s.out.shape), s.out.dtype], "rtol": s.op.rtol})

    def reference(self, task: Task) -> Attempt:
        return Attempt(final=self.spec(task.seed, task.difficulty).reference_source())

    def rules(self, task: Task) -> tuple[Rule, ...]:
        return RULES

    def families(self) -> tuple[str, ...]:
        return tuple(op.name for op in OPS)

    def family_of(self, seed: int, difficulty: int) -> str:
        return self.spec(seed, difficulty).op.name

    def inputs(self, s: Spec, task: Task, ctx: VerifyContext) -> list[list[np.ndarray]]:
        """Hidden inputs: CHECKS correctness cases (edge cases first), then WARMUP + TIMED fresh ones."""
        import numpy as np

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

    def prepare(self, task: Task, ctx: VerifyContext) -> JudgeRun:
        # Only what needs no parsing is checked on the host (SourceEnvironment.verify). The source is
        # compiled, and held to the rules (static_problem's, then an audit hook while it runs), in the
        # judge's box. Megabytes of inputs and the reference's outputs are made here, in a thread.
        s, expected, spec, blobs = self._prepare(task, ctx)
        samples = {t["id"]: t["sample"] for t in spec["tests"] if "sample" in t}
        v = self.verifier_version
        return JudgeRun(spec, lambda report: judge_kernel(v, s.tolerance, report, expected, samples), blobs)

    def _prepare(self, task: Task, ctx: VerifyContext) -> tuple[Spec, list[np.ndarray], dict[str, Any],
                                                                dict[str, bytes]]:
        """The task's spec, the expected outputs, the judge's spec (tests, samples) and its input blobs."""
        import numpy as np

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
    problem = judge.source_problem(source, {"imports": sorted(ALLOWED_IMPORTS)})
    if problem is None:
        return None
    if problem["kind"] == "unparseable":
        return f"does not compile: {problem['error']}"
    return str(problem["why"])
