"""Tier 1's measured coverage: mutants of the reference, each a small plausible bug, judged by the
environment's own verifier. A mutant whose answer differs from the reference's and still passes is a wrong
answer the verifier accepts; the share of differing mutants it rejects is reported, not guessed.

Mutations, each applied alone to the reference's source: an arithmetic or comparison operator flipped
(``+``/``-``, ``*``/``//``, ``<``/``<=``, ``==``/``!=``, ...), a numeric constant moved by one (a boundary),
and a branch dropped (an ``if`` whose body is skipped). A mutant that crashes or gives the reference's own
answer on every task says nothing about the verifier and is not counted.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from collections.abc import Iterator, Sequence

from farmd.intake.boxed import BoxedEnvironment, ContributedError
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


def _reference_nodes(tree: ast.Module, entry_class: str) -> list[ast.AST]:
    """Every node inside the entry class's ``reference`` method."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == entry_class:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "reference":
                    return list(ast.walk(item))
    return []


def mutants(source: str, entry_class: str) -> Iterator[tuple[str, str]]:
    """(what changed, mutated source) for each mutation of the reference, at most ``MAX_MUTANTS``."""
    tree = ast.parse(source)
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
            made += 1
            yield what, ast.unparse(mutated)


async def measure(original: BoxedEnvironment, keys: Sequence[tuple[int, int]]) -> Coverage:
    """Run each mutant's reference on ``keys`` and judge its answers with the original verifier."""
    package = original.package
    m = package.manifest
    answers = {k: await original.reference(*k) for k in keys}
    source = package.files[m.entry_file].decode("utf-8", errors="replace")
    made = differing = killed = 0
    survivors: list[str] = []
    for what, mutated in mutants(source, m.entry_class):
        made += 1
        variant = dataclasses.replace(package, files={**package.files, m.entry_file: mutated.encode()})
        env = original.variant(variant)
        differs = caught = False
        for k in keys:
            try:
                answer = await env.reference(*k)
            except ContributedError:
                continue
            if answer.strip() == answers[k].strip():
                continue
            differs = True
            if not (await original.verify(*k, answer)).passed:
                caught = True
                break
        differing += differs
        killed += caught
        if differs and not caught:
            survivors.append(what)
    return Coverage(made, differing, killed, tuple(survivors))


def coverage_findings(coverage: Coverage) -> list[Finding]:
    """A surviving mutant is a wrong answer the verifier accepted: one finding each."""
    return [Finding("check_mutants", f"a reference mutated at {what} gave a different answer and the verifier "
                    f"passed it ({coverage.killed} of {coverage.differing} differing mutants rejected)",
                    "check the whole answer against the hidden data, not part of it or its form")
            for what in coverage.survivors]
