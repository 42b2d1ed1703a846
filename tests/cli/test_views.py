"""What farmctl shows a person, fed hostile names, details and outputs: escaped, never markup, never raw."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from farmd.cli.common import console, emit_json, fail, run_async
from farmd.cli.env_cmd import _print_audit
from farmd.cli.status_view import status_view
from tests.cli.hostile import HOSTILE, SHOWN, assert_shown_safely
from tests.conftest import farmctl


def hostile_status() -> dict[str, Any]:
    """A Status reply in which everything a client, a node or an environment could name is hostile."""
    return {
        "version": HOSTILE, "node": HOSTILE, "uptime_s": 12.0, "policy_version": 3, "workers": 2, "max_boxes": 6,
        "isolation_ok": False, "isolation": [{"name": HOSTILE, "ok": False, "detail": HOSTILE, "fix": HOSTILE}],
        "queue": {"queued": 1, "leased": 0, "done": 4, "failed": 0}, "throughput_per_s": 0.5,
        "pass_rates": [{"env": HOSTILE, "difficulty": 2, "trajectories": 4, "passed": 1, "mean_reward": 0.25,
                        "errors": 0}],
        "bank": {"envs": {HOSTILE: {"tasks": 3, "level": 2, "in_band": 1, "band_occupancy": 0.5,
                                    "informative_fraction": 0.25, "retired": 0}}},
        "consumers": [{"name": HOSTILE, "whole_groups": True, "cursor": 4, "lag": 0, "streams": 1, "state": HOSTILE,
                       "acked_at": 1.0},
                      {"name": "grpo", "whole_groups": False, "cursor": 2, "lag": 2, "streams": 0, "state": "closed",
                       "acked_at": None}],
        "last_seq": 4,
    }


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    # Wide enough that no table wraps a cell, so the escaped text can be found whole.
    monkeypatch.setenv("COLUMNS", "400")


def test_the_status_view_escapes_everything_it_was_sent(capsys: pytest.CaptureFixture[str]) -> None:
    out = console()
    for part in status_view(hostile_status(), HOSTILE):
        out.print(part)
    shown = capsys.readouterr().out
    assert_shown_safely(shown)
    # version, node, addr, check name and detail, env in both tables, the consumer and its state
    assert shown.count(SHOWN) == 9, shown
    assert f"{SHOWN} (whole groups)" in shown


def test_consumers_from_an_older_farmd_are_shown_too(capsys: pytest.CaptureFixture[str]) -> None:
    info = {**hostile_status(), "consumers": {HOSTILE: 4, "grpo": 2}}
    out = console()
    for part in status_view(info, "127.0.0.1:7431"):
        out.print(part)
    shown = capsys.readouterr().out
    assert_shown_safely(shown)
    assert shown.count(SHOWN) == 7 and "grpo" in shown


def test_an_error_message_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        fail(f"127.0.0.1:1: INVALID_ARGUMENT: {HOSTILE}", 1)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert_shown_safely(err)
    assert err.startswith("error: 127.0.0.1:1: INVALID_ARGUMENT: ")


def test_an_audit_report_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    report = {"env": HOSTILE, "verifier_version": HOSTILE, "seeds_per_level": 1, "levels": 2,
              "recall": {"passed": 2, "total": 2, "rate": 1.0},
              "precision": {"rate": 1.0, "true_positives": 2, "false_positives": 0},
              "exploits": [{"name": HOSTILE, "attempts": 2, "rewarded": 0, "flagged": 1, "description": HOSTILE}]}
    _print_audit(report)
    shown = capsys.readouterr().out
    assert_shown_safely(shown)
    assert shown.count(SHOWN) == 4


def test_doctor_and_errors_escape_what_the_config_names(tmp_path: Path) -> None:
    # The detail of a failed check quotes the configured path: `[/farm]` in it once crashed doctor.
    python = tmp_path / HOSTILE
    cfg = tmp_path / "farm.toml"
    cfg.write_text(f"[sandbox]\nbox_python = {json.dumps(str(python))}\n")  # JSON's escapes are TOML's
    env = {**os.environ, "COLUMNS": "400"}
    doctor = farmctl("--config", str(cfg), "doctor", "--no-trial", check=False, env=env)
    assert doctor.returncode == 1, doctor.stderr
    assert_shown_safely(doctor.stdout)
    assert b"farmd will refuse to run untrusted code on this host" in doctor.stdout
    refused = farmctl("--config", str(cfg), "sandbox", "run", "--", "true", check=False, env=env)
    assert refused.returncode == 3
    assert_shown_safely(refused.stderr)


@pytest.mark.sandbox
def test_sandbox_demo_shows_what_a_box_printed_escaped() -> None:
    from rich.console import Console

    from farmd.cli.sandbox_demo import _demo

    buffer = io.StringIO()
    held = run_async(_demo(Console(file=buffer, width=400, highlight=False),
                           [("printer", "prints escapes", f"import sys; sys.stdout.write({HOSTILE!r})")]))
    assert held == 1
    assert_shown_safely(buffer.getvalue())


def test_json_output_stays_exact(capsys: pytest.CaptureFixture[str]) -> None:
    # Only what a person reads is escaped: --json keeps every character (JSON escapes them itself).
    emit_json({"name": HOSTILE})
    out = capsys.readouterr().out
    assert "\x1b" not in out and json.loads(out) == {"name": HOSTILE}
