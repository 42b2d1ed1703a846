"""The escapes' attack programs are files that lint reads and the box is handed, and the values of a run
enter them as literals, never as code.

No box here: what runs in one is ``test_escapes_library.py``'s.
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path
from textwrap import indent

import pytest
import setuptools

from farmd.envs.base import Task
from farmd.intake import escapes
from farmd.intake.escapes import PAYLOAD_LINE, Marker, for_kind, given, payload, payload_of

ROOT = Path(__file__).resolve().parents[2]
FORMS = ("python", "kernel")
KINDS = {"python": "function", "kernel": "kernel"}
RUFF = Path(sys.executable).parent / "ruff"


def _modules(form: str) -> list[str]:
    return sorted(f.name.removesuffix(".py") for f in resources.files(f"farmd.intake.escapes.{form}").iterdir()
                  if f.name.endswith(".py") and f.name != "__init__.py")


def _program(kind: str, name: str, marker: Marker, task: Task | None = None) -> str:
    escape = next(e for e in for_kind(kind) if e.name == name)
    return escape.make(task or Task("e", "1", 1, 1, "p"), marker).final


@pytest.mark.parametrize("form", FORMS)
def test_every_escape_has_a_module_of_each_form_and_every_module_is_one(form: str) -> None:
    names = {e.name.replace("-", "_") for e in for_kind(KINDS[form])}
    assert set(_modules(form)) == names | {"prelude"}


@pytest.mark.parametrize("form", FORMS)
def test_the_box_is_handed_each_module_from_its_payload_line_on_and_nothing_above(form: str) -> None:
    marker = Marker("0123456789abcdef" * 2)
    prelude = payload(form, "prelude")
    for name in _modules(form):
        if name == "prelude":
            continue
        text = (resources.files(f"farmd.intake.escapes.{form}") / f"{name}.py").read_text()
        head, _, body = text.partition(PAYLOAD_LINE)
        program = _program(KINDS[form], name.replace("_", "-"), marker)
        # The program runs inside one function: the texts come indented by its four spaces.
        assert indent(prelude, "    ") in program and indent(body, "    ") in program, name
        # Above the line: the lint-only imports, which the box could not run and must never get.
        assert "farmd.intake.escapes" in head or not body, name
        imported = {a.name for n in ast.walk(ast.parse(program)) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(ast.parse(program)) if isinstance(n, ast.ImportFrom)}
        assert not any(m.startswith("farmd") for m in imported) and "escapes.given" not in program, name


def test_a_module_without_exactly_one_payload_line_is_refused() -> None:
    assert payload_of(f'"""doc"""\n{PAYLOAD_LINE}x = 1\n', "ok.py") == "x = 1\n"
    assert payload_of(PAYLOAD_LINE, "empty.py") == ""
    for text in ("x = 1\n", f"x = 1\n{PAYLOAD_LINE}y = 2\n{PAYLOAD_LINE}", f"x = 1  {PAYLOAD_LINE}",
                 PAYLOAD_LINE.rstrip("\n")):
        with pytest.raises(ValueError, match="exactly once"):
            payload_of(text, "bad.py")


def test_given_declares_exactly_the_names_a_program_is_given() -> None:
    marker = Marker("0123456789abcdef", canary_port=5, farm_port=6, data_dir="/d")
    declared = set(given.__annotations__)
    for kind in ("function", "kernel"):
        program = ast.parse(_program(kind, "leave-files", marker))
        wrapper = next(n for n in program.body if isinstance(n, ast.FunctionDef) and n.name == "_farm_redteam")
        assigned = set()
        for node in wrapper.body:
            if not isinstance(node, ast.Assign):
                break
            assigned |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        assert assigned <= declared, kind
        assert declared - assigned == ({"COMMANDS"} if kind == "function" else set()), kind


_HOSTILE_DIRS = ["/srv/x'''\nimport os; os.system('touch /tmp/pwned')\n'''", '/srv/"; rm -rf / #',
                 "/srv/$(id)`id`\\n\\x00{NONCE}%s", "/srv/\u202eevil\u2028next"]


@pytest.mark.parametrize("data_dir", _HOSTILE_DIRS)
def test_a_runs_values_enter_programs_as_literals_and_commands_as_words(data_dir: str) -> None:
    """The data directory is a host path farmd knows, not the attacker's; still, whatever it holds stays one
    literal in a program (read back equal, one statement) and one word in a shell command."""
    marker = Marker("0123456789abcdef", canary_port=1, farm_port=2, data_dir=data_dir)
    task = Task("e", "1", 1, 1, "p", entry_point="solve")
    for kind in ("function", "kernel"):
        for escape in for_kind(kind):
            tree = ast.parse(escape.make(task, marker).final)
            wrapper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_farm_redteam")
            values = {t.id: ast.literal_eval(n.value) for n in wrapper.body if isinstance(n, ast.Assign)
                      for t in n.targets if isinstance(t, ast.Name) and t.id in given.__annotations__}
            assert values["DATA_DIR"] == data_dir and values["NONCE"] == marker.nonce, escape.name
            assert not any(isinstance(n, ast.Expr) for n in wrapper.body[:len(values)]), escape.name
    for escape in for_kind("shell"):
        attempt = escape.make(task, marker)
        *commands, script = attempt.actions
        assert shlex.split(script)[:2] == ["python3", "-c"] and len(shlex.split(script)) == 3, escape.name
        ast.parse(shlex.split(script)[2])
        for command in commands:
            assert shlex.split(command)[:6] == ["timeout", "-s", "KILL", f"{escapes.BUDGET_S:g}", "sh", "-c"]
            assert len(shlex.split(command)) == 7, escape.name


@pytest.mark.parametrize("form", FORMS)
def test_ruff_reads_every_payload_module_with_the_projects_rules(form: str) -> None:
    """A payload is linted where it lives: a name it never defines is an error there, as anywhere in farmd."""
    for name in _modules(form):
        path = f"farmd/intake/escapes/{form}/{name}.py"
        text = (ROOT / path).read_text() + "\n\ndef _probe():\n    return undefined_in_payload\n"
        run = subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise", "--stdin-filename",
                              path, "-"], input=text, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert "F821" in run.stdout and "undefined_in_payload" in run.stdout, (path, run.stdout, run.stderr)
        clean = subprocess.run([str(RUFF), "check", "--no-cache", path], capture_output=True, text=True, cwd=ROOT,
                               timeout=60)
        assert clean.returncode == 0, (path, clean.stdout)


def test_mypy_reads_the_payload_modules_and_checks_their_bodies() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "farmd" in config["files"]
    assert not any(p.startswith("farmd") for p in config.get("exclude", []))
    for override in config.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        if any(m.startswith("farmd.intake.escapes") for m in modules):
            assert not override.get("ignore_errors") and override.get("check_untyped_defs", True), modules


def test_an_installed_farmd_carries_the_payload_modules() -> None:
    """Setuptools' own discovery, with the project's settings, ships both payload packages."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = {p for where in find["where"]
             for p in setuptools.find_packages(where=str(ROOT / where), include=find["include"])}
    assert {"farmd.intake.escapes", "farmd.intake.escapes.python", "farmd.intake.escapes.kernel"} <= found
