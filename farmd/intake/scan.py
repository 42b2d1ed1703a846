"""Tier 1's static scan: what a contributed environment's source shows of a verifier that cannot be
sound, before any of it runs. Each smell is a finding a contributor can act on; a smell is evidence, not
proof, so it is a note (``blocking`` False) that tier 2's attacks and the reviewer weigh: what rejects a
version is an attack that works. The scan looks for shapes that are almost never right:

- ``verify`` returns the same verdict whatever it is given (no ``return`` depends on anything);
- a verdict read from printed output (``"PASS" in stdout``): whatever the submission prints, it passes;
- a handler that catches every exception and passes the attempt: a crash becomes a reward;
- files named outside the environment's own (absolute paths, ``..``), or the process environment.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator

from farmd import syntax
from farmd.intake.checks import Finding
from farmd.intake.package import Package

_VERDICT_WORDS = {"PASS", "PASSED", "OK", "SUCCESS", "CORRECT", "ACCEPTED"}
_OWN_PREFIXES = ("env/", "./")


def _functions(tree: ast.AST, name: str) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            yield node


def _where(path: str, node: ast.AST) -> str:
    return f"{path}:{getattr(node, 'lineno', 0)}"


def _is_pass(value: ast.expr | None) -> bool:
    """A literal verdict of success: ``True``, ``1``/``1.0`` or a dict with ``"passed": True``/``"reward": 1``."""
    if isinstance(value, ast.Constant):
        return value.value is True or (type(value.value) in (int, float) and value.value == 1)
    if isinstance(value, ast.Dict):
        for key, item in zip(value.keys, value.values, strict=True):
            if isinstance(key, ast.Constant) and key.value in ("passed", "reward") and _is_pass(item):
                return True
    return False


def _literal(value: ast.expr | None) -> bool:
    """Whether ``value`` depends on nothing: constants, and dicts and lists of them."""
    return value is not None and not any(isinstance(n, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
                                         for n in ast.walk(value))


def _constant_verdict(path: str, tree: ast.AST) -> list[Finding]:
    found = []
    for fn in _functions(tree, "verify"):
        returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
        if returns and all(_literal(r.value) for r in returns) and any(_is_pass(r.value) for r in returns):
            found.append(Finding("scan_constant_verdict", f"{_where(path, fn)}: every return of verify is a literal "
                                 "and one of them passes", "compute the verdict from the submission and the "
                                 "task's hidden data"))
    return found


def _stdout_verdict(path: str, tree: ast.AST) -> list[Finding]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn | ast.Eq) for op in node.ops):
            parts = [node.left, *node.comparators]
            words = [p for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)
                     and p.value.strip().upper() in _VERDICT_WORDS]
            names = {n.id.lower() if isinstance(n, ast.Name) else n.attr.lower()
                     for p in parts for n in ast.walk(p) if isinstance(n, ast.Name | ast.Attribute)}
            if words and names & {"stdout", "output", "out", "printed", "log"}:
                found.append(Finding("scan_stdout_verdict", f"{_where(path, node)}: a verdict read from printed "
                                     f"output ({words[0].value!r})", "judge values the submission returns, "
                                     "never text it prints: it can print anything"))
    return found


def _broad_except_pass(path: str, tree: ast.AST) -> list[Finding]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler):
            continue
        broad = node.type is None or (isinstance(node.type, ast.Name) and node.type.id in ("Exception", "BaseException"))
        passes = any(isinstance(n, ast.Return) and _is_pass(n.value) for n in ast.walk(node)) or any(
            isinstance(n, ast.Assign) and _is_pass(n.value) for n in ast.walk(node))
        if broad and passes:
            found.append(Finding("scan_exception_passes", f"{_where(path, node)}: an exception the attempt causes "
                                 "is scored as a pass", "score a crash, a timeout or any error as a failure"))
    return found


def _outside_files(path: str, tree: ast.AST) -> list[Finding]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if (text.startswith("/") and len(text) > 1 and "\n" not in text and " " not in text) or "../" in text:
                found.append(Finding("scan_outside_files", f"{_where(path, node)}: names {text[:80]!r}, outside the "
                                     "environment's own files", "read only files the submission holds, by "
                                     "relative path"))
        elif isinstance(node, ast.Attribute) and node.attr == "environ":
            found.append(Finding("scan_outside_files", f"{_where(path, node)}: reads the process environment",
                                 "take nothing from the environment: everything a task needs comes from its seed"))
    return found


def scan_package(package: Package) -> list[Finding]:
    """Every smell in the package's Python files (a file that does not parse is a finding too)."""
    found: list[Finding] = []
    for path, data in sorted(package.files.items()):
        if not path.endswith(".py"):
            continue
        try:
            tree = syntax.parse(data.decode("utf-8", errors="replace"), filename=path)
        except SyntaxError as exc:
            found.append(Finding("scan_parses", f"{path}:{exc.lineno}: {exc.msg}", "submit Python that parses"))
            continue
        for check in (_constant_verdict, _stdout_verdict, _broad_except_pass, _outside_files):
            found += [dataclasses.replace(f, blocking=False) for f in check(path, tree)]
    return found
