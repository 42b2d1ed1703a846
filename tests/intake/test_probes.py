"""Tier 2's classes beyond the exploit library (``farmd.intake.probes``): each defect class caught as a class,
on instances in real boxes (``defects.py``: one realistic defect each), while the honest examples and the
honest controls of each class pass the same probe. The pure parts (what counts as a leak, a near-constant
family, a costly verdict) are tested on their own first, with instances of each transform."""

from __future__ import annotations

import base64
import codecs
import random
from collections.abc import Collection

import pytest

from farmd.intake.boxed import BoxedEnvironment, Call, ContributedTask
from farmd.intake.package import Package, read_package
from farmd.intake.probes import (
    CONSTANT,
    COST,
    FORGED,
    LEAK,
    UNDERIVABLE,
    Known,
    find_leaks,
    near_constant,
    systematic,
    verdict_cost,
)
from farmd.intake.tier2 import Tier2Report, run_tier2
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.intake import defects
from tests.intake.contrib_example import EXAMPLE

KEY = VerifierKey(b"probes-test-key-probes-test-key!")
RUNNING_MAX = EXAMPLE.parent / "running-max"


def task(prompt: str, **public: object) -> ContributedTask:
    return ContributedTask(prompt, dict(public))


def transforms(prompt: str, answer: str, **public: object) -> set[str]:
    return {leak.transform for leak in find_leaks(task(prompt, **public), answer)}


# -- the pure parts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shown", "transform"), [
    ("APPLE_RIVER_STONE", "case and separators"),
    ("Apple-River-Stone", "case and separators"),
    ("applerivers tone", "case and separators"),
    ("enots revir elppa", "reversed"),
    ("stone apple river", "reordered"),
    (base64.b64encode(b"apple river stone").decode(), "base64"),
    (base64.b32encode(b"apple river stone").decode(), "base32"),
    (b"apple river stone".hex(), "hex"),
    (codecs.encode("apple river stone", "rot13"), "rot13"),
    ("apple%20river%20stone", "URL-encoded"),
])
def test_the_answer_is_found_under_each_transform_in_a_public_field_and_in_the_prompt(shown: str,
                                                                                      transform: str) -> None:
    assert transform in transforms("Sort: stone, river, apple.", "<answer>apple river stone</answer>", hint=shown)
    assert transform in transforms(f"Sort the words. (debug: {shown})", "apple river stone")


def test_what_is_not_a_leak_is_not_found() -> None:
    # A number is left to the exact check: "-3" and "3.0" normalise to what a prompt holds by chance.
    assert transforms("Values go up to 3.0 and 33.", "-3", values=[3, 33, "3"]) == set()
    assert transforms("How many times does 'apple' occur?", "2", target="apple") == set()
    # An answer of the right length nowhere in the task, in any form.
    assert transforms("Sort: stone, river, apple.", "apple river stone", count=3) == {"reordered"}


def test_a_leak_counts_when_the_family_shows_it_not_when_one_task_does_by_chance() -> None:
    answer = "apple river stone"
    leaky = {(s, 1): find_leaks(task("Sort them.", key=answer.upper()), answer) for s in range(4)}
    assert systematic(leaky) == {("case and separators", "public.key")}
    # A sort task whose input happened to be sorted already shows its answer: once in a while, not always.
    by_chance = {(s, 1): find_leaks(task(f"Sort: {'apple, river, stone' if s == 0 else 'stone, apple, river'}."),
                                    answer) for s in range(8)}
    assert by_chance[(0, 1)] and ("case and separators", "prompt") not in systematic(by_chance)


def known(answers: list[str]) -> list[Known]:
    return [Known(seed, 1, task(f"task {seed}"), a) for seed, a in enumerate(answers)]


def test_a_family_of_nearly_one_answer_is_near_constant_a_spread_one_is_not() -> None:
    found = near_constant(known(["no"] * 15 + ["yes"]), "answer")
    assert found is not None and found.check == CONSTANT and "15 of 16" in found.evidence
    # word-count's most common answer, "2", answers about a third: never near-constant.
    spread = random.Random(3).choices(["1", "2", "3", "4"], weights=[35, 38, 20, 7], k=16)
    assert near_constant(known(spread), "answer") is None
    assert near_constant(known(["no"] * 11), "answer") is None, "too few tasks to say"
    assert near_constant(known(["def f(x): return x"] * 16), "function") is None, "one function answers them all"


def test_a_verdict_over_the_farms_budget_is_a_finding_whatever_the_manifest_declared() -> None:
    cheap = [Call("verify", 0.2, 0.03)] * 8 + [Call("generate", 5.0, 4.0)]
    assert verdict_cost(cheap, cpu_budget_s=1.0, wall_budget_s=10.0) is None
    burning = [Call("verify", 1.7, 1.6)] * 6 + [Call("verify", 0.2, 0.03)] * 2
    found = verdict_cost(burning, cpu_budget_s=1.0, wall_budget_s=10.0)
    assert found is not None and found.check == COST and "1.60 CPU seconds" in found.evidence
    sleeping = [Call("verify", 12.0, 0.02)] * 4
    assert verdict_cost(sleeping, cpu_budget_s=1.0, wall_budget_s=10.0) is not None


# -- in boxes: each class caught, the controls pass -------------------------------------------------------------


async def probed(sandbox: Sandbox, package: Package, probes: Collection[str], tasks: int = 5) -> Tier2Report:
    """Only ``probes`` (no exploit library, no impossible-task canaries), over ``tasks`` tasks spread over the
    levels: what the probe's class costs, and nothing else catches."""
    rng = random.Random(11)
    levels = package.manifest.levels
    keys = [(rng.randrange(1 << 31), 1 + i % levels) for i in range(tasks)]
    env = BoxedEnvironment(package, sandbox, KEY)
    return await run_tier2(env, keys[:1], sample=keys[1:], exploits=(), canaries=0, probes_asked=probes)


def blocking(report: Tier2Report, check: str) -> list[str]:
    return [f.evidence for f in report.blocking if f.check == check]


@pytest.mark.sandbox
async def test_a_verdict_read_from_what_a_child_prints_is_forged_from_the_verifiers_own_runs() -> None:
    async with Sandbox() as sandbox:
        caught = await probed(sandbox, defects.verdict_line(), {"forged"}, tasks=3)
        honest = await probed(sandbox, read_package(RUNNING_MAX), {"forged"}, tasks=3)
        evaluated = await probed(sandbox, defects.package("expression", defects.EXPRESSION), {"forged"}, tasks=3)
    found = blocking(caught, FORGED)
    assert found and "prints another task's run" in found[0] and "@@ verdict: accepted" in found[0], caught.findings
    assert honest.blocking == [] and honest.tried >= 2, "the honest code task met the same forgeries"
    # An answer task whose verifier evaluates the answer in a child and reads what it printed.
    found = blocking(evaluated, FORGED)
    assert found and "as an expression" in found[0] and "== verdict: right" in found[0], evaluated.findings


@pytest.mark.sandbox
async def test_an_answer_leaked_in_any_transformed_form_is_caught_and_a_sort_tasks_input_is_not() -> None:
    leaks = {
        "case and separators": defects.word_sort("leak-upper", 'public["key"] = answer.upper().replace(" ", "_")'),
        "reversed": defects.word_sort("leak-reversed", 'public["check"] = answer[::-1]'),
        "base64": defects.word_sort("leak-base64",
                                    'import base64; public["blob"] = base64.b64encode(answer.encode()).decode()'),
        "reordered": defects.word_sort("leak-order", 'public["words"] = " ".join(sorted(words, reverse=True))',
                                       defects.AS_SET),
    }
    async with Sandbox() as sandbox:
        for transform, package in leaks.items():
            report = await probed(sandbox, package, {"leaks"})
            found = blocking(report, LEAK)
            assert found and transform in found[0], (transform, report.findings)
        honest = await probed(sandbox, defects.word_sort("sort-honest"), {"leaks"})
    assert honest.blocking == [], "the prompt lists the words unsorted (a reordering of the answer): by design"


@pytest.mark.sandbox
async def test_constant_answers_are_caught_the_verifiers_and_the_familys() -> None:
    async with Sandbox() as sandbox:
        accepts = await probed(sandbox, defects.word_count("none-alias", defects.NONE_ALIAS), {"constants"}, 4)
        rarely = await probed(sandbox, defects.package("rarely", defects.RARELY, good="no", bad="yes"),
                              {"constants"}, 12)
        honest = await probed(sandbox, read_package(EXAMPLE), {"constants"}, 12)
    found = blocking(accepts, CONSTANT)
    assert any("'none'" in f for f in found) and any("'0'" in f for f in found), accepts.findings
    near = blocking(rarely, CONSTANT)
    assert near and "'no' is the answer to" in near[0], rarely.findings
    assert honest.blocking == [] and honest.tried >= 9, "word-count met the same constants and refused them"


@pytest.mark.sandbox
async def test_an_answer_the_prompt_does_not_decide_is_caught_and_a_hidden_check_the_prompt_decides_is_not() -> None:
    async with Sandbox() as sandbox:
        hidden = await probed(sandbox, defects.guess("guess-hidden", hidden=True), {"underivable"}, 3)
        public = await probed(sandbox, defects.guess("guess-public", hidden=False), {"underivable"}, 3)
        honest = await probed(sandbox, read_package(EXAMPLE), {"underivable"}, 3)
        code = await probed(sandbox, read_package(RUNNING_MAX), {"underivable"}, 3)
    assert any("other hidden random choices" in f for f in blocking(hidden, UNDERIVABLE)), hidden.findings
    assert any("other random choices of its own" in f for f in blocking(public, UNDERIVABLE)), public.findings
    # running-max draws its hidden cases from the hidden generator: another draw, the same answer (a function).
    assert honest.blocking == [] and code.blocking == []


@pytest.mark.sandbox
async def test_what_a_verdict_costs_is_measured_in_its_box_not_taken_from_the_manifest() -> None:
    async with Sandbox() as sandbox:
        burner = BoxedEnvironment(defects.word_count("burner", defects.BURN), sandbox, KEY)
        honest = BoxedEnvironment(read_package(EXAMPLE), sandbox, KEY)
        for env in (burner, honest):
            for seed in (5, 6, 7):
                verdict = await env.verify(seed, 1, "3")
                assert verdict.cpu_s > 0 and verdict.wall_s >= verdict.cpu_s * 0.5
    found = verdict_cost(burner.calls, cpu_budget_s=0.3, wall_budget_s=10.0)
    assert found is not None and found.check == COST, [c.cpu_s for c in burner.calls]
    assert verdict_cost(honest.calls, cpu_budget_s=0.3, wall_budget_s=10.0) is None, [c.cpu_s for c in honest.calls]
