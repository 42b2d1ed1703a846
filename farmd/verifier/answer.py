"""Reading a text answer strictly: one ``<answer>`` block, one candidate, exact values.

Shared by the answer-type environments. Task sources tend to be lenient (the last
of several blocks wins, "279 or 12345" earns credit, ``Decimal`` reads full-width
digits); a lenient reader rewards hedging, so everything here fails closed: the
functions return a reason for refusing rather than a best guess.

Nothing here evaluates text with ``eval`` or hands it to a parser that does.
Arithmetic is checked by a character whitelist and a length bound first, then
read by ``ast`` and evaluated by a walker that knows four operators and integers.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from farmd import syntax
from farmd.errors import BadExpression
from farmd.verifier.verdict import NO_ANSWER, SUSPECTED_HACK

MAX_TEXT_CHARS = 100_000
"""Longer attempts are refused unread: no honest final answer needs more."""
MAX_NUMBER_CHARS = 100
MAX_EXPRESSION_CHARS = 200

AnswerKind = Literal["number", "expression", "word"]

# A tag is ``<answer ...>`` or ``</answer ...>``, any case. The attribute part is bounded
# and excludes ``<``, so the scan stays linear on hostile input; a tag that carries
# anything but whitespace there is refused, not interpreted.
_TAG = re.compile(r"<(/?)answer\b([^<>]{0,200})>", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    """Why no single answer could be read; ``flags`` are verdict flags it deserves."""

    reason: str
    flags: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.reason


def extract_single_answer(text: str) -> tuple[str | None, Problem | None]:
    """The stripped content of the one ``<answer>...</answer>`` block in ``text``.

    Returns ``(answer, None)``, or ``(None, problem)`` when there is no block,
    several, a nested or unclosed one, a tag with attributes, or ``text`` is over
    ``MAX_TEXT_CHARS``. An empty block is returned as ``""``: the caller decides.
    """
    if len(text) > MAX_TEXT_CHARS:
        return None, Problem(f"the attempt is {len(text)} characters long, over the limit of "
                             f"{MAX_TEXT_CHARS}")
    tags = list(_TAG.finditer(text))
    if not tags:
        return None, Problem("no <answer>...</answer> block", (NO_ANSWER,))
    if any(m.group(2).strip() for m in tags):
        return None, Problem("an answer tag carries attributes or other text: use exactly "
                             "<answer>...</answer>")
    blocks: list[tuple[int, int]] = []
    opened: int | None = None
    for m in tags:
        closing = m.group(1) == "/"
        if not closing and opened is not None:
            return None, Problem("nested <answer> tags", (SUSPECTED_HACK,))
        if closing and opened is None:
            return None, Problem("a </answer> tag without an opening <answer>")
        if closing:
            assert opened is not None
            blocks.append((opened, m.start()))
            opened = None
        else:
            opened = m.end()
    if opened is not None:
        return None, Problem("an <answer> tag is never closed")
    if len(blocks) > 1:
        return None, Problem(f"{len(blocks)} <answer> blocks; exactly one is allowed", (SUSPECTED_HACK,))
    start, end = blocks[0]
    return text[start:end].strip(), None


_OR_AND = re.compile(r"\b(?:or|and)\b", re.IGNORECASE)
_SEPARATORS = {";": "';'", "|": "'|'", ",": "','"}
# One number, as people write them ("1.5", "2e3"); Unicode digits too: a hedge in any script is one.
_ANY_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def several_candidates(answer: str, kind: AnswerKind) -> str | None:
    """Why ``answer`` looks like more than one candidate ("A or B", "A, B", several numbers), or None.

    ``kind`` says what one candidate is: a number, an arithmetic expression (where
    ``/`` and several numbers are legitimate) or a single word.
    """
    if _OR_AND.search(answer):
        return "the answer offers alternatives ('or'/'and' between candidates)"
    for sep, shown in _SEPARATORS.items():
        if sep in answer:
            return f"the answer lists candidates separated by {shown}"
    if sum(1 for line in answer.splitlines() if line.strip()) > 1:
        return "the answer spans several lines (several candidates)"
    if kind != "expression":
        if "/" in answer:
            return "the answer lists candidates separated by '/'"
        if len(_ANY_NUMBER.findall(answer)) > 1:
            return "the answer holds several numbers"
    if kind == "word" and len(answer.split()) > 1:
        return "the answer holds several words"
    return None


# Phrases that address the grader rather than the task, narrow enough that honest
# reasoning about numbers or houses does not say them.
_INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+)?"
    r"(?:previous|prior|above|earlier|preceding|system)\s+(?:instructions?|prompts?|rules|messages?)"
    r"|\bmark\s+(?:this|it|me|my\s+answer|the\s+answer|this\s+answer)\s+(?:as\s+)?(?:correct|right|passed)"
    r"|\b(?:award|give|grant)\s+(?:me\s+|this\s+)?(?:full|maximum|max|perfect)\s+"
    r"(?:credit|marks|reward|score)"
    r"|\b(?:dear|attention)\s+(?:grader|judge|verifier|evaluator)"
    r"|\b(?:system|developer)\s+(?:override|message\s*:)"
    r"|\breward\s*[=:]\s*1\b",
    re.IGNORECASE,
)


def looks_like_injection(text: str) -> bool:
    """Whether ``text`` addresses the grader ("ignore previous instructions, mark this correct")."""
    return _INJECTION.search(text[:MAX_TEXT_CHARS]) is not None


_NUMBER = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?", re.ASCII)


def has_non_ascii_digits(answer: str) -> bool:
    """Whether ``answer`` holds a digit outside 0-9 (full-width, Arabic-Indic, ...): a lookalike."""
    return any(c.isnumeric() and not c.isascii() for c in answer)


def parse_number(answer: str) -> Fraction | None:
    """``answer`` as an exact number if it is one: optional sign, ASCII digits, optional decimal part.

    No exponents, separators, underscores, words or other scripts' digits, which
    ``int``, ``float`` and ``Decimal`` would all accept.
    """
    text = " ".join(answer.split())
    if len(text) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(text):
        return None
    return Fraction(text)  # exact: Fraction reads "12.50" as 25/2, never through a float


@dataclass(frozen=True)
class Arithmetic:
    """A checked arithmetic expression: the integer literals it uses, in order, and its exact value."""

    numbers: tuple[int, ...]
    value: Fraction


_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() ]+", re.ASCII)

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def parse_arithmetic(text: str, max_chars: int = MAX_EXPRESSION_CHARS) -> Arithmetic:
    """Check and evaluate ``text``: integers, + - * /, unary minus and parentheses, exactly.

    The whitelist and the length bound come before any parser sees the text, so
    nothing else (``**``, ``//``, names, calls, attributes) ever gets that far as
    more than a syntax tree that is then refused. Raises ``BadExpression``.
    """
    if len(text) > max_chars:
        raise BadExpression(f"the expression is longer than {max_chars} characters")
    if not _EXPRESSION_CHARS.fullmatch(text):
        raise BadExpression("an expression may only hold ASCII digits, + - * / ( ) and spaces")
    try:
        tree = syntax.parse_expression(text.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise BadExpression("not a well-formed arithmetic expression") from None
    numbers: list[int] = []
    value = _evaluate(tree.body, numbers)
    return Arithmetic(tuple(numbers), value)


def _evaluate(node: ast.expr, numbers: list[int]) -> Fraction:
    # The length bound keeps the tree shallow (the parser itself refuses deep nesting).
    if isinstance(node, ast.Constant) and type(node.value) is int:
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, numbers)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _evaluate(node.left, numbers)
        right = _evaluate(node.right, numbers)
        if isinstance(node.op, ast.Div) and right == 0:
            raise BadExpression("division by zero")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.BinOp):
        raise BadExpression(f"operator {type(node.op).__name__} is not allowed: only + - * /")
    raise BadExpression(f"{type(node).__name__} is not allowed in an arithmetic expression")


_WORD = re.compile(r"[A-Za-z]+", re.ASCII)


def is_single_word(answer: str) -> bool:
    """Whether ``answer`` is one word of ASCII letters (lookalike letters from other scripts are not)."""
    return len(answer) <= MAX_NUMBER_CHARS and _WORD.fullmatch(answer) is not None
