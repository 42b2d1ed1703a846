"""py-func: tasks, hidden tests, and a verifier that passes references and nothing wrong."""

from __future__ import annotations

import pytest

from farmd.envs import Attempt, TaskError, VerifyContext, get
from farmd.envs.pyfunc import HIDDEN_RANDOM, PyFunc
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.conftest import sweep_seeds
from tests.envs.recall import failures, verify_references

ENV = PyFunc()
KEY = VerifierKey(b"k" * 32)


def test_tasks_are_deterministic_and_public() -> None:
    a, b = ENV.generate(11, 3), ENV.generate(11, 3)
    assert a == b
    assert a.entry_point == "transform" and a.kind == "submission"
    assert 2 <= len(a.examples) <= 3 and all(set(e) == {"input", "output"} for e in a.examples)
    assert "transform(" in a.prompt and "must not modify its argument" in a.prompt
    assert ENV.generate(12, 3) != a


def test_difficulty_is_the_number_of_steps() -> None:
    for level in range(1, 6):
        source = ENV.reference(ENV.generate(5, level)).final
        assert source.count("    x = ") == level
    with pytest.raises(TaskError):
        ENV.generate(1, 0)
    with pytest.raises(TaskError):
        ENV.generate(1, 6)
    assert get("py-func").name == "py-func"


def test_hidden_tests_need_the_key() -> None:
    task = ENV.generate(3, 2)
    ctx_a = VerifyContext(sandbox=None, key=KEY)  # type: ignore[arg-type]
    ctx_b = VerifyContext(sandbox=None, key=VerifierKey(b"another key, another world"))  # type: ignore[arg-type]
    a, b = ENV.hidden_inputs(task, ctx_a), ENV.hidden_inputs(task, ctx_b)
    assert len(a) >= HIDDEN_RANDOM + len(task.examples)
    assert a == ENV.hidden_inputs(task, ctx_a)
    assert a != b  # the same public task, other hidden inputs
    public = [e["input"][0] for e in task.examples]
    assert a[: len(public)] == public


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_references_pass_for_many_seeds_of_every_level() -> None:
    results = await verify_references(ENV, sweep_seeds(200), range(1, 6))
    assert len(results) == len(sweep_seeds(200)) * 5
    assert failures(results) == []


BAD = {
    "empty": "",
    "syntax error": "def transform(x)\n    return x\n",
    "wrong answer": "def transform(x):\n    return 12345\n",
    "random output": "import random\ndef transform(x):\n    return random.randint(-99, 99)\n",
    "constant output": "def transform(x):\n    return [1, 2, 3]\n",
    "echoing the input": "def transform(x):\n    return x\n",
    "no function": "x = 1\n",
    "raises": "def transform(x):\n    raise ValueError('no')\n",
    "infinite loop": "def transform(x):\n    while True:\n        pass\n",
}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(BAD))
async def test_known_bad_attempts_fail(name: str) -> None:
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        for level in (1, 3, 5):
            task = ENV.generate(21, level)
            verdict = await ENV.verify(task, Attempt(final=BAD[name]), ctx)
            assert verdict.status == "ok" and not verdict.passed and verdict.reward == 0.0, (level, verdict)
            assert verdict.reasons


@pytest.mark.sandbox
async def test_mutating_the_argument_fails_even_with_the_right_value() -> None:
    task = next(t for t in (ENV.generate(s, 1) for s in range(200)) if "sorted(x)" in ENV.reference(t).final)
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        verdict = await ENV.verify(task, Attempt(final="def transform(x):\n    x.sort()\n    return x\n"), ctx)
    assert not verdict.passed and any("modified its argument" in r for r in verdict.reasons)


@pytest.mark.sandbox
async def test_a_broken_sandbox_is_an_error_not_a_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An infrastructure failure must never look like a failed attempt."""
    from farmd.sandbox import SandboxConfig

    task = ENV.generate(1, 1)
    sandbox = Sandbox(SandboxConfig(box_python=tmp_path / "missing-python"))
    verdict = await ENV.verify(task, ENV.reference(task), VerifyContext(sandbox=sandbox, key=KEY))
    assert verdict.status == "error" and not verdict.passed
