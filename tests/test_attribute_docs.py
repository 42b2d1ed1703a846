"""An attribute's docstring sits right under that attribute: two string statements in a row mean one of them
was written under the wrong attribute (or lost its own), which readers and editors then believe."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import farmd

REPO = Path(farmd.__file__).parent.parent
TREES = ("farmd", "clients", "bench", "tests")
"""Every tree of the house's own Python: a bench's or a test's attribute is read as closely as farmd's."""


def _stacked(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for before, after in itertools.pairwise(body):
            if _is_string(before) and _is_string(after):
                lines.append(after.lineno)
    return lines


def _is_string(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def test_the_check_finds_a_docstring_stacked_under_another() -> None:
    source = 'class C:\n    a: int = 1\n    b: int = 2\n    """of a"""\n    """of b"""\n'
    assert _stacked(ast.parse(source)) == [5]


def test_no_attribute_docstring_is_stacked_under_another() -> None:
    paths = sorted(path for tree in TREES for path in (REPO / tree).rglob("*.py"))
    assert len(paths) > 100
    found = [f"{path.relative_to(REPO)}:{line}" for path in paths for line in _stacked(ast.parse(path.read_text()))]
    assert not found, f"docstrings stacked under one attribute (move each under its own): {found}"
