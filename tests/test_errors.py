"""farm's errors are one hierarchy in one module, and each kind says whether farmd retries it.

Architecture checks, as import-linter's are for arrows: the farmd package is walked, so a new error class
defined anywhere else fails here, not in a review.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import farmd
import farmd.errors
from farmd.errors import EndpointError, FarmError, InfraFailure, PolicyError, SandboxError, TaskError

IN_BOX = {
    "farmd.sandbox.stub": "the box's init",
    "farmd.verifier.judge": "the judge, run in its own box",
    "farmd.intake.env_runner": "a contributed environment's runner, run in its box",
}
"""Modules that run inside a box on the standard library alone: they cannot import ``farmd.errors``, so their
errors are their own (and never cross into farmd but as a box's output)."""


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(farmd.__path__, "farmd."))


def _source(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def _exception_classes(name: str) -> list[type[BaseException]]:
    module = importlib.import_module(name)
    return [kind for kind in vars(module).values()
            if inspect.isclass(kind) and issubclass(kind, BaseException) and kind.__module__ == name]


def test_the_walk_sees_the_whole_package() -> None:
    names = _modules()
    # A walk that found nothing would pass everything below.
    assert {"farmd.errors", "farmd.sandbox.seccomp", "farmd.intake.served", "farmd.api.errors"} <= set(names)
    assert len(names) > 100


def test_every_public_error_class_is_defined_in_farmd_errors() -> None:
    strays = []
    for name in _modules():
        if name == "farmd.errors" or name in IN_BOX:
            continue
        for kind in _exception_classes(name):
            if not kind.__name__.startswith("_"):
                strays.append(f"{name}.{kind.__name__}")
    assert not strays, (f"error classes defined outside farmd/errors.py: {strays}; move them there (under "
                        "FarmError, saying whether they are retried), or name a module's private plumbing _Like_this")


def test_a_private_error_class_never_leaves_its_module() -> None:
    private = {(name, kind.__name__) for name in _modules() if name not in IN_BOX and name != "farmd.errors"
               for kind in _exception_classes(name) if kind.__name__.startswith("_")}
    names = {n for _, n in private}
    leaks = []
    for module in _modules():
        tree = ast.parse(_source(module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name in names for a in node.names):
                leaks.append(f"{module} imports {[a.name for a in node.names if a.name in names]}")
            if isinstance(node, ast.Attribute) and node.attr in names:
                leaks.append(f"{module} uses .{node.attr}")
    assert not leaks, leaks


def test_the_modules_that_keep_their_own_errors_run_in_a_box_and_import_nothing_of_farmd() -> None:
    for name in IN_BOX:
        tree = ast.parse(_source(name).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.split(".")[0] == "farmd"], (name, imported)


def _error_kinds() -> list[type[BaseException]]:
    return _exception_classes("farmd.errors")


def test_every_error_is_a_farm_error_and_listed() -> None:
    kinds = _error_kinds()
    assert len(kinds) >= 40
    for kind in kinds:
        assert issubclass(kind, FarmError), kind
        assert kind.__name__ in farmd.errors.__all__, kind


@pytest.mark.parametrize("kind", _error_kinds(), ids=lambda k: k.__name__)
def test_every_error_kind_declares_whether_it_is_retried(kind: type[FarmError]) -> None:
    assert "retried" in vars(kind), f"{kind.__name__} inherits whether it is retried: declare it"
    assert type(vars(kind)["retried"]) is bool
    doc = kind.__doc__ or ""
    assert re.search(r"\bretried\b", doc, re.IGNORECASE), f"{kind.__name__}'s docstring does not say"


def test_is_retried_follows_the_kind_and_an_errors_own_transient() -> None:
    from farmd.errors import ContributedError, is_retried

    assert is_retried(SandboxError("a box failed")) and is_retried(ContributedError("generate", "crashed"))
    assert not is_retried(PolicyError("a bound out of range")) and not is_retried(TaskError("unknown env"))
    assert is_retried(InfraFailure("x")) and not is_retried(InfraFailure("x", transient=False))
    assert not is_retried(EndpointError("400", status=400, transient=False))
    assert is_retried(KeyError("a bug"))  # a bug says nothing: retried up to the job's attempts
