"""What every source environment (py-func, kernel) shares through ``SourceEnvironment.verify``: a wrong
attempt never escapes its 0 through the reading of its source, and text is judged as repaired."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from farmd.envs import Attempt, VerifyContext, verify_safely
from farmd.envs.base import SourceEnvironment
from farmd.envs.kernel import Kernel
from farmd.envs.pyfunc import PyFunc
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from farmd.verifier.verdict import INVALID_TEXT, UNPARSEABLE

pytestmark = pytest.mark.sandbox

KEY = VerifierKey(b"k" * 32)

HOSTILE_SUFFIXES = {
    "a sum of 5000 terms (RecursionError)": "_ = " + "1+" * 5000 + "1\n",
    "60000 unary minuses (MemoryError)": "_ = " + "-" * 60000 + "1\n",
    "an attribute chain": "_ = x" + ".a" * 20000 + "\n",
    "nesting past the parser's limit": "_ = " + "[" * 300 + "]" * 300 + "\n",
}
LONG_BUT_VALID = "_ = (" + "1, " * 20000 + ")\n_ = " + "(" * 150 + "1" + ")" * 150 + "\n"


@dataclass(frozen=True)
class Case:
    env: SourceEnvironment
    unparseable_task: tuple[int, int]
    wrong: str
    valid_extra: str
    """Past ``LONG_BUT_VALID``, what else must compile in the box (the kernel's rules refuse comparisons)."""
    surrogate_task: tuple[int, int]
    wrong_with_surrogate: str
    right_suffix: str


CASES = {
    "py-func": Case(PyFunc(), (21, 3), "def transform(x):\n    return 12345\n", "_ = 1" + " < 1" * 5000 + "\n",
                    (21, 2), "def transform(x):\n    return '\ud800'\n", "# \udfff \ud800\n"),
    "kernel": Case(Kernel(), (9, 2), "import numpy as np\ndef kernel(*a):\n    return np.ones_like(a[0])\n", "",
                   (9, 1), "import numpy as np\ndef kernel(*a):\n    return np.ones_like(a[0])\n_ = '\ud800'\n",
                   "# \udfff\n"),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_source_that_cannot_be_compiled_is_a_flagged_zero_never_an_error(name: str) -> None:
    case = CASES[name]
    task = case.env.generate(*case.unparseable_task)
    right = case.env.reference(task).final
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        for suffix_name, suffix in HOSTILE_SUFFIXES.items():
            for source in (case.wrong, right):  # CPython cannot compile these at all: nothing with them passes
                verdict = await case.env.verify(task, Attempt(final=source + suffix), ctx)
                assert verdict.status == "ok" and verdict.reward == 0.0 and not verdict.passed, (suffix_name, verdict)
                assert UNPARSEABLE in verdict.flags and "does not compile" in verdict.reasons[0], (suffix_name, verdict)
        # Long but valid: compiled in the box, and the reference still passes with it.
        verdict = await case.env.verify(task, Attempt(final=right + LONG_BUT_VALID + case.valid_extra), ctx)
        assert verdict.passed and verdict.flags == [], verdict


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_lone_surrogate_is_judged_as_repaired_and_flagged(name: str) -> None:
    case = CASES[name]
    task = case.env.generate(*case.surrogate_task)
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        wrong = await verify_safely(case.env, task, Attempt(final=case.wrong_with_surrogate), ctx)
        right = await verify_safely(case.env, task, Attempt(final=case.env.reference(task).final + case.right_suffix),
                                    ctx)
    assert wrong.status == "ok" and wrong.reward == 0.0 and INVALID_TEXT in wrong.flags
    assert right.passed and right.flags == [INVALID_TEXT]
    for verdict in (wrong, right):  # what is stored of a verdict encodes
        json.dumps(verdict.to_json(), ensure_ascii=False).encode("utf-8")
