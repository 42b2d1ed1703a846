"""A contributed environment's generator, reference and verifier run in real boxes: they work when the
environment is honest, and when it is not they cannot reach the farm's key or files, cannot run past
their bounds, and cannot make a failure read as a pass."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from farmd.errors import CheckBudgetSpent, ContributedError
from farmd.intake.boxed import BoxedEnvironment, Variant
from farmd.intake.package import MANIFEST, read_package
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.intake.contrib_example import MANIFEST_TEXT, WORD_COUNT

pytestmark = [pytest.mark.sandbox]

KEY = VerifierKey(b"contributed-env-test-key-32bytes")


def package(tmp_path: Path, source: str, name: str = "wc"):  # type: ignore[no-untyped-def]
    root = tmp_path / name
    for rel, data in {MANIFEST: MANIFEST_TEXT, "env.py": source, "examples/good/1.json": "{}",
                      "examples/bad/1.json": "{}"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(data)
    return read_package(root)


def hostile(verify_body: str) -> str:
    """The word-count environment with a verify that does something else first."""
    changed = WORD_COUNT.replace("    def verify(self, task, final):\n",
                                 "    def verify(self, task, final):\n" + textwrap.indent(verify_body, " " * 8))
    assert changed != WORD_COUNT
    return changed


async def test_an_honest_environment_generates_references_and_verifies_in_boxes(tmp_path: Path) -> None:
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(package(tmp_path, WORD_COUNT), sandbox, KEY)
        task = await env.generate(7, 2)
        assert task.prompt.startswith("How many times") and "count" not in task.public, "hidden stays hidden"
        assert (await env.generate(7, 2)) == task, "the same seed, the same task"
        assert (await env.generate(8, 2)) != task
        answer = await env.reference(7, 2)
        right = await env.verify(7, 2, answer)
        wrong = await env.verify(7, 2, str(int(answer) + 1))
        assert (right.passed, right.reward, wrong.passed, wrong.reward) == (True, 1.0, False, 0.0)
        assert len(env.calls) == 6 and all(c.wall_s > 0 for c in env.calls)
        other = BoxedEnvironment(package(tmp_path, WORD_COUNT.replace("4 + 4", "4 + 4 "), "wc2"), sandbox,
                                 VerifierKey(b"another-farm-another-key-32bytes"))
        assert other.task_seed(7, 2) != env.task_seed(7, 2), "seeds come from the farm's key"


@pytest.mark.parametrize(("body", "evidence"), [
    ("open('/var/lib/farm/verifier.key').read()\n", "FileNotFoundError"),
    ("import os; os.listdir(DATA)\n", "FileNotFoundError"),
    ("open('/etc/farm-planted', 'w').write('x')\n", "Error"),
    ("while True: pass\n", "bound"),
    ("print('FARM 0 {\"ok\": true, \"value\": {\"reward\": 1, \"passed\": true}}')\n" + "raise SystemExit(0)\n",
     "SystemExit"),
    ("return {'reward': 1.0, 'passed': 'yes'}\n", "passed must be true or false"),
    ("return {'reward': float('nan'), 'passed': True}\n", "reward must be a number"),
    ("import os; os._exit(0)\n", "0 result lines"),
])
async def test_a_hostile_verifier_is_an_error_never_a_pass(tmp_path: Path, body: str, evidence: str) -> None:
    data = tmp_path / "farm-data"
    data.mkdir()
    (data / "verifier.key").write_bytes(b"the farm's key")
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(package(tmp_path, hostile(body.replace("DATA", repr(str(data))))), sandbox, KEY)
        with pytest.raises(ContributedError) as failed:
            await env.verify(1, 1, "3")
    assert evidence in failed.value.evidence, failed.value.evidence
    assert not await asyncio.to_thread(Path("/etc/farm-planted").exists)


@pytest.mark.parametrize(("public", "evidence"), [
    ("{'target': target, 'deep': DEEP}", "public is nested more than 16 deep (at public.deep.a"),
    ("{'target': target, 'n': 10 ** 30}", "public.n is an integer past int64"),
    ("{'target': target, 'x': float('nan')}", "public.x is nan"),
    ("{'target': target, 'examples': [{'input': [float('inf')]}]}", "public.examples[0].input[0] is inf"),
])
async def test_a_public_task_out_of_its_domain_is_the_environment_s_fault(tmp_path: Path, public: str,
                                                                         evidence: str) -> None:
    """What the generator makes public is posed with every attempt and stored in every trajectory: a number or a
    nesting no reader can take is refused where it is made, as the environment's failure."""
    deep = "{'a': " * 150 + "1" + "}" * 150
    source = WORD_COUNT.replace('"public": {"target": target}', '"public": ' + public.replace("DEEP", deep))
    assert source != WORD_COUNT
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(package(tmp_path, source), sandbox, KEY)
        with pytest.raises(ContributedError) as failed:
            await env.generate(7, 2)
    assert failed.value.op == "generate" and evidence in failed.value.evidence, failed.value.evidence


async def test_a_submissions_checks_stop_once_they_have_spent_their_box_seconds(tmp_path: Path) -> None:
    """However slow its own code (here a generator that sleeps well within its declared bound), one
    submission's checks take at most the box seconds the farm gives them: a call past them is refused, never
    started, and it is the environment's cost (CheckBudgetSpent), not a failure of the farm's."""
    slow = WORD_COUNT.replace("        words = [rng.choice(WORDS)", "        import time\n        time.sleep(0.8)\n"
                              "        words = [rng.choice(WORDS)")
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(package(tmp_path, slow), sandbox, KEY, budget_s=2.0)
        with pytest.raises(CheckBudgetSpent) as refused:
            for seed in range(10):
                await env.generate(seed, 1)
    assert 2 <= len(env.calls) <= 3 and env.spent_s >= 2.0, [c.wall_s for c in env.calls]
    assert "box seconds" in refused.value.evidence and not isinstance(refused.value, ContributedError)


async def test_a_verifier_can_be_traced_and_asked_about_other_random_choices(tmp_path: Path) -> None:
    """tier 2's questions: what the verifier's children printed while it judged (what it parses), and the
    same task with another per-task seed (other hidden choices) or another public stream."""
    traced = WORD_COUNT.replace("        ok = final.strip()", "        import subprocess, sys\n"
                                "        subprocess.run([sys.executable, '-c', 'print(\"VERDICT ok\")'], "
                                "capture_output=True)\n        ok = final.strip()")
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(package(tmp_path, traced), sandbox, KEY)
        task, answer = await env.solve(7, 2)
        assert task == await env.generate(7, 2) and answer == await env.reference(7, 2), "solve is both in one box"
        verdict = await env.verify(7, 2, answer, trace=True)
        assert verdict.passed and verdict.trace == ("VERDICT ok\n",)
        assert (await env.verify(7, 2, answer)).trace == (), "traced only when asked"
        # word-count draws nothing from its hidden generator: another per-task seed, the same task and answer.
        assert await env.solve(7, 2, variant=Variant(hidden=1)) == (task, answer)
        other, _ = await env.solve(7, 2, variant=Variant(rng_salt="x"))
        assert other != task, "another public stream, other choices"
