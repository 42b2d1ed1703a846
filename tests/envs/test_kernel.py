"""kernel: fast NumPy functions, checked on fresh hidden inputs, rewarded for speed."""

from __future__ import annotations

import pytest

from farmd.envs import Attempt, VerifyContext
from farmd.envs.kernel import OPS, SPEED_AT_PARITY, Kernel, static_problem
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from farmd.verifier.verdict import SUSPECTED_HACK
from tests.conftest import sweep_seeds
from tests.envs.recall import failures, verify_references

ENV = Kernel()
KEY = VerifierKey(b"k" * 32)


def test_tasks_are_deterministic_and_graded() -> None:
    assert ENV.generate(4, 2) == ENV.generate(4, 2)
    for level in range(1, 6):
        task = ENV.generate(4, level)
        assert task.metadata["op"] in {op.name for op in OPS if op.level == level}
        assert "kernel(" in task.prompt and "shape" in task.prompt
    assert {op.level for op in OPS} == {1, 2, 3, 4, 5}


def test_static_check() -> None:
    assert static_problem("import numpy as np\nimport math\ndef kernel(x):\n    return x\n") is None
    for bad in ("import os", "from reference import kernel", "import time", "__import__('os')",
                "x = np.__dict__", "open('/box/x')", "def kernel(x):\n    return globals()"):
        assert static_problem(bad) is not None, bad
    assert "reference" in (static_problem("import reference") or "")


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_references_pass_for_many_seeds_of_every_level() -> None:
    # 60 in a full sweep, not 200 as for the other environments: a kernel verification now times twelve paired rounds
    # of ~1 MB inputs (a stable speed reward), and 300 of them still draw every op of every level many
    # times, each on its own hidden inputs.
    results = await verify_references(ENV, sweep_seeds(60), range(1, 6), concurrency=3)
    assert len(results) == len(sweep_seeds(60)) * 5
    assert failures(results) == []
    for _, _, verdict in results:
        assert 0.05 <= verdict.reward <= 1.0 and verdict.details["speedup"] > 0
        low, high = verdict.details["reward_interval"]  # what another box's timing may give and still agree
        assert 0.05 <= low <= verdict.reward <= high <= 1.0


BAD = {
    "empty": "",
    "syntax error": "def kernel(x)\n    return x\n",
    "wrong answer": "import numpy as np\ndef kernel(*a):\n    return np.ones_like(a[0])\n",
    "random output": "import numpy as np\ndef kernel(*a):\n    return np.random.standard_normal(a[0].shape).astype(a[0].dtype)\n",
    "echoing the input": "def kernel(*a):\n    return a[0]\n",
    "a list, not an array": "def kernel(*a):\n    return a[0].tolist()\n",
}


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(BAD))
async def test_known_bad_attempts_fail(name: str) -> None:
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        for level in (2, 5):
            task = ENV.generate(9, level)
            verdict = await ENV.verify(task, Attempt(final=BAD[name]), ctx)
            assert verdict.status == "ok" and not verdict.passed and verdict.reward == 0.0, (level, verdict)


@pytest.mark.clocked
@pytest.mark.sandbox
async def test_speed_is_rewarded_and_slowness_is_not() -> None:
    """A correct but much slower kernel earns less than the reference; both earn more than a wrong one."""
    task = ENV.generate(0, 2)
    slow = ENV.reference(task).final + (
        "\n_fast = kernel\n\ndef kernel(x):\n    out = _fast(x)\n"
        "    for _ in range(40):\n        out = _fast(x)\n    return out\n"
    )
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        ref = await ENV.verify(task, ENV.reference(task), ctx)
        slower = await ENV.verify(task, Attempt(final=slow), ctx)
    assert ref.passed and slower.passed
    assert slower.details["speedup"] < 0.2 < ref.details["speedup"]
    assert slower.reward < SPEED_AT_PARITY * 0.5 < ref.reward


@pytest.mark.sandbox
async def test_reaching_for_the_reference_gets_nothing() -> None:
    task = ENV.generate(1, 3)
    attempt = Attempt(final="from reference import kernel\n")
    async with Sandbox() as sandbox:
        verdict = await ENV.verify(task, attempt, VerifyContext(sandbox=sandbox, key=KEY))
    assert verdict.reward == 0.0 and SUSPECTED_HACK in verdict.flags


RULE_BREAKERS = ("os-via-np-testing", "threading-via-np-testing", "ctypes-via-np-ctypeslib", "ctypeslib-load-library",
                 "computed-getattr-dunder", "read-file-via-numpy", "forged-shape")


@pytest.mark.sandbox
async def test_breaking_the_rules_is_a_flagged_zero_and_modifying_an_argument_a_zero() -> None:
    from farmd.intake.exploits import for_kind

    exploits = {e.name: e.make for e in for_kind("kernel")}
    task = ENV.generate(3, 1)
    async with Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=KEY)
        for name in RULE_BREAKERS:
            verdict = await ENV.verify(task, exploits[name](task), ctx)
            assert verdict.status == "ok" and verdict.reward == 0.0, (name, verdict)
            assert SUSPECTED_HACK in verdict.flags, (name, verdict)
        for name in ("in-place-cumsum", "in-place-scaled-relu"):
            for seed in (0, 1, 4):  # scaled_relu, row_cumsum, scaled_relu: each exploit's own op, and the other
                task = ENV.generate(seed, 1)
                verdict = await ENV.verify(task, exploits[name](task), ctx)
                assert verdict.status == "ok" and verdict.reward == 0.0, (name, seed, verdict)
                assert any("modified its argument" in r for r in verdict.reasons), (name, seed, verdict)
