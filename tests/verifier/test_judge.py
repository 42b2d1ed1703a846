"""The judge's protocol, run for real in a box: what the submission can and cannot reach."""

from __future__ import annotations

import json
import os
import time

import pytest

from farmd.sandbox import BoxResult, Sandbox, SandboxPolicy
from farmd.verifier.boxjudge import opening_verdict, run_judge
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


# -- what comes out of the box is bounded and checked before it is used ------------------------------

def _forger(head: bytes, at_import: bool = True) -> str:
    """A kernel whose process writes a forged answer frame with header ``head`` into every descriptor."""
    forge = (
        "import os\n"
        f"HEAD = {head!r}\n"
        "FRAME = len(HEAD).to_bytes(4, 'big') + (0).to_bytes(4, 'big') + HEAD\n"
        "def forge():\n"
        "    for fd in range(3, 32):\n"
        "        try:\n"
        "            view = memoryview(FRAME)\n"
        "            while view:\n"
        "                view = view[os.write(fd, view):]\n"
        "        except OSError:\n"
        "            pass\n"
    )
    return forge + ("forge()\ndef kernel(x):\n    return x\n" if at_import else
                    "def kernel(x):\n    forge()\n    return x\n")


def array_spec(n: int = 2) -> dict[str, object]:
    return {"nonce": "n0nce-for-test", "mode": "array", "entry_point": "kernel", "per_call_s": 5.0,
            "tests": [{"id": i, "arrays": [["<f4", [4]]], "blob": "x.bin"} for i in range(n)]}


FORGED = {
    "a shape of a million lists": b'{"id": 0, "ok": true, "dtype": "<f4", "shape": [' + b"[], " * 1_000_000 + b"[]]}",
    "a header nested too deeply": b"[" * 200_000 + b"]" * 200_000,
    "a shape that is a string": b'{"id": 0, "ok": true, "dtype": "<f4", "shape": "4"}',
    "a shape that does not fit the data": b'{"id": 0, "ok": true, "dtype": "<f4", "shape": [4000]}',
    "an object dtype": b'{"id": 0, "ok": true, "dtype": "|O", "shape": [0]}',
    "a dtype numpy does not know": b'{"id": 0, "ok": true, "dtype": "<q9", "shape": [0]}',
    "an id that is not an int": b'{"id": true, "ok": true, "dtype": "<f4", "shape": [0]}',
    "an error that is not text": b'{"id": 0, "ok": false, "error": [[[[1]]]]}',
    "not an object": b"[1, 2, 3]",
}


@pytest.mark.parametrize("name", sorted(FORGED))
async def test_a_forged_answer_is_garbled_and_never_reaches_the_host(name: str) -> None:
    import numpy as np

    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, _forger(FORGED[name]), array_spec(), SandboxPolicy(wall_time_s=20, memory_mb=1024),
                                 blobs={"x.bin": np.zeros(4, dtype=np.float32).tobytes()})
    assert report.done, report.box.stderr[-300:]
    assert report.outcomes[0].lost == "garbled", report.outcomes.get(0)
    assert max(len(line) for line in report.box.stdout.splitlines()) < 10_000


async def test_a_forged_value_too_long_is_a_failed_test() -> None:
    record = json.dumps({"id": 0, "ok": True, "value": json.dumps("x" * 1_200_000)}).encode()
    source = _forger(record).replace("def kernel(x):\n    return x\n", "def f(i):\n    return i\n")
    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, source, spec(2), POLICY)
    assert report.done and not report.outcomes[0].ok
    assert "longer than" in (report.outcomes[0].error or "")


def _box(stdout: bytes) -> BoxResult:
    return BoxResult(exit_code=0, signal=None, timed_out=False, oom=False, output_truncated=False, stdout=stdout,
                     stderr=b"", wall_s=0.1, cpu_s=0.1, max_rss_mb=10.0)


def test_a_report_of_garbage_is_read_without_a_raise() -> None:
    from farmd.verifier.boxjudge import MAX_RECORD_BYTES, parse_report

    nonce = b"FARM n0nce-for-test "
    lines = [
        b"garbage \xff\xfe" * 1000,
        nonce + b"not json",
        nonce + b"[" * 100_000,
        nonce + b'{"kind": "result", "id": 0, "ok": true, "value": "' + b"1" * (MAX_RECORD_BYTES + 10) + b'"}',
        nonce + b'{"kind": "result", "id": "0", "ok": true, "seconds": 0.1}',
        nonce + b'{"kind": "result", "id": 0, "ok": true, "seconds": "fast"}',
        nonce + b'{"kind": "result", "id": 0, "ok": true, "seconds": NaN}',
        nonce + b'{"kind": "result", "id": 0, "ok": "yes", "seconds": 0.1}',
        nonce + b'{"kind": "result", "id": 0, "ok": true, "seconds": 0.1, "shape": [[]]}',
        nonce + b'{"kind": "result", "id": 0, "ok": false, "seconds": 0.1, "error": ["not", "text"]}',
        nonce + b'{"kind": "result", "id": 0, "ok": false, "seconds": 0.1, "error": "\\ud800 lone"}',
        nonce + b'{"kind": "lost", "id": 1, "why": {"a": 1}}',
        nonce + b'{"kind": "lost", "id": 1, "why": "exited \\udfff"}',
        nonce + b'{"kind": "import_error", "error": 12}',
        nonce + b'{"kind": "who knows"}',
        nonce + b'{"kind": "done", "status": "0", "log": "x"}',
        nonce + b'{"kind": "done", "status": 0, "log": "\\udc80 the log"}',
    ]
    report = parse_report(_box(b"\n".join(lines)), spec(30))
    assert report.anomalies and report.done
    assert report.outcomes[0].error == "\ufffd lone" and report.outcomes[1].lost == "exited \ufffd"
    assert report.agent_log == "\ufffd the log"
    for text in [report.agent_log, *report.anomalies, *(o.error or "" for o in report.outcomes.values())]:
        text.encode("utf-8")  # valid text, every string of it
    verdict, _ = opening_verdict("1", report)
    assert verdict.status == "ok" and not verdict.passed and "suspected_hack" in verdict.flags
    flood = parse_report(_box(b"\n".join([nonce + b'{"kind": "who knows"}'] * 100_000)), spec(2))
    assert flood.anomalies[-1] == "the judge wrote more than 6 records" and len(flood.anomalies) == 7


@pytest.mark.clocked
def test_a_record_line_is_bounded_before_it_is_parsed() -> None:
    from farmd.verifier.boxjudge import parse_report

    huge = b'FARM n0nce-for-test {"kind": "result", "id": 0, "ok": true, "seconds": 0.1, "dtype": "<f4", "shape": [' \
        + b"[], " * 3_000_000 + b"[]]}\n"
    started = time.perf_counter()
    report = parse_report(_box(huge), spec(2))
    assert time.perf_counter() - started < 0.5
    assert 0 not in report.outcomes and report.anomalies
