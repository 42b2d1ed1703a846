"""Tier 1's measured coverage: mutants of the reference, each a small plausible bug, judged by the
environment's own verifier. A mutant whose answer differs from the reference's and still passes is a wrong
answer the verifier accepts; the share of differing mutants it rejects is reported, not guessed.

Mutations, each applied alone to the source of ``reference`` or of ``generate`` (where an environment
computes its hidden answer, as the example does): an arithmetic or comparison operator flipped (``+``/``-``,
``*``/``//``, ``<``/``<=``, ``==``/``!=``, ...), a numeric constant moved by one (a boundary), a branch
dropped (an ``if`` whose body is skipped), and a value of the ``hidden`` dict moved by one. A mutant counts
on a task only where it poses the same public task as the original (a mutant that changed the question
answers another one) and answers it differently; one that crashes or agrees everywhere says nothing about
the verifier and is not counted.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from farmd import syntax
from farmd.errors import ContributedError
from farmd.intake.boxed import BoxedEnvironment, ContributedTask
from farmd.intake.checks import Finding

MAX_MUTANTS = 12
_FLIPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
                            ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                            ast.NotEq: ast.Eq}


@dataclasses.dataclass(frozen=True)
class Coverage:
    mutants: int
    """Mutants made of the reference."""
    differing: int
    """Those whose answer differed from the reference's on some task (the others say nothing)."""
    killed: int
    """Of the differing ones, those the verifier failed on a task where the answer differed."""
    survivors: tuple[str, ...]
    """What each surviving mutant changed: wrong answers the verifier accepted."""

    @property
    def share(self) -> float | None:
        return self.killed / self.differing if self.differing else None


_MUTATED = ("reference", "generate")
_NUDGE = "_farm_nudged"
_NUDGE_SOURCE = f"""

def {_NUDGE}(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list) and value:
        return value[:-1]
    return value
"""
"""Moves a hidden value by one, whatever its type: what a reference that read the wrong field would give."""


def _reference_nodes(tree: ast.Module, entry_class: str) -> list[ast.AST]:
    """Every node inside the entry class's ``reference`` and ``generate`` methods."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == entry_class:
            return [n for item in node.body if isinstance(item, ast.FunctionDef) and item.name in _MUTATED
                    for n in ast.walk(item)]
    return []


def _hidden_values(node: ast.AST) -> list[ast.expr]:
    """The values of a ``{"hidden": {...}}`` literal's inner dict, if ``node`` is one."""
    if not isinstance(node, ast.Dict):
        return []
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == "hidden" and isinstance(value, ast.Dict):
            return list(value.values)
    return []


def mutants(source: str, entry_class: str) -> Iterator[tuple[str, str]]:
    """(what changed, mutated source) for each mutation of the reference, at most ``MAX_MUTANTS``."""
    tree = syntax.parse(source)
    made = 0
    for index, node in enumerate(_reference_nodes(tree, entry_class)):
        if made >= MAX_MUTANTS:
            return
        changes: list[tuple[str, object]] = []
        if isinstance(node, ast.BinOp) and type(node.op) in _FLIPS:
            changes.append((f"line {node.lineno}: {type(node.op).__name__} -> {_FLIPS[type(node.op)].__name__}", "op"))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIPS:
            changes.append((f"line {node.lineno}: {type(node.ops[0]).__name__} -> "
                            f"{_FLIPS[type(node.ops[0])].__name__}", "cmp"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            changes.append((f"line {node.lineno}: {node.value} -> {node.value + 1}", "const"))
        elif isinstance(node, ast.If):
            changes.append((f"line {node.lineno}: the if-branch dropped", "drop"))
        line = getattr(node, "lineno", 0)
        changes += [(f"line {line}: hidden value {i + 1} moved by one", i) for i in range(len(_hidden_values(node)))]
        for what, how in changes:
            mutated = copy.deepcopy(tree)
            target = _reference_nodes(mutated, entry_class)[index]
            if how == "op" and isinstance(target, ast.BinOp):
                target.op = _FLIPS[type(target.op)]()
            elif how == "cmp" and isinstance(target, ast.Compare):
                target.ops = [_FLIPS[type(target.ops[0])]()]
            elif how == "const" and isinstance(target, ast.Constant) and type(target.value) is int:
                target.value = target.value + 1
            elif how == "drop" and isinstance(target, ast.If):
                target.test = ast.Constant(False)
            elif isinstance(how, int) and isinstance(target, ast.Dict):
                hidden = target.values[[k.value if isinstance(k, ast.Constant) else None
                                        for k in target.keys].index("hidden")]
                assert isinstance(hidden, ast.Dict)
                hidden.values[how] = ast.Call(ast.Name(_NUDGE, ast.Load()), [hidden.values[how]], [])
                made += 1
                yield what, ast.unparse(mutated) + _NUDGE_SOURCE
                continue
            made += 1
            yield what, ast.unparse(mutated)


async def measure(original: BoxedEnvironment, keys: Sequence[tuple[int, int]], *,
                  answers: Mapping[tuple[int, int], str] | None = None,
                  posed: Mapping[tuple[int, int], ContributedTask] | None = None) -> Coverage:
    """Run each mutant's reference on ``keys`` and judge its answers with the original verifier. ``answers``
    and ``posed``: the original's references and tasks for ``keys`` where the caller has them already (tier 1
    does), so they are not asked of boxes again."""
    package = original.package
    m = package.manifest
    answers = {k: answers[k] if answers and k in answers else await original.reference(*k) for k in keys}
    posed = {k: posed[k] if posed and k in posed else await original.generate(*k) for k in keys}
    source = package.files[m.entry_file].decode("utf-8", errors="replace")
    made = differing = killed = 0
    survivors: list[str] = []
    for what, mutated in mutants(source, m.entry_class):
        made += 1
        env = original.variant(dataclasses.replace(package, files={**package.files, m.entry_file: mutated.encode()}))
        # A mutant's keys are independent: asked at once, and its differing answers judged at once.
        try:
            given = await asyncio.gather(*[_answer(env, k, posed[k], answers[k]) for k in keys])
        finally:
            await env.aclose()
        wrong = [(k, a) for k, a in zip(keys, given, strict=True) if a is not None]
        if not wrong:
            continue
        differing += 1
        verdicts = await asyncio.gather(*[original.verify(*k, a) for k, a in wrong])
        if any(not v.passed for v in verdicts):
            killed += 1
        else:
            survivors.append(what)
    return Coverage(made, differing, killed, tuple(survivors))


async def _answer(env: BoxedEnvironment, key: tuple[int, int], posed: object, expected: str) -> str | None:
    """The mutant's answer to ``key``, if it differs from ``expected`` and answers the same question."""
    try:
        answer = await env.reference(*key)
        if answer.strip() == expected.strip():
            return None  # the same answer says nothing, whatever the question (and costs no second box)
        if await env.generate(*key) != posed:
            return None  # it asks another question: its answer says nothing of this one's verifier
        return answer
    except ContributedError:
        return None


def coverage_findings(coverage: Coverage) -> list[Finding]:
    """A surviving mutant is a wrong answer the verifier accepted: one finding each."""
    return [Finding("check_mutants", f"a reference mutated at {what} gave a different answer and the verifier "
                    f"passed it ({coverage.killed} of {coverage.differing} differing mutants rejected)",
                    "check the whole answer against the hidden data, not part of it or its form")
            for what in coverage.survivors]
