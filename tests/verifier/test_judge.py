"""The judge's protocol, run for real in a box: what the submission can and cannot reach."""

from __future__ import annotations

import json
import os

import pytest

from farmd.sandbox import Sandbox, SandboxPolicy
from farmd.verifier.boxjudge import run_judge
from farmd.verifier.canon import parse_claim
from tests.conftest import processes_with

pytestmark = pytest.mark.sandbox

POLICY = SandboxPolicy(wall_time_s=20, memory_mb=256, output_kb=4096)


def spec(n: int = 2, nonce: str = "n0nce-for-test") -> dict[str, object]:
    return {"nonce": nonce, "mode": "call", "entry_point": "f", "per_call_s": 3.0,
            "tests": [{"id": i, "args": [i]} for i in range(n)]}


async def test_the_submission_sees_no_spec_no_nonce_and_no_judge_memory() -> None:
    probe = """
import os, json
def f(i):
    seen = {"spec_dir": os.path.exists('/box/.judge'), "argv": open('/proc/%d/cmdline' % os.getppid(), 'rb').read().decode(errors='replace')}
    try:
        open('/proc/%d/mem' % os.getppid(), 'rb')
        seen["judge_memory"] = "readable"
    except OSError as exc:
        seen["judge_memory"] = exc.errno
    return json.dumps(seen)
"""
    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, probe, spec(1), POLICY)
    assert report.done and report.outcomes[0].ok
    seen = json.loads(parse_claim(report.outcomes[0].value or ""))
    assert seen["spec_dir"] is False
    assert "n0nce" not in seen["argv"]
    assert seen["judge_memory"] != "readable"


async def test_the_submission_cannot_write_the_box_stdout() -> None:
    marker = "printed-by-the-submission"
    source = f"import sys, os\nprint('{marker}')\nos.write(1, b'{marker}')\ndef f(i):\n    print('{marker}')\n    return i\n"
    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, source, spec(2), POLICY)
    assert report.done and all(o.ok for o in report.outcomes.values())
    lines = report.box.stdout.decode().splitlines()
    assert lines and all(line.startswith("FARM n0nce-for-test ") for line in lines)
    records = [json.loads(line.split(" ", 2)[2]) for line in lines]
    assert all(marker not in json.dumps({k: v for k, v in r.items() if k != "log"}) for r in records)
    assert marker in report.agent_log  # the submission's output is kept for people, never parsed


async def test_only_nonce_lines_count_and_duplicates_are_anomalies() -> None:
    from farmd.verifier.boxjudge import parse_report

    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, "def f(i):\n    return i * 2\n", spec(3), POLICY)
    assert [parse_claim(report.outcomes[i].value or "") for i in range(3)] == [0, 2, 4]
    forged = report.box
    forged.stdout = forged.stdout + b'FARM wrong-nonce {"kind": "result", "id": 0, "ok": true, "value": "99"}\n'
    again = parse_report(forged, spec(3))
    assert [parse_claim(again.outcomes[i].value or "") for i in range(3)] == [0, 2, 4]
    duplicated = report.box.stdout + report.box.stdout
    report.box.stdout = duplicated
    assert parse_report(report.box, spec(3)).anomalies


async def test_whatever_the_submission_leaves_running_dies_before_the_verdict() -> None:
    marker = f"judge-daemon-{os.getpid()}"
    source = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "600", "{marker}"])
    os._exit(0)
def f(i):
    return i
"""
    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, source, spec(1), POLICY)
    assert report.done
    assert processes_with(marker) == []
