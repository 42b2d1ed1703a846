"""``py-func``: write a Python function that transforms lists, strings and integers.

A task is a chain of simple operations (``difficulty`` of them, 1..5), described
in words, with two or three public examples. The reference is the same chain as
code; it is also what computes the expected outputs, on the host, for at least 20
hidden inputs (drawn with the verifier's key) plus edge cases. The submission is
judged in a box by the verifier kit's judge; only canonical values come out, and
they are compared on the host.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from farmd.envs.base import Attempt, JudgeRun, Rule, SourceEnvironment, Task, VerifyContext, numbered
from farmd.errors import TaskError
from farmd.sandbox import SandboxPolicy
from farmd.verifier import canon as C
from farmd.verifier.calls import judge_calls

ENTRY_POINT = "transform"
NO_MODIFYING = "The function must not modify its argument"
RULES = (Rule("argument", NO_MODIFYING),)
"""What every task states beyond being right: held in the judge's box (each call's argument compared before and
after), where a breach fails the attempt flagged ``rule_broken``."""
HIDDEN_RANDOM = 20
MAX_SUBMISSION_BYTES = 200_000
POLICY = SandboxPolicy(wall_time_s=20, cpu_time_s=20, memory_mb=256, pids=32, disk_mb=16, tmp_mb=16,
                       output_kb=4096)
PER_CALL_S = 2.0

Kind = str  # "ints", "int", "str"


@dataclass(frozen=True)
class Op:
    name: str
    takes: Kind
    gives: Kind
    code: str
    """An expression of ``x``; ``{k}`` is the op's parameter."""
    words: str
    """What it does, in words; ``{k}`` as above."""
    param: Callable[[random.Random], Any] | None = None


def _k(lo: int, hi: int) -> Callable[[random.Random], int]:
    return lambda rng: rng.randint(lo, hi)


OPS: tuple[Op, ...] = (
    Op("sort", "ints", "ints", "sorted(x)", "sort the numbers in ascending order"),
    Op("sort_desc", "ints", "ints", "sorted(x, reverse=True)", "sort the numbers in descending order"),
    Op("reverse", "ints", "ints", "x[::-1]", "reverse the order of the numbers"),
    Op("even", "ints", "ints", "[v for v in x if v % 2 == 0]", "keep only the even numbers"),
    Op("odd", "ints", "ints", "[v for v in x if v % 2 != 0]", "keep only the odd numbers"),
    Op("square", "ints", "ints", "[v * v for v in x]", "square each number"),
    Op("add", "ints", "ints", "[v + {k} for v in x]", "add {k} to each number", _k(1, 9)),
    Op("mul", "ints", "ints", "[v * {k} for v in x]", "multiply each number by {k}", _k(2, 5)),
    Op("dedupe", "ints", "ints", "list(dict.fromkeys(x))",
       "remove repeated numbers, keeping the first occurrence of each"),
    Op("take", "ints", "ints", "x[:{k}]", "keep only the first {k} numbers (all of them if there are fewer)",
       _k(1, 5)),
    Op("drop", "ints", "ints", "x[{k}:]", "drop the first {k} numbers (all of them if there are fewer)",
       _k(1, 3)),
    Op("cumsum", "ints", "ints", "[sum(x[:i + 1]) for i in range(len(x))]",
       "replace each number with the sum of itself and every number before it"),
    Op("abs", "ints", "ints", "[abs(v) for v in x]", "replace each number with its absolute value"),
    Op("above", "ints", "ints", "[v for v in x if v > {k}]", "keep only the numbers greater than {k}",
       _k(-5, 5)),
    Op("diffs", "ints", "ints", "[b - a for a, b in zip(x, x[1:])]",
       "replace the list with the differences between consecutive numbers (each number minus the one "
       "before it); fewer than two numbers give an empty list"),
    Op("rotate", "ints", "ints", "(x[{k} % len(x):] + x[:{k} % len(x)]) if x else []",
       "rotate the list left by {k} positions (the first {k} move to the end, cyclically)", _k(1, 4)),
    Op("mod", "ints", "ints", "[v % {k} for v in x]",
       "replace each number with its remainder modulo {k} (never negative, as Python's % gives)", _k(2, 7)),
    Op("sum", "ints", "int", "sum(x)", "add up all the numbers (0 for none)"),
    Op("len", "ints", "int", "len(x)", "count how many numbers there are"),
    Op("max", "ints", "int", "(max(x) if x else 0)", "take the largest number (0 if there are none)"),
    Op("min", "ints", "int", "(min(x) if x else 0)", "take the smallest number (0 if there are none)"),
    Op("count", "ints", "int", "x.count({k})", "count how many times {k} appears", _k(0, 3)),
    Op("positives", "ints", "int", "sum(1 for v in x if v > 0)", "count the numbers greater than zero"),
    Op("join", "ints", "str", "','.join(str(v) for v in x)",
       "write the numbers as text, separated by commas without spaces"),
    Op("iadd", "int", "int", "x + {k}", "add {k}", _k(1, 20)),
    Op("imul", "int", "int", "x * {k}", "multiply by {k}", _k(2, 6)),
    Op("isquare", "int", "int", "x * x", "square it"),
    Op("digitsum", "int", "int", "sum(int(c) for c in str(abs(x)))", "take the sum of the decimal digits of its "
       "absolute value"),
    Op("imod", "int", "int", "x % {k}", "take its remainder modulo {k} (never negative)", _k(2, 9)),
    Op("iabs", "int", "int", "abs(x)", "take its absolute value"),
    Op("floordiv", "int", "int", "x // {k}", "divide by {k}, rounding down (towards negative infinity)",
       _k(2, 5)),
    Op("digits", "int", "ints", "[int(c) for c in str(abs(x))]",
       "list the decimal digits of its absolute value, most significant first"),
    Op("upto", "int", "ints", "list(range(min(abs(x), 30)))",
       "make the list 0, 1, ..., n-1, where n is its absolute value capped at 30"),
    Op("sreverse", "str", "str", "x[::-1]", "reverse the text"),
    Op("upper", "str", "str", "x.upper()", "convert it to upper case"),
    Op("lower", "str", "str", "x.lower()", "convert it to lower case"),
    Op("novowels", "str", "str", "''.join(c for c in x if c.lower() not in 'aeiou')",
       "remove every vowel (a, e, i, o, u, either case)"),
    Op("underscores", "str", "str", "x.replace(' ', '_')", "replace every space with an underscore"),
    Op("letters", "str", "str", "''.join(c for c in x if c.isalpha())", "keep only the letters"),
    Op("swapcase", "str", "str", "x.swapcase()", "swap the case of every letter"),
    Op("caesar", "str", "str",
       "''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else "
       "chr((ord(c) - 65 + {k}) % 26 + 65) if 'A' <= c <= 'Z' else c for c in x)",
       "shift every ASCII letter {k} places forward in the alphabet, wrapping around from z to a and "
       "keeping its case; other characters stay as they are", _k(1, 25)),
    Op("double", "str", "str", "''.join(c * 2 for c in x)", "write every character twice in a row"),
    Op("prefix", "str", "str", "x[:{k}]", "keep only the first {k} characters", _k(1, 6)),
    Op("sortchars", "str", "str", "''.join(sorted(x))", "sort its characters by their Unicode code points"),
    Op("slen", "str", "int", "len(x)", "count its characters"),
    Op("vowels", "str", "int", "sum(1 for c in x.lower() if c in 'aeiou')",
       "count its vowels (a, e, i, o, u, either case)"),
    Op("words", "str", "int", "len(x.split())", "count its words (runs of non-whitespace)"),
    Op("codes", "str", "ints", "[ord(c) for c in x]", "list the Unicode code point of each character"),
    Op("wordlens", "str", "ints", "[len(w) for w in x.split()]", "list the length of each word"),
)

_NOUN = {"ints": "a list of integers", "int": "an integer", "str": "a string"}
_WORDS = ("alpha", "Beta", "gamma", "delta", "Echo", "fox", "grape", "hotel", "India", "juliet", "kilo",
          "lima", "Mike", "november", "oscar", "papa", "quebec", "Romeo", "sierra", "tango", "umbrella",
          "Victor", "whiskey", "x-ray", "yankee", "zulu", "hello", "World", "farm", "seed")


@dataclass(frozen=True)
class Chain:
    start: Kind
    steps: tuple[tuple[Op, Any], ...]

    @property
    def result(self) -> Kind:
        return self.steps[-1][0].gives

    def source(self, entry_point: str = ENTRY_POINT) -> str:
        lines = [f"def {entry_point}(x):"]
        for op, k in self.steps:
            lines.append(f"    x = {op.code.format(k=k)}")
        lines.append("    return x")
        return "\n".join(lines) + "\n"

    def function(self) -> Callable[[Any], Any]:
        namespace: dict[str, Any] = {}
        exec(compile(self.source(), "<py-func reference>", "exec"), namespace)  # our own generated code
        fn: Callable[[Any], Any] = namespace[ENTRY_POINT]
        return fn


def make_chain(rng: random.Random, depth: int) -> Chain:
    start = rng.choice(("ints", "ints", "str", "int"))
    kind = start
    steps: list[tuple[Op, Any]] = []
    used: set[str] = set()
    for i in range(depth):
        # Favour staying in the same kind, so chains read naturally, but let deeper tasks cross kinds.
        choices = [op for op in OPS if op.takes == kind and op.name not in used]
        if i < depth - 1:
            same = [op for op in choices if op.gives == kind]
            if same and rng.random() < 0.7:
                choices = same
        op = rng.choice(choices)
        used.add(op.name)
        steps.append((op, op.param(rng) if op.param else None))
        kind = op.gives
    return Chain(start, tuple(steps))


def informative(chain: Chain, rng: random.Random, probes: int = 16) -> bool:
    """A task worth posing: its answer varies with the input and is not the input itself.

    A chain whose output is constant (count the 3s after keeping only evens) would reward
    a submission that returns that constant; one that gives back its input, an echo.
    """
    fn = chain.function()
    inputs = [random_input(chain.start, rng, 3) for _ in range(probes)] + edge_inputs(chain.start)
    outputs = [fn(copy.deepcopy(x)) for x in inputs]
    distinct = {repr(o) for o in outputs}
    echoes = sum(1 for x, o in zip(inputs, outputs, strict=True) if type(x) is type(o) and x == o)
    return len(distinct) >= max(3, probes // 4) and echoes < len(inputs) // 2


def random_input(kind: Kind, rng: random.Random, size: int) -> Any:
    if kind == "ints":
        return [rng.randint(-10 * size, 20 * size) for _ in range(rng.randint(0, 3 + size))]
    if kind == "int":
        return rng.randint(-(10 ** (1 + size)), 10 ** (1 + size))
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 2 + size // 2)))


def edge_inputs(kind: Kind) -> list[Any]:
    if kind == "ints":
        return [[], [0], [7], [-3, -3, -3], [5, -5, 0, 5, 2, 2, -1], list(range(40, -10, -3)), [10**6, -(10**6)]]
    if kind == "int":
        return [0, 1, -1, 9, -10, 10**9, -(10**9) - 7]
    return ["", "a", "A", " ", "Hello World", "a-b c! d?", "zzz ZZZ", "multiple   spaces here"]


class PyFunc(SourceEnvironment):
    name = "py-func"
    version = "1"
    verifier_version = "1"
    max_submission_bytes = MAX_SUBMISSION_BYTES
    judge_policy = POLICY
    max_difficulty = 5
    exploit_kind = "function"

    def _chain(self, seed: int, difficulty: int) -> Chain:
        rng = self.public_rng(seed, difficulty, "chain")
        for _ in range(100):
            chain = make_chain(rng, difficulty)
            if informative(chain, rng):
                return chain
        raise TaskError(f"{self.name}: no informative task for seed {seed}")

    def generate(self, seed: int, difficulty: int) -> Task:
        chain = self._chain(seed, difficulty)
        rng = self.public_rng(seed, difficulty, "examples")
        fn = chain.function()
        examples: list[dict[str, Any]] = []
        wanted = rng.choice((2, 3))
        while len(examples) < wanted:  # distinct, non-empty inputs: an example should show something
            arg = random_input(chain.start, rng, max(difficulty, 2))
            if arg in ([], "") or any(e["input"][0] == arg for e in examples):
                continue
            examples.append({"input": [arg], "output": fn(copy.deepcopy(arg))})
        steps = [op.words.format(k=k) for op, k in chain.steps]
        shown = "\n".join(f"    {ENTRY_POINT}({e['input'][0]!r}) == {e['output']!r}" for e in examples)
        prompt = (
            f"Write a Python function `{ENTRY_POINT}(x)` that takes {_NOUN[chain.start]} and returns "
            f"{_NOUN[chain.result]}, computed in these steps:\n{numbered(steps)}\n\n"
            f"{NO_MODIFYING}. Examples:\n{shown}\n\n"
            "Submit Python source code that defines the function."
        )
        return self.task(seed, difficulty, prompt, examples=examples, entry_point=ENTRY_POINT,
                         metadata={"input": chain.start, "output": chain.result})

    def reference(self, task: Task) -> Attempt:
        return Attempt(final=self._chain(task.seed, task.difficulty).source())

    def rules(self, task: Task) -> tuple[Rule, ...]:
        return RULES

    def families(self) -> tuple[str, ...]:
        return tuple(f"{kind} in" for kind in _NOUN)

    def family_of(self, seed: int, difficulty: int) -> str:
        """By what the function takes: an attack on its argument (modifying it, echoing it) differs by it."""
        return f"{self._chain(seed, difficulty).start} in"

    def hidden_inputs(self, task: Task, ctx: VerifyContext) -> list[Any]:
        chain = self._chain(task.seed, task.difficulty)
        rng = ctx.key.rng(self.name, self.version, task.seed, task.difficulty, "hidden")
        inputs = [random_input(chain.start, rng, task.difficulty + rng.randint(0, 3)) for _ in range(HIDDEN_RANDOM)]
        return [e["input"][0] for e in task.examples] + edge_inputs(chain.start) + inputs

    def prepare(self, task: Task, ctx: VerifyContext) -> JudgeRun:
        chain = self._chain(task.seed, task.difficulty)
        fn = chain.function()
        inputs = self.hidden_inputs(task, ctx)
        expected = [C.canon(fn(copy.deepcopy(arg))) for arg in inputs]
        spec = {
            "nonce": ctx.key.nonce(),
            "mode": "call",
            "entry_point": ENTRY_POINT,
            "per_call_s": PER_CALL_S,
            "tests": [{"id": i, "args": [arg]} for i, arg in enumerate(inputs)],
        }
        v = self.verifier_version
        return JudgeRun(spec, lambda report: judge_calls(v, report, expected))
