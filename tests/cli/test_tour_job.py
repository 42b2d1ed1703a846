"""``make tour``, small: a farmd starts, a mixed workload over every environment runs, the data dir stays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farmd.envs import names
from tests.conftest import farmctl

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


def test_the_tour_runs_every_environment_and_leaves_its_data(tmp_path: Path) -> None:
    data = tmp_path / "farm-data"
    proc = subprocess.run([sys.executable, "-m", "farmd.cli.tour_job", "--data", str(data), "--scale", "0.1",
                           "--waves", "2"], capture_output=True, timeout=300)
    out = proc.stdout.decode()
    assert proc.returncode == 0, out[-3000:] + proc.stderr.decode()[-3000:]
    assert "farmctl status" in out and "isolation: yes" in out and "0 failed" in out
    assert not (data / "farmd.json").exists(), "farmd was stopped"
    export = tmp_path / "all.jsonl"
    farmctl("export", "--format", "jsonl", "--out", str(export), "--data", str(data))
    records = [json.loads(line) for line in export.read_text().splitlines()]
    assert {r["env"] for r in records} == set(names())
    assert {r["agent"] for r in records} == {"reference", "random", "skilled:3"}
    assert all(r["passed"] for r in records if r["agent"] == "reference")
    # A random guess is a wrong answer of the right kind, so now and then it is the right one (a number in -9..99
    # for arith), and then for the whole group, which poses one task to the same deterministic guesser: a lucky
    # task, never a control that passes.
    guessed = {(r["env"], r["seed"], r["difficulty"]) for r in records if r["agent"] == "random"}
    lucky = {(r["env"], r["seed"], r["difficulty"]) for r in records if r["agent"] == "random" and r["passed"]}
    assert len(lucky) <= max(1, len(guessed) // 8), f"random guesses passed {len(lucky)} of {len(guessed)} tasks"
    assert len(records) == len({r["id"] for r in records}) == 4 * 4 * len(names())  # 3 agents, then 1
