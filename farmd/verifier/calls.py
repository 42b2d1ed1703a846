"""Judging a call-mode judge run: every test answered, once, with the expected value.

The expected values are computed on the host by the environment and come in as plain data; the
claimed ones come out of the box as canonical JSON and are compared exactly (``farmd.verifier.canon``).
"""

from __future__ import annotations

from typing import Any

from farmd.errors import BadClaim
from farmd.verifier import canon as C
from farmd.verifier.boxjudge import JudgeReport, broke_a_rule, opening_verdict
from farmd.verifier.verdict import RULE_BROKEN, SUSPECTED_HACK, TIMEOUT, Verdict


def judge_calls(version: str, report: JudgeReport, expected: list[Any], *, rel_tol: float = 0.0,
                abs_tol: float = 0.0) -> Verdict:
    """The verdict of a call-mode judge run: every test answered, once, with the expected value."""
    verdict, readable = opening_verdict(version, report)
    if not readable:
        return verdict
    wrong = 0
    for i, want in enumerate(expected):
        outcome = report.outcomes.get(i)
        if outcome is None:
            wrong += 1
            continue
        if outcome.lost:
            wrong += 1
            # A correct function neither exits the process nor talks out of turn.
            verdict.flag(TIMEOUT if outcome.lost == "timeout" else SUSPECTED_HACK)
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: no answer ({outcome.lost})")
            continue
        if not outcome.ok:
            wrong += 1
            if outcome.error and "not accepted" in outcome.error and "builtins." not in outcome.error:
                verdict.flag(SUSPECTED_HACK)
            if broke_a_rule(outcome):  # it modified its argument, which every call task forbids
                verdict.flag(RULE_BROKEN)
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: raised {outcome.error}")
            continue
        try:
            got = C.parse_claim(outcome.value or "")
        except BadClaim as exc:
            wrong += 1
            verdict.reasons.append(f"test {i}: {exc}")
            continue
        if not C.strict_equal(got, want, rel_tol=rel_tol, abs_tol=abs_tol):
            wrong += 1
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: wrong value")
    verdict.details = {"tests": len(expected), "failed": wrong}
    if wrong == 0 and report.done and not report.anomalies and not verdict.flags:
        verdict.passed = True
        verdict.reward = 1.0
        verdict.reasons = [f"all {len(expected)} tests passed"]
    elif wrong == 0 and not verdict.reasons:
        verdict.reasons.append("every value was right, but the run was not clean")
    return verdict
