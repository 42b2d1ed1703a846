"""The host checks of ``farmctl redteam``, each shown to find what it looks for: a leftover file, process
or cgroup-like directory named with the run's nonce, a connection to the canary, a secret in a record."""

from __future__ import annotations

import secrets
import socket
import subprocess
from pathlib import Path

from farmd.cli.redteam_cmd import _report
from farmd.cli.redteam_host import Canary, leftovers, secrets_in


def test_leftovers_are_found_by_their_nonce(tmp_path: Path) -> None:
    nonce = secrets.token_hex(8)
    assert leftovers(nonce, [tmp_path]) == []
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / f"farm-redteam-{nonce}-file").write_text("x")
    proc = subprocess.Popen(["bash", "-c", f"exec -a farm-redteam-{nonce}-proc sleep 30"])
    try:
        found = {(b.what, b.evidence.split(":")[0]) for b in leftovers(nonce, [tmp_path])}
    finally:
        proc.kill()
        proc.wait()
    assert ("file", str(tmp_path / "deep" / "er" / f"farm-redteam-{nonce}-file")) in found
    assert ("process", f"pid {proc.pid}") in found


def test_the_canary_counts_every_connection() -> None:
    canary = Canary()
    with socket.create_connection(("127.0.0.1", canary.port), timeout=2):
        pass
    breaches = canary.close()
    assert len(breaches) == 1 and breaches[0].what == "connection"


def test_a_secret_is_found_in_any_form() -> None:
    key = bytes(range(32))
    secrets_ = {"the verifier key": key, "a token": b"tok-123456789"}
    records = [("t1", "nothing here"), ("t2", f"leaked {key.hex()}"), ("t3", "x tok-123456789 y")]
    found = secrets_in(records, secrets_)
    assert {b.evidence for b in found} == {"the verifier key (hex) is in t2", "a token (text) is in t3"}


def test_the_summary_counts_held_breached_and_failed_apart(capsys) -> None:  # type: ignore[no-untyped-def]
    rows = [{"attempt": 1, "env": "py-func", "tried": "exploit x", "agent": "a", "node": "n", "reward": 0.0,
             "flags": ["red_team_exploit"], "result": "held"},
            {"attempt": 2, "env": "py-func", "tried": "exploit y", "agent": "a", "node": "n", "reward": 1.0,
             "flags": ["red_team_exploit"], "result": "breached"},
            {"attempt": None, "env": "py-func", "tried": "escape z", "agent": "a", "node": "", "reward": None,
             "flags": [], "result": "failed"}]
    _report(rows, [], as_json=False)
    out = capsys.readouterr().out
    assert out.strip().endswith("2 attempts, 1 held, 1 breached")
    assert "1 attempts failed" in out
