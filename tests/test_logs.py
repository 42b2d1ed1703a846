"""farmd's log lines: text for a person's terminal (escaped, one record a line), JSON for pipelines (exact)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli.hostile import HOSTILE, SHOWN, assert_shown_safely

FORGED = "\n2099-01-01 00:00:00,000 INFO farmd.daemon: farmd stopped"

_PROGRAM = """
import logging, sys
from farmd.logs import setup_logging
setup_logging("info", sys.argv[1])
log = logging.getLogger("farmd.worker")
hostile = sys.argv[2]
log.warning("job %d failed: %s", 7, hostile, extra={"job": 7})
try:
    raise RuntimeError(hostile)
except RuntimeError:
    log.exception("leasing failed")
"""


def logged(fmt: str, message: str) -> str:
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, fmt, message], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.decode("utf-8")


def test_text_logs_escape_what_attempts_and_endpoints_said() -> None:
    out = logged("text", HOSTILE + FORGED)
    assert_shown_safely(out)
    lines = out.splitlines()
    assert not [line for line in lines if line.startswith("2099-")], "a newline in a message forged a log record"
    assert lines[0].endswith(f" WARNING farmd.worker: job 7 failed: {SHOWN}\\x0a{FORGED.strip()}")
    # A traceback keeps its lines, each indented under its record; what the exception said is escaped.
    assert lines[1].endswith(" ERROR farmd.worker: leasing failed")
    assert lines[2].strip() == "Traceback (most recent call last):"
    assert all(line.startswith(" ") for line in lines[2:])
    assert any(line.strip() == f"RuntimeError: {SHOWN}" for line in lines[2:])


def test_json_logs_keep_the_message_exact() -> None:
    out = logged("json", HOSTILE + FORGED)
    warning, error = (json.loads(line) for line in out.splitlines())
    assert warning["msg"] == f"job 7 failed: {HOSTILE}{FORGED}" and warning["job"] == 7
    assert error["msg"] == "leasing failed" and HOSTILE in error["exc"]
    assert "\x1b" not in out
