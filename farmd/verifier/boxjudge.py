"""Running the judge in a fresh box and reading what its recorder said.

The box receives only the declared artifacts: the submission, the judge and its
spec (test inputs, a nonce). Expected outputs stay on the host. Only lines carrying
the nonce are read, and each test id must be answered once, in order; anything
else the box printed is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farmd.sandbox import BoxResult, Sandbox, SandboxPolicy
from farmd.verifier import judge
from farmd.verifier.verdict import SANDBOX_VIOLATION, SUSPECTED_HACK, TIMEOUT, Verdict, failed

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


@dataclass
class JudgeReport:
    box: BoxResult
    outcomes: dict[int, TestOutcome] = field(default_factory=dict)
    ref_outcomes: dict[int, TestOutcome] = field(default_factory=dict)
    """The reference's answers to the timed tests (when the spec carries a reference)."""
    import_error: str | None = None
    done: bool = False
    exit_status: int | None = None
    agent_log: str = ""
    anomalies: list[str] = field(default_factory=list)
    """Things a correct submission never causes: duplicate or unasked answers, a missing final record."""


async def run_judge(
    sandbox: Sandbox,
    submission: str,
    spec: dict[str, Any],
    policy: SandboxPolicy,
    blobs: dict[str, bytes] | None = None,
) -> JudgeReport:
    """Run ``spec``'s tests against ``submission`` in a fresh box. ``spec["nonce"]`` must be fresh."""
    head: dict[str, Any] = {k: spec[k] for k in ("mode", "entry_point", "per_call_s") if k in spec}
    head["reference"] = "reference_source" in spec
    secret = {k: spec[k] for k in ("nonce", "tests", "reference_source") if k in spec}
    files: dict[str, bytes] = {
        "submission.py": submission.encode("utf-8", errors="surrogateescape"),
        ".judge/judge.py": JUDGE_SOURCE,
        ".judge/head.json": json.dumps(head).encode(),
        ".judge/secret.json": json.dumps(secret).encode(),
    }
    for name, blob in (blobs or {}).items():
        files[f".judge/{name}"] = blob
    result = await sandbox.run(JUDGE_COMMAND, policy, files=files)
    return parse_report(result, spec)


def parse_report(result: BoxResult, spec: dict[str, Any]) -> JudgeReport:
    report = JudgeReport(box=result)
    prefix = f"FARM {spec['nonce']} "
    expected = [t["id"] for t in spec["tests"]]
    ref_expected: list[int] = []
    if "reference_source" in spec:
        for t in spec["tests"]:
            ref_expected += ([-1 - t["id"]] if t.get("echo") else []) + [t["id"]]
    position = ref_position = 0
    for raw in result.stdout.decode("utf-8", errors="replace").splitlines():
        if not raw.startswith(prefix):
            continue
        try:
            record = json.loads(raw[len(prefix):])
        except (ValueError, RecursionError):
            report.anomalies.append("a judge record was garbled")
            continue
        kind = record.get("kind")
        if kind == "import_error":
            report.import_error = str(record.get("error"))
        elif kind in ("ref_result", "ref_lost"):
            test_id = record.get("id")
            if ref_position >= len(ref_expected) or test_id != ref_expected[ref_position]:
                report.anomalies.append(f"a reference record for test {test_id} out of turn")
                continue
            ref_position += 1
            report.ref_outcomes[test_id] = _outcome(test_id, record, lost=kind == "ref_lost")
        elif kind in ("result", "lost"):
            test_id = record.get("id")
            if position >= len(expected) or test_id != expected[position]:
                report.anomalies.append(f"a record for test {test_id} out of turn")
                continue
            position += 1
            report.outcomes[test_id] = _outcome(test_id, record, lost=kind == "lost")
        elif kind == "done":
            report.done = True
            report.exit_status = record.get("status")
            report.agent_log = str(record.get("log", ""))
    return report


def _outcome(test_id: int, record: dict[str, Any], *, lost: bool) -> TestOutcome:
    outcome = TestOutcome(id=test_id)
    if lost:
        outcome.lost = str(record.get("why"))
        return outcome
    outcome.ok = record.get("ok") is True
    outcome.seconds = float(record.get("seconds", 0.0))
    outcome.value = record.get("value")
    outcome.dtype = record.get("dtype")
    outcome.shape = record.get("shape")
    outcome.data = record.get("data")
    outcome.sampled = record.get("sampled") is True
    outcome.error = record.get("error")
    return outcome


def opening_verdict(version: str, report: JudgeReport) -> tuple[Verdict, bool]:
    """A failing verdict carrying what the run as a whole says (bounds hit, an import that failed,
    a judge that was cut short), and whether the tests are worth reading at all."""
    verdict = failed(version)
    box = report.box
    if box.violations:
        verdict.flag(SANDBOX_VIOLATION)
        verdict.reasons.append(f"the judge's box hit: {', '.join(box.violations)}")
    if box.timed_out:
        verdict.flag(TIMEOUT)
    if report.import_error:
        verdict.reasons.append(f"importing the submission failed: {report.import_error}")
        if report.import_error.startswith(("SystemExit", "KeyboardInterrupt")):
            verdict.flag(SUSPECTED_HACK)
        return verdict, False
    if report.anomalies or not report.done:
        # A correct submission never answers out of turn nor stops the judge before its last word.
        verdict.flag(SUSPECTED_HACK)
        verdict.reasons += report.anomalies[:3] or ["the judge did not finish (its process was killed)"]
    return verdict, True
