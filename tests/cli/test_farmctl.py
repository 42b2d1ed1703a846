"""farmctl's local commands: the sandbox run contract, doctor, policies, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import box, farmctl

CONTRACT_KEYS = {"exit_code", "signal", "timed_out", "oom", "output_truncated", "stdout", "stderr", "wall_s",
                 "cpu_s", "max_rss_mb", "violations"}


@pytest.mark.sandbox
def test_sandbox_run_prints_the_contract(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.txt").write_text("41")
    res = box("python3", "-c", "n = int(open('data.txt').read()); open('answer.txt', 'w').write(str(n + 1)); "
              "print(n + 1)", files=tmp_path / "in", out=tmp_path / "out", wall_time=5, memory_mb=128)
    assert res.keys() >= CONTRACT_KEYS
    assert res["exit_code"] == 0 and res["signal"] is None and res["stdout"] == "42\n"
    assert isinstance(res["wall_s"], float) and isinstance(res["cpu_s"], float) and res["max_rss_mb"] > 0
    assert (tmp_path / "out" / "answer.txt").read_text() == "42"
    assert res["files_out"] == ["answer.txt", "data.txt"]


@pytest.mark.sandbox
def test_sandbox_run_exits_zero_whatever_the_program_does() -> None:
    res = box("python3", "-c", "raise SystemExit(9)")
    assert res["exit_code"] == 9
    env = box("sh", "-c", "echo $SEED", env="SEED=7")
    assert env["stdout"] == "7\n"


def test_bad_input_is_a_usage_error() -> None:
    for args in (["--wall-time", "-1"], ["--memory-mb", "0"], ["--env", "PATH=/x"], ["--env", "novalue"],
                 ["--policy", "nope"]):
        res = farmctl("sandbox", "run", *args, "--", "true", check=False)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr and not res.stdout
    missing_cmd = farmctl("sandbox", "run", check=False)
    assert missing_cmd.returncode == 2


@pytest.mark.sandbox  # only box python may be missing: every other check must pass on this host
def test_no_isolation_refuses_with_what_is_missing(tmp_path: Path) -> None:
    cfg = tmp_path / "farm.toml"
    cfg.write_text(f'[sandbox]\nbox_python = "{tmp_path}/nope"\n')
    res = farmctl("--config", str(cfg), "sandbox", "run", "--", "true", check=False)
    assert res.returncode == 3
    assert b"refusing to run untrusted code" in res.stderr and b"box python" in res.stderr
    doc = farmctl("--config", str(cfg), "doctor", "--json", check=False)
    assert doc.returncode == 1
    report = json.loads(doc.stdout)
    assert report["ok"] is False
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["box python"]


def test_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "farm.toml"
    cfg.write_text("[sandbox]\nno_such_setting = 1\n")
    res = farmctl("--config", str(cfg), "doctor", check=False)
    assert res.returncode == 2 and b"no_such_setting" in res.stderr
    cfg.write_text("not toml [")
    assert farmctl("--config", str(cfg), "doctor", check=False).returncode == 2


@pytest.mark.sandbox
def test_doctor_passes_here() -> None:
    res = farmctl("doctor", "--json")
    report = json.loads(res.stdout)
    assert report["ok"] is True
    names = [c["name"] for c in report["checks"]]
    assert names[-1] == "trial box" and "seccomp" in names and "cgroups" in names
    human = farmctl("doctor", "--no-trial").stdout.decode()
    assert "every isolation feature is available" in human


def test_policies_listing() -> None:
    data = json.loads(farmctl("sandbox", "policies", "--json").stdout)
    assert data["default"]["memory_mb"] == 512 and "description" in data["tiny"]
