"""Modules only some of farmd's work uses are not imported by its start: each costs every farmd (about 150 of them
start in a suite) its import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from farmd import lazy


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout


def test_a_lazy_module_is_imported_at_its_first_attribute() -> None:
    out = _fresh("import sys, types\nfrom farmd import lazy\nm = lazy.module('colorsys')\n"
                 "before = type(m) is types.ModuleType\nhsv = m.rgb_to_hsv(1.0, 0.0, 0.0)\n"
                 "print(before, type(m) is types.ModuleType, hsv, lazy.module('colorsys') is m)")
    assert out.split() == ["False", "True", "(0.0,", "1.0,", "1.0)", "True"], out
    assert lazy.module("json") is json, "a module loaded already is itself"
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        lazy.module("no_such_module_here")


def test_farmds_start_imports_no_endpoint_client_array_library_or_postgresql_driver() -> None:
    out = _fresh("import sys, farmd.daemon, farmd.cli.farmd_main\n"
                 "print(sorted(m for m in ('numpy', 'asyncpg', 'httpx._client') if m in sys.modules))")
    assert out.strip() == "[]"
