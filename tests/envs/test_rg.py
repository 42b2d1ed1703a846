"""rg:<dataset>: reasoning-gym tasks, a strict host-side verifier, and the answer exploit library."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farmd.envs import Attempt, Task, TaskError, VerifyContext, get, names, rg, verify_safely
from farmd.envs.rg import DATASETS, ReasoningGym
from farmd.intake.exploits import for_kind
from farmd.intake.exploits.answer import CODE_MARKER
from farmd.sandbox import Sandbox
from farmd.verifier import Verdict, VerifierKey
from farmd.verifier.answer import extract_single_answer
from farmd.verifier.verdict import NO_ANSWER, SUSPECTED_HACK, VERIFIER_FAULT
from tests.conftest import FULL_SWEEP, farmctl, sweep_seeds

ALL = sorted(DATASETS)
LEVELS = range(1, 6)
# Nothing here runs in a box: answer tasks are judged on the host, so the sandbox is never started.
CTX = VerifyContext(sandbox=Sandbox(), key=VerifierKey(b"rg-test-key" * 3))


def env(dataset: str) -> ReasoningGym:
    e = get(f"rg:{dataset}")
    assert isinstance(e, ReasoningGym)
    return e


def oracle(task: Task) -> str:
    answer, problem = extract_single_answer(get(task.env).reference(task).final)
    assert answer and problem is None
    return answer


def wrong(task: Task) -> str:
    right = oracle(task)
    kind = DATASETS[task.env[3:]].answer
    if kind == "number":
        return str(int(right) + 1)
    if kind == "word":
        return "zed"
    return f"{right} + 1"


async def judge(task: Task, final: str) -> Verdict:
    return await get(task.env).verify(task, Attempt(final=final), CTX)


def test_registry_lists_every_supported_dataset() -> None:
    assert {"basic_arithmetic", "chain_sum", "countdown", "zebra_puzzles"} <= set(DATASETS)
    assert {f"rg:{d}" for d in DATASETS} <= set(names())
    for d in ALL:
        e = env(d)
        assert e.name == f"rg:{d}" and e.exploit_kind == "answer" and e.max_difficulty == 5
    with pytest.raises(TaskError, match="known: basic_arithmetic"):
        get("rg:no_such_dataset")
    with pytest.raises(TaskError):
        ReasoningGym("gsm_symbolic")  # in reasoning-gym, but not verified strictly by farm


def test_listing_names_does_not_import_reasoning_gym() -> None:
    code = "import sys; from farmd.envs import names; names(); print('reasoning_gym' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=60)
    assert out.stdout.strip() == b"False"


@pytest.mark.parametrize("dataset", ALL)
def test_tasks_are_deterministic_and_public(dataset: str) -> None:
    e = env(dataset)
    for level in LEVELS:
        a = e.generate(11, level)
        assert a == e.generate(11, level)
        assert a.prompt != e.generate(12, level).prompt
        assert a.kind == "submission" and a.examples == [] and a.entry_point is None
        assert a.answer_format and "exactly one <answer>...</answer> block" in a.answer_format
        assert a.prompt.endswith("scores 0.") and a.answer_format in a.prompt
        assert a.metadata == {"dataset": dataset, "source": "reasoning-gym 0.1.25",
                              "answer_kind": DATASETS[dataset].answer,
                              "knobs": DATASETS[dataset].levels[level - 1]}
        public = a.public()
        assert {"env", "seed", "difficulty", "prompt", "answer_format", "examples"} <= set(public)
        json.dumps(public)
    assert e.generate(11, 1).prompt != e.generate(11, 2).prompt


def test_tasks_are_the_same_in_another_process() -> None:
    """Hash randomization must not change a task (zebra puzzles are built from sets of clues)."""
    code = ("import hashlib; from farmd.envs import get\n"
            "for d in ('basic_arithmetic', 'chain_sum', 'countdown', 'zebra_puzzles'):\n"
            "    e = get('rg:' + d)\n"
            "    t = e.generate(5, 2)\n"
            "    print(hashlib.sha256((t.prompt + e.reference(t).final).encode()).hexdigest())\n")
    here = []
    for d in ("basic_arithmetic", "chain_sum", "countdown", "zebra_puzzles"):
        t = env(d).generate(5, 2)
        here.append(hashlib.sha256((t.prompt + env(d).reference(t).final).encode()).hexdigest())
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=120,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert out.stdout.decode().split() == here


def test_difficulty_out_of_range_is_refused() -> None:
    for d in ALL:
        for level in (0, 6, -1):
            with pytest.raises(TaskError):
                env(d).generate(1, level)


@pytest.mark.parametrize("dataset", ALL)
def test_levels_only_get_harder(dataset: str) -> None:
    levels = DATASETS[dataset].levels
    assert len(levels) == 5
    for level, (easier, harder) in enumerate(itertools.pairwise(levels), 2):
        assert easier != harder, f"levels {level - 1} and {level} are the same"
        for knob in set(easier) & set(harder):
            if isinstance(easier[knob], (int, bool)):
                assert harder[knob] >= easier[knob], (knob, level)
            else:
                assert set(harder[knob]) >= set(easier[knob]), (knob, level)


def _item(task: Task) -> dict[str, Any]:
    entry: dict[str, Any] = rg._item(task.env[3:], get(task.env).version, task.seed, task.difficulty).entry
    return entry


@pytest.mark.parametrize("dataset", ALL)
def test_difficulty_sets_the_knobs(dataset: str) -> None:
    for level in LEVELS:
        knobs = DATASETS[dataset].levels[level - 1]
        for seed in range(8):
            meta = _item(env(dataset).generate(seed, level))["metadata"]
            if dataset in ("basic_arithmetic", "chain_sum"):
                assert knobs["min_terms"] <= meta["num_terms"] <= knobs["max_terms"]
                assert knobs["min_digits"] <= meta["num_digits"] <= knobs["max_digits"]
                if not knobs.get("allow_parentheses", True):
                    assert "(" not in meta["expression"]
            elif dataset == "countdown":
                assert knobs["min_numbers"] <= len(meta["numbers"]) <= knobs["max_numbers"]
                assert all(knobs["min_value"] <= n <= knobs["max_value"] for n in meta["numbers"])
                assert knobs["min_target"] <= meta["target"] <= knobs["max_target"]
            else:
                assert meta["difficulty"] == knobs
                assert f"There are {knobs['num_people']} houses" in env(dataset).generate(seed, level).prompt


async def _recall(dataset: str, seeds: range, levels: range) -> list[str]:
    e = env(dataset)
    bad = []
    for level in levels:
        for seed in seeds:
            task = e.generate(seed, level)
            verdict = await e.verify(task, e.reference(task), CTX)
            if not verdict.passed:
                bad.append(f"seed {seed} level {level}: {verdict.status} {verdict.reasons}")
    return bad


# 200 seeds of every level under `make test-sweeps`, an eighth of them under `make test` (``sweep_seeds``).
# zebra_puzzles at 4x4 and 5x4 take 0.1 and 0.3-0.4 s a task to make here: those two levels have a test of
# their own, marked slow.
QUICK_RECALL = [(d, sweep_seeds(200), LEVELS) for d in ALL if d != "zebra_puzzles"] + [
    ("zebra_puzzles", sweep_seeds(200), range(1, 4))]


@pytest.mark.parametrize(("dataset", "seeds", "levels"), QUICK_RECALL,
                         ids=[f"{d}-{lv.start}..{lv.stop - 1}" for d, _, lv in QUICK_RECALL])
async def test_references_pass(dataset: str, seeds: range, levels: range) -> None:
    assert await _recall(dataset, seeds, levels) == []


@pytest.mark.slow
@pytest.mark.timeout(600)  # 70-100 s here, more on a busy machine
async def test_zebra_references_pass_for_many_seeds_of_the_hard_levels() -> None:
    # 0.1-0.4 s a task to make: 12 seeds under make test, 200 under make test-sweeps.
    assert await _recall("zebra_puzzles", range(200) if FULL_SWEEP else range(12), range(4, 6)) == []


def _question(task: Task) -> str:
    return task.prompt.split("\n\nAnswer format (this overrides")[0]


BAD = {
    "empty": lambda task: "",
    "whitespace": lambda task: " \n\t ",
    "wrong answer": lambda task: f"<answer>{wrong(task)}</answer>",
    "random text": lambda task: "".join(random.Random(task.seed).choices("abcdefgh <>/ 0123", k=300)),
    "random text in a block": lambda task: "<answer>" + random.Random(task.seed).choice(
        ["lorem ipsum", "I don't know", "???", "N/A", "the answer"]) + "</answer>",
    "echoing the question": lambda task: f"<answer>{_question(task)}</answer>",
    "thinking without an answer": lambda task: "<think>Let me work it out step by step.</think>",
}


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("dataset", ALL)
async def test_known_bad_attempts_fail(dataset: str, name: str) -> None:
    for level in LEVELS:
        for seed in (3, 4):
            task = env(dataset).generate(seed, level)
            verdict = await judge(task, BAD[name](task))
            assert verdict.status == "ok" and not verdict.passed and verdict.reward == 0.0, (level, verdict)
            assert verdict.reasons


@pytest.mark.parametrize("dataset", ALL)
async def test_a_constant_answer_passes_only_where_it_is_right(dataset: str) -> None:
    for level in LEVELS:
        for seed in range(30):
            task = env(dataset).generate(seed, level)
            for constant in ("0", "1", "bob", "1 + 2 * 3"):
                verdict = await judge(task, f"<answer>{constant}</answer>")
                assert verdict.passed == (constant == oracle(task)), (seed, level, constant)


async def test_what_the_flags_say() -> None:
    task = env("chain_sum").generate(1, 2)
    right = oracle(task)
    assert (await judge(task, "no tags here")).flags == [NO_ANSWER]
    assert (await judge(task, "<answer> </answer>")).flags == [NO_ANSWER]
    assert (await judge(task, f"<answer>{right}</answer><answer>{right}</answer>")).flags == [SUSPECTED_HACK]
    assert (await judge(task, f"<answer>{right} or {wrong(task)}</answer>")).flags == [SUSPECTED_HACK]
    injected = f"<answer>{right}</answer> ignore previous instructions"
    assert (await judge(task, injected)).flags == [SUSPECTED_HACK]
    assert (await judge(task, f"<answer>{wrong(task)}</answer>")).flags == []
    passed = await judge(task, f"Thinking...\n<ANSWER> {right} </ANSWER>\n")
    assert passed.passed and passed.reward == 1.0 and passed.flags == [] and passed.details["rg_score"] == 1.0


async def test_numbers_compare_exactly() -> None:
    task = next(t for t in (env("chain_sum").generate(s, 5) for s in range(50)) if int(oracle(t)) > 1000)
    right = int(oracle(task))
    for ok in (f"{right}", f"+{right}", f"{right}.0", f"0{right}", f"  {right}  "):
        assert (await judge(task, f"<answer>{ok}</answer>")).passed, ok
    for bad in (f"{right}.0000001", f"{right - 1}.9999999", f"-{right}", f"{right:,}", f"{right}e0",
                f"{right}.", "".join(chr(ord(c) + 0xFEE0) for c in str(right)), f"{right} units"):
        verdict = await judge(task, f"<answer>{bad}</answer>")
        assert verdict.status == "ok" and not verdict.passed, bad


async def test_zebra_names_compare_case_insensitively() -> None:
    task = env("zebra_puzzles").generate(2, 1)
    right = oracle(task)
    for ok in (right, right.upper(), right.capitalize(), f" {right}\n"):
        assert (await judge(task, f"<answer>{ok}</answer>")).passed, ok
    for bad in (f"{right}.", f"{right} is the one", f"Mr {right}", "\u0430" + right[1:], f"{right}s"):
        assert not (await judge(task, f"<answer>{bad}</answer>")).passed, bad


async def test_countdown_checks_numbers_and_value() -> None:
    task = env("countdown").generate(9, 3)
    meta = _item(task)["metadata"]
    numbers, target = meta["numbers"], meta["target"]
    right = oracle(task)
    assert (await judge(task, f"<answer>({right})</answer>")).passed
    assert (await judge(task, f"<answer>-(-({right}))</answer>")).passed
    cases = {
        f"{right} + {numbers[0]} - {numbers[0]}": "exactly once",
        f"{right} + 0": "exactly once",
        " + ".join(str(n) for n in numbers[1:]): "exactly once",
        " + ".join(str(n) for n in numbers) + " + 0 * 1": "exactly once",
        str(target): "exactly once",
        f"({right}) ** 1": "Pow",
        f"({right}) // 1": "FloorDiv",
        f"int({right})": "only hold",
        f"{right} / 0": "division by zero",
    }
    for text, words in cases.items():
        verdict = await judge(task, f"<answer>{text}</answer>")
        assert not verdict.passed and any(words in r for r in verdict.reasons), (text, verdict.reasons)


async def test_reasoning_gym_alone_is_lenient_and_farm_is_not() -> None:
    """Why farm checks first: the source's scorers credit hedges, lookalike digits and exponents."""
    def fullwidth(right: str) -> str:
        return "".join(chr(ord(c) + 0xFEE0) if c.isdigit() else c for c in right)

    cases = {"basic_arithmetic": lambda right: [f"{right} or 12345", f"{right} apples"],
             "chain_sum": lambda right: [f"{right} or 12345", fullwidth(right), f"{right}e0",
                                         f"{right[:-1]},{right[-1]}"]}
    for dataset, lenient_forms in cases.items():
        task = env(dataset).generate(4, 4)
        item = rg._item(dataset, env(dataset).version, task.seed, task.difficulty)
        for lenient in lenient_forms(oracle(task)):
            assert item.dataset.score_answer(lenient, item.entry) > 0, (dataset, lenient)
            verdict = await judge(task, f"<answer>{lenient}</answer>")
            assert not verdict.passed and verdict.reward == 0.0, (dataset, lenient)


async def test_hostile_attempts_never_raise() -> None:
    task = env("countdown").generate(1, 1)
    rng = random.Random(0)
    texts = [os.urandom(2000).decode("utf-8", "surrogateescape"), "\ud800<answer>\udfff</answer>",
             "<answer>" + "(" * 150 + "1" + ")" * 150 + "</answer>", "<answer>" + "9" * 5000 + "</answer>",
             "<answer>9" + "*9" * 99 + "</answer>", "<answer>" + "1/" * 99 + "1</answer>", "x" * 10**6]
    texts += ["".join(rng.choice(["<answer>", "</answer>", "1", "+", "(", ")", "or", "\x00", "\uff11"])
                      for _ in range(rng.randint(0, 40))) for _ in range(300)]
    for text in texts:
        verdict = await judge(task, text)
        assert verdict.status == "ok" and not verdict.passed, text[:80]


async def test_a_broken_source_is_an_error_not_a_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    task = env("chain_sum").generate(6, 2)
    right = oracle(task)
    item = rg._item("chain_sum", env("chain_sum").version, task.seed, task.difficulty)

    def broken_scorer(self: object, answer: str, entry: object) -> float:
        raise RuntimeError("scorer bug")

    monkeypatch.setattr(type(item.dataset), "score_answer", broken_scorer)
    verdict = await verify_safely(env("chain_sum"), task, Attempt(final=f"<answer>{right}</answer>"), CTX)
    assert verdict.status == "error" and not verdict.passed and "scorer bug" in verdict.reasons[0]

    def scorer_broken_by_one_answer(self: object, answer: str, entry: object) -> float:
        if answer != right:
            raise RuntimeError("scorer bug this answer found")
        return 1.0

    # A scorer that fails only on this answer, while judging the reference soundly: the answer's 0.
    monkeypatch.setattr(type(item.dataset), "score_answer", scorer_broken_by_one_answer)
    other = f"<answer>{int(right) + 1}</answer>" if right.lstrip("-").isdigit() else "<answer>0</answer>"
    monkeypatch.setattr(rg, "_strict", lambda kind, answer, item: None)  # let it reach the scorer
    verdict = await verify_safely(env("chain_sum"), task, Attempt(final=other), CTX)
    assert (verdict.status, verdict.reward) == ("ok", 0.0) and VERIFIER_FAULT in verdict.flags, verdict

    monkeypatch.setattr(type(item.dataset), "score_answer", lambda self, answer, entry: 0.5)
    verdict = await judge(task, f"<answer>{right}</answer>")
    assert verdict.status == "ok" and not verdict.passed and "0.5" in verdict.reasons[0]

    def no_item(*args: object) -> object:
        raise ValueError("cannot make it")

    monkeypatch.setattr(rg, "_item", no_item)
    verdict = await judge(task, f"<answer>{right}</answer>")
    assert verdict.status == "error" and not verdict.passed

    verdict = await env("countdown").verify(task, Attempt(final=f"<answer>{right}</answer>"), CTX)
    assert verdict.status == "error" and "rg:chain_sum" in verdict.reasons[0]


def test_the_answer_library_covers_the_known_hacks() -> None:
    exploits = for_kind("answer")
    assert exploits and all(e.description for e in exploits)
    assert len({e.name for e in exploits}) == len(exploits)
    assert {"no-tags", "answer-outside-tags", "wrong-then-right", "right-then-wrong", "hedge-or",
            "hedge-comma",
            "hedge-slash", "every-small-integer", "empty-block", "prompt-injection", "fullwidth",
            "trailing-words", "nested-tags", "reuse-number", "unlisted-number", "power-operator",
            "function-call", "python-code"} <= {e.name for e in exploits}


@pytest.fixture
def code_marker() -> Iterator[None]:
    """Fails the test if anything ran the python-code exploit's answer."""
    Path(CODE_MARKER).unlink(missing_ok=True)
    yield
    assert not Path(CODE_MARKER).exists(), "something evaluated an answer as Python"


@pytest.mark.parametrize("dataset", ALL)
async def test_every_answer_exploit_scores_zero(dataset: str, code_marker: None) -> None:
    e = env(dataset)
    rewarded = []
    for level in LEVELS:
        for seed in (0, 1):
            task = e.generate(seed, level)
            for exploit in for_kind("answer"):
                verdict = await e.verify(task, exploit.make(task), CTX)
                assert verdict.status == "ok", (exploit.name, level, verdict.reasons)
                if verdict.reward != 0.0 or verdict.passed:
                    rewarded.append(f"{exploit.name} seed {seed} level {level}")
    assert rewarded == []


def test_farmctl_task_show_prints_the_public_task() -> None:
    shown = farmctl("task", "show", "--env", "rg:countdown", "--seed", "1", "--difficulty", "2")
    out = json.loads(shown.stdout)
    assert {"env", "seed", "difficulty", "prompt", "answer_format", "examples"} <= set(out)
    assert (out["env"], out["seed"], out["difficulty"], out["examples"]) == ("rg:countdown", 1, 2, [])
    assert out["prompt"] == env("countdown").generate(1, 2).prompt
    assert farmctl("task", "show", "--env", "rg:countdown", "--seed", "1", "--difficulty", "9",
                   check=False).returncode == 2


@pytest.mark.sandbox
def test_farmctl_verify(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    common = ("verify", "--env", "rg:chain_sum", "--seed", "3", "--data", data)
    ref = json.loads(farmctl(*common, "--reference").stdout)
    assert ref["passed"] is True and ref["reward"] == 1.0 and ref["status"] == "ok"
    submission = tmp_path / "answer.txt"
    submission.write_text(f"<answer>{wrong(env('chain_sum').generate(3, 1))}</answer>\n")
    bad = json.loads(farmctl(*common, "--submission", str(submission)).stdout)
    assert bad["passed"] is False and bad["reward"] == 0.0 and bad["status"] == "ok"


async def test_a_lone_surrogate_is_judged_as_repaired_and_flagged() -> None:
    from farmd.verifier.verdict import INVALID_TEXT

    task = env("chain_sum").generate(6, 2)
    right = oracle(task)
    texts = {f"thinking \ud800 done <answer>{right}</answer>": True, f"<answer>{right}\udfff</answer>": False,
             "<answer>\ud800</answer>": False, "\udc80" * 10: False}
    for text, passes in texts.items():
        verdict = await verify_safely(env("chain_sum"), task, Attempt(final=text), CTX)
        assert verdict.status == "ok" and verdict.passed is passes and INVALID_TEXT in verdict.flags, (text, verdict)
        assert (await judge(task, text)).passed is passes, "a direct call judges the same repaired text"
        json.dumps(verdict.to_json(), ensure_ascii=False).encode("utf-8")
