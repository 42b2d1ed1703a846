"""Tier 1 of a contributed environment, its code run in real boxes: the example passes with no finding,
and each kind of broken environment is caught by the check that names its fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.contributed_checks import run_tier1
from farmd.intake.package import read_package
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.intake.contrib_example import EXAMPLE, WORD_COUNT, written

pytestmark = [pytest.mark.sandbox]

KEY = VerifierKey(b"contributed-env-test-key-32bytes")


def submission(tmp_path: Path, source: str = WORD_COUNT):  # type: ignore[no-untyped-def]
    return read_package(written(tmp_path / "wc", source))


async def test_the_shipped_example_passes_tier_1() -> None:
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(read_package(EXAMPLE), sandbox, KEY)
        assert await run_tier1(env, seeds=(0, 1, 2)) == []
        assert sum(c.cpu_s for c in env.calls) > 0, "what tier 1 cost is counted"


BROKEN = {
    "an always-true verifier": (
        ('ok = final.strip() == str(task["hidden"]["count"])', "ok = True"), ["check_rejects_wrong", "check_examples"]),
    "a generator that repeats one task": (
        ("words = [rng.choice(WORDS) for _ in range(4 + 4 * difficulty)]", "words = WORDS[:4] * difficulty"),
        ["check_seeds_distinct"]),
    "a reference that fails": (('return str(task["hidden"]["count"])', 'return "0"'), ["check_reference_passes"]),
    "a generator that is not deterministic": (
        ("words = [rng.choice(WORDS)", "import random as r\n        words = [r.choice(WORDS)"), ["check_generates"]),
    "an answer in the public task": (
        ('"public": {"target": target}', '"public": {"target": target, "expected": words.count(target)}'),
        ["check_reference_passes"]),
    "a verifier that gives credit for hedging": (
        ('ok = final.strip() == str(task["hidden"]["count"])', 'ok = str(task["hidden"]["count"]) in final'),
        ["check_rejects_wrong"]),
}


@pytest.mark.parametrize("name", list(BROKEN))
async def test_each_broken_environment_is_caught_by_its_check(tmp_path: Path, name: str) -> None:
    (old, new), checks = BROKEN[name]
    assert old in WORD_COUNT
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(submission(tmp_path, WORD_COUNT.replace(old, new)), sandbox, KEY)
        findings = await run_tier1(env, seeds=(0, 1))
    named = {f.check for f in findings}
    assert findings, f"{name} passed tier 1"
    assert set(checks) <= named, findings
    assert all(f.evidence and f.fix for f in findings)
