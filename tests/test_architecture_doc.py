"""docs/architecture.md's arrows are the import-linter floors of pyproject.toml, and both name every farmd
package: a package left out of either is one whose arrows nobody checks or nobody reads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import farmd

ROOT = Path(__file__).resolve().parent.parent


def _packages() -> set[str]:
    here = Path(farmd.__file__).parent
    return {f"farmd.{p.parent.name}" for p in here.glob("*/__init__.py")}


def _floors() -> list[set[str]]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    return [{name.strip() for name in floor.split("|")} for floor in layers]


def _drawn() -> list[set[str]]:
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## The arrows", 1)[1]
    block = section.split("```", 2)[1]
    return [set(re.findall(r"farmd\.\w+", line)) for line in block.splitlines() if line.startswith("farmd.")]


def test_every_package_is_on_a_checked_floor() -> None:
    on_floors = set().union(*_floors())
    assert len(_packages()) >= 13
    assert _packages() <= on_floors, sorted(_packages() - on_floors)


def test_the_page_draws_the_floors_the_lint_checks() -> None:
    assert _drawn() == _floors()
