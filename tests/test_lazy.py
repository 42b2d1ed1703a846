"""Modules only some of farmd's work uses are not imported by its start: each costs every farmd (about 150 of them
start in a suite) its import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farmd import lazy


def _fresh(code: str, *path: Path) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                          env={"PYTHONPATH": ":".join(map(str, (*path, *sys.path)))}).stdout


def test_a_lazy_module_is_imported_at_its_first_attribute() -> None:
    out = _fresh("import sys\nfrom farmd import lazy\nm = lazy.module('colorsys')\n"
                 "before = 'colorsys' in sys.modules\nhsv = m.rgb_to_hsv(1.0, 0.0, 0.0)\n"
                 "print(before, 'colorsys' in sys.modules, hsv, lazy.module('colorsys') is sys.modules['colorsys'])")
    assert out.split() == ["False", "True", "(0.0,", "1.0,", "1.0)", "True"], out
    assert lazy.module("json") is json, "a module imported already is itself"
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        lazy.module("no_such_module_here")


def test_threads_reading_a_lazy_module_at_once_each_find_it_whole(tmp_path: Path) -> None:
    """A slow import, read by eight threads at once: each waits for the module to be made (importlib's
    LazyLoader, on 3.11, handed the others a module still being made: AttributeError)."""
    (tmp_path / "slow_module_here.py").write_text("import time\ntime.sleep(0.3)\nDONE = 'whole'\n")
    out = _fresh("import threading\nfrom farmd import lazy\nm = lazy.module('slow_module_here')\nseen = []\n"
                 "def read():\n    try:\n        seen.append(m.DONE)\n    except AttributeError as exc:\n"
                 "        seen.append(type(exc).__name__)\n"
                 "threads = [threading.Thread(target=read) for _ in range(8)]\n"
                 "[t.start() for t in threads]\n[t.join() for t in threads]\nprint(sorted(set(seen)))", tmp_path)
    assert out.strip() == "['whole']", out


def test_farmds_start_imports_no_endpoint_client_array_library_or_postgresql_driver() -> None:
    out = _fresh("import sys, farmd.daemon, farmd.cli.farmd_main\n"
                 "print(sorted(m for m in ('numpy', 'asyncpg', 'httpx') if m in sys.modules))")
    assert out.strip() == "[]"
