"""``rg:<dataset>``: reasoning tasks from reasoning-gym, answered in one ``<answer>`` block.

A task is item 0 (or the first sound item, see ``_item``) of a reasoning-gym
dataset created with a seed derived from the task's seed and difficulty and with
the difficulty's config knobs (``DATASETS``). The agent's final text must hold
exactly one ``<answer>`` block with exactly one candidate; the verdict is computed
on the host, with no box: farm's own strict check of the answer (one exact
number, one safe arithmetic expression, or one word) and then the dataset's own
``score_answer``, which must give full credit. reasoning-gym alone is lenient
(the last of several blocks wins, hedges earn credit, ``Decimal`` reads
full-width digits), so it never decides a pass by itself.

The oracle answer follows from the public seed, as it must for a generated
puzzle; it is never put in the prompt or the metadata.

reasoning-gym takes about a second to import, and the registry imports this
module to list names, so it is imported only where a task is made.
"""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from typing import Any

from farmd.envs.base import Attempt, Conduct, Rule, SubmissionEnvironment, Task, VerifyContext
from farmd.errors import BadExpression, TaskError
from farmd.text import valid_text
from farmd.verifier.answer import (
    MAX_EXPRESSION_CHARS,
    MAX_TEXT_CHARS,
    AnswerKind,
    extract_single_answer,
    has_non_ascii_digits,
    is_single_word,
    looks_like_injection,
    parse_arithmetic,
    parse_number,
    several_candidates,
)
from farmd.verifier.secret import public_rng
from farmd.verifier.verdict import NO_ANSWER, SUSPECTED_HACK, Verdict, errored, failed

RG_VERSION = "0.1.25"
"""The reasoning-gym release the tasks come from (pinned: another one may make other tasks)."""


@dataclass(frozen=True)
class Settings:
    """How farm runs one reasoning-gym dataset."""

    answer: AnswerKind
    """What one candidate answer is: a number, an arithmetic expression or a single word."""
    levels: tuple[dict[str, Any], ...]
    """Config knobs for difficulty 1, 2, ... (``reasoning_gym.create_dataset(name, **knobs)``)."""
    recompute: bool = False
    """Re-evaluate the item's ``metadata["expression"]`` exactly and skip items whose answer disagrees."""


_ALL_OPS = ("+", "-", "*", "/")

DATASETS: dict[str, Settings] = {
    # Without parentheses reasoning-gym evaluates left to right, ignoring precedence, so
    # that mode only gets + and -; with them it floors every division (see ``recompute``).
    "basic_arithmetic": Settings("number", (
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1, "operators": ("+", "-"),
         "allow_parentheses": False, "allow_negation": False},
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2, "operators": ("+", "-", "*"),
         "allow_parentheses": True, "allow_negation": False},
        {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 2, "operators": _ALL_OPS,
         "allow_parentheses": True, "allow_negation": True},
        {"min_terms": 4, "max_terms": 5, "min_digits": 2, "max_digits": 3, "operators": _ALL_OPS,
         "allow_parentheses": True, "allow_negation": True},
        {"min_terms": 5, "max_terms": 6, "min_digits": 2, "max_digits": 4, "operators": _ALL_OPS,
         "allow_parentheses": True, "allow_negation": True},
    ), recompute=True),
    "chain_sum": Settings("number", (
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        {"min_terms": 3, "max_terms": 4, "min_digits": 2, "max_digits": 3},
        {"min_terms": 4, "max_terms": 5, "min_digits": 2, "max_digits": 4, "allow_negation": True},
        {"min_terms": 5, "max_terms": 6, "min_digits": 3, "max_digits": 5, "allow_negation": True},
    ), recompute=True),
    "countdown": Settings("expression", (
        {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 10, "min_target": 10,
         "max_target": 100},
        {"min_numbers": 3, "max_numbers": 4, "min_value": 1, "max_value": 25, "min_target": 20,
         "max_target": 200},
        {"min_numbers": 4, "max_numbers": 4, "min_value": 1, "max_value": 50, "min_target": 50,
         "max_target": 500},
        {"min_numbers": 4, "max_numbers": 5, "min_value": 1, "max_value": 100, "min_target": 100,
         "max_target": 999},
        {"min_numbers": 5, "max_numbers": 6, "min_value": 1, "max_value": 100, "min_target": 100,
         "max_target": 999},
    )),
    # Generation time grows fast with size (5x4 about 0.3 s, 6x4 about 0.9 s, 7x7 about 9 s here).
    "zebra_puzzles": Settings("word", (
        {"num_people": 3, "num_characteristics": 2},
        {"num_people": 3, "num_characteristics": 3},
        {"num_people": 4, "num_characteristics": 3},
        {"num_people": 4, "num_characteristics": 4},
        {"num_people": 5, "num_characteristics": 4},
    )),
}

_FORMATS: dict[AnswerKind, str] = {
    "number": "exactly one <answer>...</answer> block holding only the final number, in ASCII digits with an "
              "optional leading minus sign, e.g. <answer>-42</answer>: no words, units, thousands separators "
              "or second candidates.",
    "expression": "exactly one <answer>...</answer> block holding only one arithmetic expression, e.g. "
                  "<answer>(7 - 2) * 4</answer>: ASCII digits, + - * / ( ) and spaces; every given number "
                  "used exactly once and no other number; no '=' sign, no target, no other text.",
    "word": "exactly one <answer>...</answer> block holding only the name, one word, e.g. "
            "<answer>Eve</answer>: no sentence and no second candidate.",
}

ONE_BLOCK = "More than one block, or a block that holds more than one candidate answer, scores 0"


def _one_answer(text: str) -> tuple[str | None, str | None]:
    """The one block's answer, or why the text breaks the block rule; (None, None) when there is no answer to
    hold to a form (none at all is ``no_answer``'s; over the bound the verifier refuses it unread)."""
    if len(text) > MAX_TEXT_CHARS:
        return None, None
    answer, problem = extract_single_answer(text)
    if problem is not None:
        return None, (None if NO_ANSWER in problem.flags else str(problem))
    return answer or None, None


def _not_one_block(kind: AnswerKind, c: Conduct) -> str | None:
    answer, why = _one_answer(c.final)
    return why if why is not None or answer is None else several_candidates(answer, kind)


_FORM_EXPRESSION = re.compile(r"[0-9+\-*/() ]+", re.ASCII)


def _misformed(kind: AnswerKind, c: Conduct) -> str | None:
    """Why the one block's answer is not of the form ``_FORMATS[kind]`` states; a hedge is the block rule's."""
    answer, _ = _one_answer(c.final)
    if answer is None or several_candidates(answer, kind) is not None:
        return None
    if kind == "number":
        ok = not has_non_ascii_digits(answer) and parse_number(answer) is not None
        return None if ok else "the answer is not one number in ASCII digits"
    if kind == "expression":
        ok = len(answer) <= MAX_EXPRESSION_CHARS and _FORM_EXPRESSION.fullmatch(answer) is not None
        return None if ok else "the answer holds more than ASCII digits, + - * / ( ) and spaces"
    return None if is_single_word(answer) else "the answer is not one word"


_DRAWS = 16
"""Items tried per task before giving up; nearly always the first is taken."""

_CODE = re.compile(r"__|\b(?:import|eval|exec|lambda|getattr|open)\b")


@dataclass(frozen=True)
class _Item:
    dataset: Any
    """The reasoning-gym dataset that made the entry: its ``score_answer`` is the source's own judge."""
    entry: dict[str, Any]

    @property
    def oracle(self) -> str:
        return str(self.entry["answer"]).strip()


class ReasoningGym(SubmissionEnvironment):
    """One reasoning-gym dataset as a farm environment: ``ReasoningGym("chain_sum")`` is ``rg:chain_sum``."""

    version = "1"
    verifier_version = "1"
    max_difficulty = 5
    exploit_kind = "answer"

    def __init__(self, dataset: str) -> None:
        settings = DATASETS.get(dataset)
        if settings is None:
            known = ", ".join(sorted(DATASETS))
            raise TaskError(f"no reasoning-gym dataset {dataset!r} in farm; known: {known}")
        self.dataset = dataset
        self.settings = settings
        self.name = f"rg:{dataset}"
        self.max_difficulty = len(settings.levels)

    def generate(self, seed: int, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        item = self._item(seed, difficulty)
        answer_format = _FORMATS[self.settings.answer]
        prompt = (f"{str(item.entry['question']).rstrip()}\n\n"
                  "Answer format (this overrides any format instructions above): give your final answer as "
                  f"{answer_format} Text outside the block is not read. {ONE_BLOCK}.")
        metadata = {"dataset": self.dataset, "source": f"reasoning-gym {RG_VERSION}",
                    "answer_kind": self.settings.answer, "knobs": dict(self.settings.levels[difficulty - 1])}
        return self.task(seed, difficulty, prompt, answer_format=answer_format, metadata=metadata)

    def reference(self, task: Task) -> Attempt:
        return Attempt(final=f"<answer>{self._item(task.seed, task.difficulty).oracle}</answer>")

    def rules(self, task: Task) -> tuple[Rule, ...]:
        kind = self.settings.answer
        return (Rule("answer block", ONE_BLOCK, functools.partial(_not_one_block, kind)),
                Rule("answer form", _FORMATS[kind], functools.partial(_misformed, kind)))

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        # Making a zebra puzzle can take a second: keep the event loop free meanwhile. An exception
        # (reasoning-gym's scorer raising on an answer farm's own checks let through, a bug of ours) is
        # left to ``verify_safely``, which judges the task's reference to tell whose doing it was.
        return await asyncio.to_thread(self.judge, task, attempt.final)

    def judge(self, task: Task, text: str) -> Verdict:
        """The verdict on ``text`` as the final answer to ``task`` (what ``verify`` does, synchronously).

        Judged as valid text: what UTF-8 cannot encode (a lone surrogate) is replaced first, so nothing
        downstream meets it (``verify_safely`` repairs and flags it before any verifier runs; this is
        for callers that come here directly).
        """
        if not isinstance(text, str):
            return failed(self.verifier_version, "the attempt is not text")
        return self._judge(task, valid_text(text)[0])

    def _judge(self, task: Task, text: str) -> Verdict:
        v = self.verifier_version
        if task.env != self.name:
            return errored(v, f"a task of {task.env!r} was given to {self.name}")
        answer, problem = extract_single_answer(text)
        if problem is not None or answer is None:
            return failed(v, str(problem), flags=problem.flags if problem else ())
        if not answer:
            return failed(v, "the <answer> block is empty", flags=(NO_ANSWER,))
        if looks_like_injection(text):
            return failed(v, "the attempt addresses the grader instead of the task", flags=(SUSPECTED_HACK,))
        hedge = several_candidates(answer, self.settings.answer)
        if hedge is not None:
            return failed(v, hedge, flags=(SUSPECTED_HACK,))
        try:
            item = self._item(task.seed, task.difficulty)
        except Exception as exc:  # making our own oracle failed: a verifier error, never the attempt's fault
            return errored(v, f"could not rebuild the task: {type(exc).__name__}: {exc}")
        return self._check(answer, item)

    def _check(self, answer: str, item: _Item) -> Verdict:
        v = self.verifier_version
        flags = (SUSPECTED_HACK,) if _CODE.search(answer) or has_non_ascii_digits(answer) else ()
        try:
            wrong = _strict(self.settings.answer, answer, item)
        except _OracleError as exc:
            return errored(v, str(exc))
        if wrong is not None:
            return failed(v, wrong, flags=flags)
        score = float(item.dataset.score_answer(answer, item.entry))
        verdict = failed(v, f"reasoning-gym's own scorer gave {score:g}, not full credit")
        verdict.details = {"dataset": self.dataset, "rg_score": score}
        if score == 1.0:
            verdict.passed, verdict.reward, verdict.reasons = True, 1.0, ["the answer is right"]
        return verdict

    def _item(self, seed: int, difficulty: int) -> _Item:
        self.check_difficulty(difficulty)
        return _item(self.dataset, self.version, seed, difficulty)


class _OracleError(Exception):
    """The dataset's own answer does not pass farm's reading of it: a verifier error."""


def _strict(kind: AnswerKind, answer: str, item: _Item) -> str | None:
    """Why ``answer`` is not exactly the item's answer, or None when it is."""
    if kind == "number":
        return _strict_number(answer, item)
    if kind == "expression":
        return _strict_expression(answer, item)
    return _strict_word(answer, item)


def _strict_number(answer: str, item: _Item) -> str | None:
    want = parse_number(item.oracle)
    if want is None:
        raise _OracleError(f"the dataset's answer {item.oracle[:40]!r} is not a number")
    if has_non_ascii_digits(answer):
        return "the answer uses digits from outside ASCII 0-9"
    got = parse_number(answer)
    if got is None:
        return "the answer is not one number (ASCII digits, an optional sign and decimal part)"
    return None if got == want else "wrong answer"


def _strict_expression(answer: str, item: _Item) -> str | None:
    meta = item.entry.get("metadata", {})
    try:
        given = sorted(int(n) for n in meta["numbers"])
        target = int(meta["target"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _OracleError(f"the dataset's item lacks its numbers or target: {exc}") from None
    try:
        got = parse_arithmetic(answer)
    except BadExpression as exc:
        return str(exc)
    if sorted(got.numbers) != given:
        return "the expression must use every given number exactly once and no other number"
    if got.value != target:
        return "the expression does not evaluate to the target"
    return None


def _strict_word(answer: str, item: _Item) -> str | None:
    if not is_single_word(item.oracle):
        raise _OracleError(f"the dataset's answer {item.oracle[:40]!r} is not one word")
    if not is_single_word(answer):
        return "the answer must be one word (a name) in ASCII letters"
    return None if answer.lower() == item.oracle.lower() else "wrong answer"


def _unsound(settings: Settings, item: _Item) -> str | None:
    """Why farm should not use this item (its own answer fails farm's checks), or None."""
    try:
        wrong = _strict(settings.answer, item.oracle, item)
        if wrong is None and settings.recompute:
            value = parse_arithmetic(str(item.entry["metadata"]["expression"]), max_chars=1000).value
            if value != parse_number(item.oracle):
                wrong = "the answer is not the exact value of the expression"
    except (_OracleError, BadExpression, KeyError) as exc:
        return str(exc)
    return wrong


@functools.lru_cache(maxsize=4096)
def _item(dataset: str, version: str, seed: int, difficulty: int) -> _Item:
    """The reasoning-gym item behind a task; deterministic in its arguments.

    Some items are unsound (basic_arithmetic floors divisions that are not exact, and
    answers "-1" for "-3 / 31"), and countdown sometimes gives up on a target range;
    such an item is skipped for the next index of the same dataset, so a task is still
    a function of ``(seed, difficulty)``.
    """
    import reasoning_gym  # type: ignore[import-untyped]  # no stubs; slow to import, hence here

    settings = DATASETS[dataset]
    rg_seed = public_rng("rg", dataset, version, seed, difficulty).getrandbits(32)
    data = reasoning_gym.create_dataset(dataset, seed=rg_seed, size=_DRAWS, **settings.levels[difficulty - 1])
    why = "no item"
    for index in range(_DRAWS):
        try:
            item = _Item(data, data[index])
        except Exception as exc:  # one item the source could not make; the next index is another draw
            why = f"{type(exc).__name__}: {exc}"
            continue
        unsound = _unsound(settings, item)
        if unsound is None:
            return item
        why = unsound
    raise TaskError(f"rg:{dataset}: no sound item in {_DRAWS} draws for seed {seed}, difficulty {difficulty} "
                    f"(last: {why})")
