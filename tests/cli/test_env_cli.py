"""farmctl task show / verify / audit: the contract scripts rely on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import farmctl

VERDICT_KEYS = {"reward", "passed", "status", "reasons", "flags", "verifier_version"}


def test_task_show_contract() -> None:
    task = json.loads(farmctl("task", "show", "--env", "py-func", "--seed", "4", "--difficulty", "2").stdout)
    assert {"env", "seed", "difficulty", "prompt", "entry_point", "examples"} <= task.keys()
    assert (task["env"], task["seed"], task["difficulty"]) == ("py-func", 4, 2)
    kernel = json.loads(farmctl("task", "show", "--env", "kernel", "--seed", "1").stdout)
    assert kernel["difficulty"] == 1 and kernel["entry_point"] == "kernel"


def test_task_show_bad_input() -> None:
    assert farmctl("task", "show", "--env", "nope", "--seed", "1", check=False).returncode == 2
    assert farmctl("task", "show", "--env", "py-func", "--seed", "1", "--difficulty", "9", check=False).returncode == 2
    assert farmctl("verify", "--env", "py-func", "--seed", "1", check=False).returncode == 2  # neither attempt


@pytest.mark.sandbox
def test_verify_contract(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    ref = json.loads(farmctl("verify", "--env", "py-func", "--seed", "4", "--difficulty", "2", "--reference",
                             "--data", data).stdout)
    assert ref.keys() >= VERDICT_KEYS and ref["passed"] is True and ref["reward"] == 1.0 and ref["status"] == "ok"
    assert (tmp_path / "data" / "verifier.key").exists()
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def transform(x):\n    return None\n")
    bad = json.loads(farmctl("verify", "--env", "py-func", "--seed", "4", "--difficulty", "2", "--submission",
                             str(wrong), "--data", data).stdout)
    assert bad["passed"] is False and bad["reward"] == 0.0 and bad["status"] == "ok" and bad["reasons"]


@pytest.mark.sandbox
def test_audit_reports_recall_and_precision(tmp_path: Path) -> None:
    # arith's verifier judges on the host: the command's own work, not a few hundred judge boxes (every
    # exploit against the boxed verifiers is tests/intake/test_exploits.py's).
    out = farmctl("audit", "--env", "arith", "--n", "1", "--json", "--data", str(tmp_path), timeout=300).stdout
    report = json.loads(out)
    assert report["recall"] == {"passed": 5, "total": 5, "rate": 1.0}
    assert report["precision"]["false_positives"] == 0 and report["precision"]["rate"] == 1.0
    assert len(report["exploits"]) >= 20 and all(e["attempts"] == 5 for e in report["exploits"])
    human = farmctl("audit", "--env", "rg:chain_sum", "--n", "1", "--data", str(tmp_path), timeout=300).stdout.decode()
    assert "recall" in human and "precision" in human
