"""Tier 1 of a contributed environment, its code run in real boxes: the example passes with no finding.
(Each kind of broken environment is caught by the check that names its fault through the funnel, in
test_funnel.py, which runs tier 1 in its stages.)"""

from __future__ import annotations

import pytest

from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.contributed_checks import run_tier1
from farmd.intake.package import read_package
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.intake.contrib_example import EXAMPLE

pytestmark = [pytest.mark.sandbox]

KEY = VerifierKey(b"contributed-env-test-key-32bytes")


async def test_the_shipped_example_passes_tier_1() -> None:
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(read_package(EXAMPLE), sandbox, KEY)
        assert await run_tier1(env, seeds=(0, 1, 2)) == []
        assert sum(c.cpu_s for c in env.calls) > 0, "what tier 1 cost is counted"
