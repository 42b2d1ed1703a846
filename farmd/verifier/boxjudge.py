"""Running the judge in a fresh box and reading what its recorder said.

The box receives only the declared artifacts: the submission, the judge and its
spec (test inputs, a nonce). Expected outputs stay on the host. Only lines carrying
the nonce are read, and each test id must be answered once, in order; anything
else the box printed is ignored. What is read is bounded before it is parsed,
checked field by field before it is used, made valid text, and read in a worker
thread: the event loop that runs every box's timers never waits on a report.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farmd.sandbox import BoxResult, Sandbox, SandboxPolicy
from farmd.text import bounded, decode, valid_text
from farmd.verifier import judge
from farmd.verifier.verdict import (
    RULE_BROKEN,
    SANDBOX_VIOLATION,
    SUSPECTED_HACK,
    TIMEOUT,
    UNPARSEABLE,
    Verdict,
    failed,
)

JUDGE_SOURCE = Path(judge.__file__).read_bytes()
JUDGE_COMMAND = ["python3", "-I", "-S", "-B", f"{judge.SPEC_DIR}/judge.py"]


@dataclass
class TestOutcome:
    id: int
    ok: bool = False
    value: str | None = None
    """Canonical JSON of the claimed value (call mode)."""
    dtype: str | None = None
    shape: list[int] | None = None
    data: str | None = None
    """Base64 of the returned array's bytes (array mode), or of the sampled elements only."""
    sampled: bool = False
    error: str | None = None
    lost: str | None = None
    seconds: float = 0.0
    """Wall time of the call, measured by the recorder around its write and read."""
    cpu_seconds: float | None = None
    """CPU time the runner spent on the call (its process clock, read by the recorder); None when unreadable."""


@dataclass
class JudgeReport:
    box: BoxResult
    outcomes: dict[int, TestOutcome] = field(default_factory=dict)
    ref_outcomes: dict[int, TestOutcome] = field(default_factory=dict)
    """The reference's answers to the timed tests (when the spec carries a reference)."""
    import_error: str | None = None
    unparseable: str | None = None
    """Why the submission could not be compiled (checked in the box before any of it ran)."""
    refused: str | None = None
    """Which rule of ``spec["rules"]`` the submission's source breaks (checked before any of it ran)."""
    done: bool = False
    exit_status: int | None = None
    agent_log: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU time by the recorder's count: ``all`` (itself and the runners it reaped: what the box's own
    count, ``box.cpu_s``, should come to, give or take its init's share), ``runner_tree`` (the
    submission's runner with the children it reaped) and ``runner`` (that runner alone)."""
    anomalies: list[str] = field(default_factory=list)
    """Things a correct submission never causes: duplicate or unasked answers, a missing final record."""


async def run_judge(
    sandbox: Sandbox,
    submission: str,
    spec: dict[str, Any],
    policy: SandboxPolicy,
    blobs: dict[str, bytes] | None = None,
) -> JudgeReport:
    """Run ``spec``'s tests against ``submission`` in a fresh box. ``spec["nonce"]`` must be fresh.

    ``spec["rules"]`` (``{"imports": [...]}``) confines the code: its source is checked and its run
    audited (see ``judge.rule_problem`` and ``judge.audit_refusal``). What cannot be encoded in the
    submission (a lone surrogate) is replaced with U+FFFD: the caller flags it. Reading the box's
    report happens in a worker thread, bounded, so that it never holds up the event loop.
    """
    head: dict[str, Any] = {k: spec[k] for k in ("mode", "entry_point", "per_call_s", "rules") if k in spec}
    head["reference"] = "reference_source" in spec
    secret = {k: spec[k] for k in ("nonce", "tests", "reference_source") if k in spec}
    files: dict[str, bytes] = {
        "submission.py": valid_text(submission)[0].encode("utf-8"),
        ".judge/judge.py": JUDGE_SOURCE,
        ".judge/head.json": json.dumps(head).encode(),
        ".judge/secret.json": json.dumps(secret).encode(),
    }
    for name, blob in (blobs or {}).items():
        files[f".judge/{name}"] = blob
    result = await sandbox.run(JUDGE_COMMAND, policy, files=files)
    return await asyncio.to_thread(parse_report, result, spec)


MAX_RECORD_BYTES = 4 * 1024 * 1024
"""The longest record line read: a value of 1,000,000 characters of JSON, escaped, or a sample of
4096 elements in base64, fit well below it; longer is garbled."""
MAX_TEXT_CHARS = 2000
"""Errors, reasons and the like as kept from a record (the recorder cuts them far shorter)."""
MAX_LOG_CHARS = 4096
_MAX_NDIM = 8


class _Garbled(ValueError):
    """A record whose fields are not what the recorder writes."""


def parse_report(result: BoxResult, spec: dict[str, Any]) -> JudgeReport:
    """What the recorder said, read strictly: nonce lines only, each bounded before it is parsed,
    every field checked for type and size before it is used, every string made valid text. Never
    raises for anything in ``result``: what does not check out is an anomaly."""
    report = JudgeReport(box=result)
    prefix = f"FARM {spec['nonce']} ".encode()
    expected = [t["id"] for t in spec["tests"]]
    ref_expected: list[int] = []
    if "reference_source" in spec:
        for t in spec["tests"]:
            ref_expected += ([-1 - t["id"]] if t.get("echo") else []) + [t["id"]]
    most = len(expected) + len(ref_expected) + 4
    records = 0
    for start, end in _nonce_lines(result.stdout, prefix):
        records += 1
        if records > most:
            report.anomalies.append(f"the judge wrote more than {most} records")
            break
        if end - start > MAX_RECORD_BYTES:
            report.anomalies.append(f"a judge record was longer than {MAX_RECORD_BYTES} bytes")
            continue
        try:
            record = json.loads(decode(result.stdout[start:end])[0])
            if type(record) is not dict:
                raise _Garbled
            kind = record.get("kind")
            if kind == "import_error":
                report.import_error = _text(record.get("error"))
            elif kind == "unparseable":
                report.unparseable = _text(record.get("error"))
            elif kind == "refused":
                report.refused = _text(record.get("why"))
            elif kind in ("result", "lost", "ref_result", "ref_lost"):
                reference = kind.startswith("ref_")
                order, outcomes = (ref_expected, report.ref_outcomes) if reference else (expected, report.outcomes)
                taken = len(outcomes)  # each id answered once, in order: how many were is where the turn is
                test_id = _int(record.get("id"))
                if taken >= len(order) or test_id != order[taken]:
                    who = "a reference record" if reference else "a record"
                    report.anomalies.append(f"{who} for test {test_id} out of turn")
                    continue
                # A garbled record raises here, before it is kept: it never takes its test's turn.
                outcomes[test_id] = _outcome(test_id, record, lost=kind.endswith("lost"))
            elif kind == "done":
                status = record.get("status")
                report.exit_status = _int(status) if status is not None else None
                report.agent_log = _text(record.get("log", ""), MAX_LOG_CHARS)
                cpu = record.get("cpu_s", {})
                if type(cpu) is not dict:
                    raise _Garbled
                report.cpu_s = {k: _seconds(cpu[k]) for k in ("all", "runner_tree", "runner") if k in cpu}
                report.done = True
            else:
                raise _Garbled
        except (ValueError, RecursionError, MemoryError):  # _Garbled is a ValueError
            report.anomalies.append("a judge record was garbled")
    return report


def _nonce_lines(stdout: bytes, prefix: bytes) -> Iterator[tuple[int, int]]:
    """Where the rest of each line of ``stdout`` that starts with ``prefix`` begins and ends; all else
    is passed over at the speed of a byte search, however much there is."""
    marker = b"\n" + prefix
    at = stdout.find(marker)
    start = len(prefix) if stdout.startswith(prefix) else (-1 if at == -1 else at + len(marker))
    while start != -1:
        end = stdout.find(b"\n", start)
        if end == -1:
            yield start, len(stdout)
            return
        yield start, end
        at = stdout.find(marker, end)
        start = -1 if at == -1 else at + len(marker)


def _int(value: object) -> int:
    if type(value) is not int:
        raise _Garbled
    return value


def _text(value: object, limit: int = MAX_TEXT_CHARS) -> str:
    if type(value) is not str:
        raise _Garbled
    return bounded(value, limit)


def _seconds(value: object) -> float:
    if type(value) not in (int, float) or not isinstance(value, int | float) or not 0.0 <= value < 1e6:
        raise _Garbled  # NaN fails the comparison too
    return float(value)


def _outcome(test_id: int, record: dict[str, Any], *, lost: bool) -> TestOutcome:
    outcome = TestOutcome(id=test_id)
    if lost:
        outcome.lost = _text(record.get("why"), 200)
        return outcome
    ok = record.get("ok")
    if type(ok) is not bool:
        raise _Garbled
    outcome.ok = ok
    outcome.seconds = _seconds(record.get("seconds", 0.0))
    cpu = record.get("cpu_seconds")
    outcome.cpu_seconds = _seconds(cpu) if cpu is not None else None
    if "error" in record:
        outcome.error = _text(record["error"])
    if "value" in record:
        value = record["value"]
        if type(value) is not str or len(value) > MAX_RECORD_BYTES:
            raise _Garbled
        outcome.value = valid_text(value)[0]
    if "dtype" in record:
        outcome.dtype = _text(record["dtype"], 16)
    if "shape" in record:
        shape = record["shape"]
        if type(shape) is not list or len(shape) > _MAX_NDIM or any(type(d) is not int or d < 0 for d in shape):
            raise _Garbled
        outcome.shape = shape
    if "data" in record:
        data = record["data"]
        if type(data) is not str:
            raise _Garbled
        outcome.data = data  # base64, read strictly (validate=True) where it is used
    outcome.sampled = record.get("sampled") is True
    return outcome


def opening_verdict(version: str, report: JudgeReport) -> tuple[Verdict, bool]:
    """A failing verdict carrying what the run as a whole says (a source that does not compile or
    breaks the rules, bounds hit, an import that failed, a judge that was cut short), and whether
    the tests are worth reading at all."""
    verdict = failed(version)
    box = report.box
    if box.violations:
        verdict.flag(SANDBOX_VIOLATION)
        verdict.reasons.append(f"the judge's box hit: {', '.join(box.violations)}")
    if box.timed_out:
        verdict.flag(TIMEOUT)
    if report.unparseable is not None:
        verdict.flag(UNPARSEABLE)
        verdict.reasons.append(f"does not compile: {report.unparseable}")
        return verdict, False
    if report.refused is not None:
        verdict.flag(SUSPECTED_HACK)
        verdict.flag(RULE_BROKEN)  # refused for breaking its task's rules, before it ran
        verdict.reasons.append(report.refused)
        return verdict, False
    if report.import_error:
        verdict.reasons.append(f"importing the submission failed: {report.import_error}")
        if report.import_error.startswith("does not compile"):
            verdict.flag(UNPARSEABLE)
        if report.import_error.startswith(("SystemExit", "KeyboardInterrupt", judge.RULE_BROKEN)):
            verdict.flag(SUSPECTED_HACK)
        if report.import_error.startswith(judge.RULE_BROKEN):
            verdict.flag(RULE_BROKEN)
        return verdict, False
    if report.anomalies or not report.done:
        # A correct submission never answers out of turn nor stops the judge before its last word.
        verdict.flag(SUSPECTED_HACK)
        verdict.reasons += report.anomalies[:3] or ["the judge did not finish (its process was killed)"]
    return verdict, True


def broke_a_rule(outcome: TestOutcome) -> bool:
    """Whether a failed test failed because the code broke a rule of its task (``spec["rules"]``)."""
    return bool(outcome.error and outcome.error.startswith(judge.RULE_BROKEN))
