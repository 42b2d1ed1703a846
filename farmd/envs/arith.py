"""``arith`` and ``arith:heldout``: chain sums in the alphabet ``0123456789+-=``, answered with the bare integer.

Made for a tiny character-level language model whose vocabulary is those thirteen
characters: the prompt is the problem itself (``4-1+5=``), with no words and no
spaces, so the model reads the task's prompt as it is, through no adapter. The
answer is the exact value (left to right; only + and -, so there is no
precedence), written canonically: ASCII digits, a leading ``-`` if negative,
nothing else (``-3``, ``0``, ``17``).

Held out by problem, not by seed. At level 1 there are only 10 * 10 * 10 * 4 = 4000
problems, so a seed-disjoint split would mostly measure memorisation: every
problem (its expression, e.g. ``4-1+5``) belongs to one split, decided by a keyed
hash of the expression (``split_of``), about 10% held out. ``arith`` makes only
training problems and ``arith:heldout`` only held-out ones, by rejection sampling
from the seed's generator. A problem at two levels (``4-1+5`` is a level 1 and a
level 4 problem) is in the same split at both. Changing the split's key or share
changes which tasks a seed makes: bump ``version`` with it.

The verdict is computed on the host, with no box: the final text, stripped of
surrounding spaces and newlines, must be exactly the canonical integer, recomputed
from the task's seed and difficulty. Nothing is lenient: ``+3``, ``03``, ``-0``,
``3.0``, full-width digits, ``<answer>`` blocks and hedges all fail.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Literal

from farmd.envs.base import Attempt, Conduct, Rule, SubmissionEnvironment, Task, VerifyContext
from farmd.errors import TaskError
from farmd.text import valid_text
from farmd.verifier.answer import has_non_ascii_digits, looks_like_injection, several_candidates
from farmd.verifier.verdict import NO_ANSWER, SUSPECTED_HACK, Verdict, errored, failed

Split = Literal["train", "heldout"]

ALPHABET = "0123456789+-="
"""Every character a prompt may hold (the model's vocabulary, less its pad, bos and eos)."""


@dataclass(frozen=True)
class Level:
    """One difficulty level: how many terms, each of up to how many digits (uniform in 0..10**digits - 1)."""

    terms: int
    digits: int


LEVELS: tuple[Level, ...] = (
    Level(terms=3, digits=1),
    Level(terms=4, digits=1),
    Level(terms=5, digits=1),
    Level(terms=3, digits=2),
    Level(terms=4, digits=2),
)
"""Difficulty 1, 2, ... in order."""

HELDOUT_PER_MILLE = 100
"""The share of problems held out, in thousandths."""
_SPLIT_KEY = b"farm/arith/split/1"
"""Keys the split's hash: changing it (or the share) moves problems between splits, a new ``version``."""

_DRAWS = 1000
"""Problems drawn per task before giving up on finding one of the split: at a 10% share the chance of
needing more is about 1e-46, but the bound keeps ``generate`` total."""
_PROBLEMS_KEPT = 4096
"""Problems an environment keeps once drawn: several steps of the learning loop's groups (64 a step)."""

MAX_ANSWER_CHARS = 12
_MAX_TEXT_CHARS = 100
"""Longer attempts are refused unread: the answer is at most 12 characters, and padding is no answer."""
_SURROUNDING = " \r\n"
"""What is stripped from the final text: spaces and line ends, nothing else (no tabs, no invisibles)."""
_CANONICAL = re.compile(r"0|-?[1-9][0-9]*", re.ASCII)

ANSWER_FORMAT = ("only the exact integer value, in ASCII digits with a leading '-' if it is negative and "
                 "no leading zeros (e.g. -3, 0 or 17), and nothing else.")


@dataclass(frozen=True)
class Problem:
    """A chain sum: ``terms[0] ops[0] terms[1] ops[1] ...``, evaluated left to right."""

    terms: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def expression(self) -> str:
        """The canonical expression, e.g. ``4-1+5``: what the split is decided on, and the prompt less its ``=``."""
        out = [str(self.terms[0])]
        for op, term in zip(self.ops, self.terms[1:], strict=True):
            out += [op, str(term)]
        return "".join(out)

    @property
    def value(self) -> int:
        total = self.terms[0]
        for op, term in zip(self.ops, self.terms[1:], strict=True):
            total = total + term if op == "+" else total - term
        return total


def split_of(expression: str) -> Split:
    """The split ``expression`` belongs to: a keyed BLAKE2b hash of its text, so stable across
    processes and Python versions (unlike ``hash()``), and about ``HELDOUT_PER_MILLE``/1000 held out."""
    digest = hashlib.blake2b(expression.encode("utf-8"), digest_size=8, key=_SPLIT_KEY).digest()
    return "heldout" if int.from_bytes(digest, "big") % 1000 < HELDOUT_PER_MILLE else "train"


def draw(rng: random.Random, level: Level) -> Problem:
    """One problem of ``level``, every term and operator uniform."""
    terms = tuple(rng.randrange(10 ** level.digits) for _ in range(level.terms))
    ops = tuple(rng.choice("+-") for _ in range(level.terms - 1))
    return Problem(terms, ops)


class Arith(SubmissionEnvironment):
    """Chain sums for a character-level model: ``Arith("train")`` is ``arith``, ``Arith("heldout")``
    is ``arith:heldout``. Both judge alike (one ``verifier_version``); they differ only in which
    problems they make."""

    version = "1"
    verifier_version = "1"
    max_difficulty = len(LEVELS)
    exploit_kind = "bare-answer"
    # A problem is a few draws of a seeded generator: ~13 us, measured, against a thread hop each that cost more (in
    # the learning loop, 64 hops a step, and every group's other rollouts waiting on them through a shield).
    generates_inline = True

    def __init__(self, split: Split) -> None:
        if split not in ("train", "heldout"):
            raise TaskError(f"arith: split must be 'train' or 'heldout', got {split!r}")
        self.split: Split = split
        self.name = "arith" if split == "train" else "arith:heldout"
        # Every rollout's judging rebuilds its task's problem from the task's identity, and a group's rollouts share
        # one task: kept, a group draws it once rather than once a rollout (a draw is ~12 us of a 14 us verdict,
        # measured). Still computed here from the task's identity, never read from the task.
        self._problems = functools.lru_cache(maxsize=_PROBLEMS_KEPT)(self._draw)

    def problem(self, seed: int, difficulty: int) -> Problem:
        """The problem behind task ``(seed, difficulty)``: the seed's first draw that is of this split."""
        return self._problems(seed, difficulty)

    def _draw(self, seed: int, difficulty: int) -> Problem:
        rng = self.public_rng(seed, difficulty)
        level = LEVELS[difficulty - 1]
        for _ in range(_DRAWS):
            problem = draw(rng, level)
            if split_of(problem.expression) == self.split:
                return problem
        raise TaskError(f"{self.name}: no {self.split} problem in {_DRAWS} draws for seed {seed}, "
                        f"difficulty {difficulty}")

    def generate(self, seed: int, difficulty: int) -> Task:
        problem = self.problem(seed, difficulty)  # TaskError for a difficulty out of range
        level = LEVELS[difficulty - 1]
        return self.task(seed, difficulty, f"{problem.expression}=", answer_format=ANSWER_FORMAT,
                         metadata={"terms": level.terms, "digits": level.digits})

    def reference(self, task: Task) -> Attempt:
        return Attempt(final=str(self.problem(task.seed, task.difficulty).value))

    def rules(self, task: Task) -> tuple[Rule, ...]:
        return RULES

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        # Directly, not in a thread: judging is a bounded regex over at most 100 characters and a few
        # draws of a seeded generator (microseconds, less than a hop to a thread and back would cost).
        return self.judge(task, attempt.final)

    def judge(self, task: Task, text: str) -> Verdict:
        """The verdict on ``text`` as the final answer to ``task`` (what ``verify`` does). Never raises.

        Only the task's identity is trusted: the value is recomputed from its seed and difficulty.
        """
        v = self.verifier_version
        if task.env != self.name or task.env_version != self.version:
            return errored(v, f"a task of {task.env!r} version {task.env_version!r} was given to {self.name} "
                              f"version {self.version}")
        if not isinstance(text, str):
            return failed(v, "the attempt is not text")
        text = valid_text(text)[0]
        if len(text) > _MAX_TEXT_CHARS:
            return failed(v, f"the attempt is {len(text)} characters long; an answer is at most "
                             f"{MAX_ANSWER_CHARS}, with surrounding spaces or newlines at most {_MAX_TEXT_CHARS}")
        answer = text.strip(_SURROUNDING)
        if not answer:
            return failed(v, "no answer", flags=(NO_ANSWER,))
        try:
            want = self.problem(task.seed, task.difficulty).value
        except TaskError as exc:  # the task's identity is out of range: it cannot be judged, by no fault of the attempt
            return errored(v, f"could not rebuild the task: {exc}")
        if _CANONICAL.fullmatch(answer) and len(answer) <= MAX_ANSWER_CHARS:
            if answer == str(want):
                return Verdict(reward=1.0, passed=True, status="ok", verifier_version=v,
                               reasons=["the answer is right"])
            return failed(v, "wrong answer")
        hack = has_non_ascii_digits(answer) or looks_like_injection(text)
        hedge = several_candidates(answer, "expression")  # "3 or 4", "3,4", "3\n4"; not "4-1+5"
        return failed(v, hedge or _malformed(answer), flags=(SUSPECTED_HACK,) if hack or hedge else ())


def _misformed(c: Conduct) -> str | None:
    """Why the final text is not the one form ``ANSWER_FORMAT`` allows, or None (no answer is ``no_answer``'s)."""
    if len(c.final) > _MAX_TEXT_CHARS:
        return f"the attempt is {len(c.final)} characters long"
    answer = c.final.strip(_SURROUNDING)
    if not answer or (_CANONICAL.fullmatch(answer) and len(answer) <= MAX_ANSWER_CHARS):
        return None
    return _malformed(answer)


RULES = (Rule("answer form", ANSWER_FORMAT, _misformed),)


def _malformed(answer: str) -> str:
    """Why ``answer``, not canonical, fails: the most specific reason, so a reader sees what to fix."""
    rule = "the answer must be only the integer: ASCII digits, a leading '-' if negative, nothing else"
    if len(answer) > MAX_ANSWER_CHARS:
        return f"the answer is longer than {MAX_ANSWER_CHARS} characters; {rule}"
    if re.fullmatch(r"[+-]?[0-9]+", answer, re.ASCII):
        if answer.startswith("+"):
            return f"no '+' sign; {rule}"
        if set(answer.lstrip("-")) == {"0"}:
            return f"zero is written 0; {rule}"
        return f"no leading zeros; {rule}"
    return rule
