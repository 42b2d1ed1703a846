"""Tier 2 of a contributed environment, its verifier attacked in real boxes: the shipped example survives
every attack, and each kind of unsound verifier is caught by the attack that exposes it, with the attempt
that won as evidence."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from farmd.intake.attacker import Attacker, AttackerConfig
from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.exploits import for_kind
from farmd.intake.package import read_package
from farmd.intake.tier2 import ATTACKER, CANARY, EXPLOIT, run_tier2
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.agents.fake_endpoint import Reply, fake_endpoint
from tests.intake.contrib_example import EXAMPLE, WORD_COUNT, answer, written

pytestmark = [pytest.mark.sandbox]

KEY = VerifierKey(b"contributed-env-test-key-32bytes")
RIGHT = 'ok = final.strip() == str(task["hidden"]["count"])'

# The count recomputed from the prompt's own sentence: right on every real task, so no exploit and no
# wrong answer gets through, yet the hidden data is never consulted.
PROMPT_READER = WORD_COUNT.replace(RIGHT, (
    'sentence = task["prompt"].split(": ", 1)[1].rsplit("?", 1)[0].split()\n'
    '        ok = final.strip() == str(sentence.count(task["public"]["target"]))'))


def submission(tmp_path: Path, source: str = WORD_COUNT):  # type: ignore[no-untyped-def]
    return read_package(written(tmp_path / "wc", source))


async def test_the_shipped_example_passes_tier_2() -> None:
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(read_package(EXAMPLE), sandbox, KEY)
        report = await run_tier2(env, [(0, 1), (1, 3)], canaries=2)
    assert report.findings == [], [str(f) for f in report.findings]
    assert report.tried > 60 and report.rewarded == 0 and report.attacker_tokens == 0
    assert len(env.calls) > report.tried, "what tier 2 cost is counted"


async def test_a_verifier_that_takes_the_number_anywhere_is_caught_by_the_exploit_library(tmp_path: Path) -> None:
    assert RIGHT in WORD_COUNT
    lenient = WORD_COUNT.replace(RIGHT, 'ok = str(task["hidden"]["count"]) in final')
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(submission(tmp_path, lenient), sandbox, KEY)
        report = await run_tier2(env, [(2, 1)], canaries=0)
    caught = {f.evidence.split("'")[1]: f for f in report.blocking if f.check == EXPLOIT}
    assert {"hedge-or", "every-small-integer", "trailing-words"} <= set(caught), [str(f) for f in report.findings]
    hedge = caught["hedge-or"].evidence
    right = answer(2, 1)
    assert "(seed 2, level 1)" in hedge and "reward 1" in hedge
    assert json.dumps(f"<answer>{right} or {int(right) + 1}</answer>") in hedge, "the exact text submitted"
    assert report.rewarded >= len(caught) and all(f.fix for f in report.findings)


async def test_a_verifier_that_crashes_on_an_exploit_has_not_passed_it_a_note_says_so(tmp_path: Path) -> None:
    crashing = WORD_COUNT.replace(RIGHT, 'ok = int(final) == task["hidden"]["count"]')  # int("<answer>2") raises
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(submission(tmp_path, crashing), sandbox, KEY)
        # The <answer> forms only: int() also takes "+2" and full-width digits, which the bare forms catch.
        report = await run_tier2(env, [(2, 1)], canaries=0, probes_asked=(), exploits=for_kind("answer", slow=True))
    assert report.findings and report.blocking == [] and report.rewarded == 0
    assert all(f.check == EXPLOIT and "verify failed" in f.evidence and "ValueError" in f.evidence
               for f in report.findings), [str(f) for f in report.findings]


async def test_a_verifier_that_reads_the_prompt_instead_of_the_hidden_data_is_caught_by_a_canary(
        tmp_path: Path) -> None:
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(submission(tmp_path, PROMPT_READER), sandbox, KEY)
        report = await run_tier2(env, [(2, 1), (3, 2)], canaries=2)
    assert not [f for f in report.blocking if f.check == EXPLOIT], "on real tasks it judges right"
    canaries = [f for f in report.blocking if f.check == CANARY]
    assert canaries, [str(f) for f in report.findings]
    assert "the answer right for the prompt as shown" in canaries[0].evidence
    assert "hidden data of seed" in canaries[0].evidence and "reward 1" in canaries[0].evidence


async def test_the_llm_attacker_finds_a_backdoor_and_its_proposal_is_the_evidence(tmp_path: Path) -> None:
    assert RIGHT in WORD_COUNT
    backdoored = WORD_COUNT.replace(RIGHT, RIGHT + ' or "OVERRIDE" in final')
    right = answer(2, 1)
    canned = {"attempts": [{"final": "OVERRIDE", "why": "verify passes any text holding OVERRIDE"},
                           {"final": f" {right} ", "why": "the right answer (not an attack: never sent)"},
                           {"final": "zero", "why": "a plain wrong answer"}]}
    reply = f"Reading verify, I see a backdoor.\n```json\n{json.dumps(canned)}\n```\nGood luck."
    async with fake_endpoint(lambda request: Reply.text(reply, prompt_tokens=900, completion_tokens=40)) as ep, \
            Attacker(AttackerConfig(base_url=ep.url, model="attacker", max_attempts=1)) as attacker, \
            Sandbox() as sandbox:
        env = BoxedEnvironment(submission(tmp_path, backdoored), sandbox, KEY)
        report = await run_tier2(env, [(2, 1)], attacker=attacker, attack_budget=4, canaries=0, exploits=(), probes_asked=())
    shown = ep.requests[0]["messages"][-1]["content"]
    assert '"OVERRIDE" in final' in shown and "How many times" in shown, "it saw the verifier and the task"
    [found] = report.findings
    assert (found.check, found.blocking) == (ATTACKER, True)
    assert '"OVERRIDE"' in found.evidence and "verify passes any text holding OVERRIDE" in found.evidence
    assert (report.tried, report.rewarded, report.attacker_tokens) == (2, 1, 940)


async def test_an_attacker_that_is_down_is_a_note_never_a_verdict() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with Attacker(AttackerConfig(base_url=f"http://127.0.0.1:{port}/v1", model="attacker",
                                       max_attempts=1, request_timeout_s=5)) as attacker, Sandbox() as sandbox:
        env = BoxedEnvironment(read_package(EXAMPLE), sandbox, KEY)
        report = await run_tier2(env, [(0, 1)], attacker=attacker, canaries=0, exploits=(), probes_asked=())
    [note] = report.findings
    assert (note.check, note.blocking) == (ATTACKER, False)
    assert "could not run" in note.evidence and "cannot connect" in note.evidence
    assert report.blocking == [] and report.rewarded == 0


async def test_bare_answers_declared_as_answer_blocks_meet_the_exploits_for_bare_answers(tmp_path: Path) -> None:
    """word-count declares kind "answer" but its answers are bare numbers: the library's <answer> forms would
    all fail its verifier for their tags, so tier 2 sends the bare hedges and echoes too. A verifier that takes
    any text starting with the count ("3,4", "3 or 4") is caught; the shipped one is not."""
    lenient = WORD_COUNT.replace(RIGHT, 'ok = final.strip().startswith(str(task["hidden"]["count"]))')
    async with Sandbox() as sandbox:
        env = BoxedEnvironment(submission(tmp_path, lenient), sandbox, KEY)
        report = await run_tier2(env, [(2, 1)], canaries=0, probes_asked=())
        honest = await run_tier2(BoxedEnvironment(read_package(EXAMPLE), sandbox, KEY), [(2, 1)], canaries=0,
                                 probes_asked=())
    caught = {f.evidence.split("'")[1] for f in report.blocking if f.check == EXPLOIT}
    assert {"bare:hedge-or", "bare:hedge-comma"} <= caught, [str(f) for f in report.findings]
    assert not [name for name in caught if name.startswith("bare:") and name[5:] not in ("hedge-or", "hedge-comma",
                                                                                          "hedge-lines")]
    assert honest.blocking == [] and honest.tried > report.tried // 2
