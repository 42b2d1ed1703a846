"""Mutation coverage, measured in real boxes: the mutants of a reference that give a different answer
are rejected by a sound verifier, and one that checks only part of the answer lets them through."""

from __future__ import annotations

import textwrap

import pytest

from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.mutants import coverage_findings, measure, mutants
from farmd.intake.package import Manifest, Package
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey

pytestmark = [pytest.mark.sandbox]

ADD = textwrap.dedent('''
    class Add:
        def generate(self, seed, difficulty, rng, hidden_rng):
            a, b = rng.randint(1, 10 ** difficulty), rng.randint(1, 10 ** difficulty)
            return {"prompt": f"What is {a} + {b}?", "public": {}, "hidden": {"a": a, "b": b}}

        def reference(self, task):
            a, b = task["hidden"]["a"], task["hidden"]["b"]
            if a > b:
                return str(b + a)
            return str(a + b)

        def verify(self, task, final):
            want = task["hidden"]["a"] + task["hidden"]["b"]
            ok = final.strip() == str(want)
            return {"reward": float(ok), "passed": ok, "reasons": []}
''')
PARITY = ADD.replace('ok = final.strip() == str(want)', 'ok = (int(final) - want) % 2 == 0')


def package(source: str) -> Package:
    manifest = Manifest(name="add-two", version="1", domain="math", author="t", levels=2, kind="answer",
                        entry_file="env.py", entry_class="Add",
                        bounds={"generate_s": 2.0, "verify_s": 2.0, "memory_mb": 256.0})
    return Package(manifest, {"env.py": source.encode()}, "test")


def test_mutants_change_one_thing_in_the_reference_or_the_generator_never_the_verifier() -> None:
    made = dict(mutants(ADD, "Add"))
    assert set(made) == {"line 9: Gt -> GtE", "line 9: the if-branch dropped", "line 10: Add -> Sub",
                         "line 11: Add -> Sub", "line 4: 1 -> 2", "line 4: 10 -> 11",
                         "line 5: hidden value 1 moved by one", "line 5: hidden value 2 moved by one"}
    verify = ADD[ADD.index("    def verify"):]
    assert all(verify.strip() in source or "def verify(self, task, final):" in source for source in made.values())
    assert all(source.count("task['hidden']['a'] + task['hidden']['b']") == 1 for source in made.values()), \
        "the verifier is never mutated"


async def test_a_sound_verifier_kills_every_differing_mutant_and_a_partial_one_does_not() -> None:
    key = VerifierKey(b"contributed-env-test-key-32bytes")
    keys = [(0, 1), (1, 1), (2, 2)]
    async with Sandbox() as sandbox:
        sound = await measure(BoxedEnvironment(package(ADD), sandbox, key), keys)
        partial = await measure(BoxedEnvironment(package(PARITY), sandbox, key), keys)
    assert sound.differing >= 2 and sound.share == 1.0 and coverage_findings(sound) == []
    assert partial.share is not None and partial.share < 1.0
    survivors = coverage_findings(partial)
    assert survivors and all(f.check == "check_mutants" and "Add -> Sub" in f.evidence for f in survivors)
