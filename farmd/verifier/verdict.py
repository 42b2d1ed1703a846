"""What a verifier says about one attempt.

A verdict with ``status == "error"`` is not a score: the verifier (or the
infrastructure under it) failed, and the attempt must be neither rewarded nor
punished for it. Everything the attempt did wrong, including making the judge's
box misbehave, is ``status == "ok"`` with ``passed == False``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error"]

# Flags: facts about an attempt worth filtering or inspecting trajectories by.
SANDBOX_VIOLATION = "sandbox_violation"
"""A box that ran the attempt's code hit a bound or policy (see reasons)."""
SUSPECTED_HACK = "suspected_hack"
"""The attempt did something only an attempt at gaming the verifier does."""
TIMEOUT = "timeout"
"""The attempt ran out of time."""
NO_ANSWER = "no_answer"
"""There was nothing to verify (empty submission, no answer block)."""
UNPARSEABLE = "unparseable"
"""The submission could not be parsed or compiled (a syntax error, nesting too deep, an expression too
long): checked in the judge's box, never on the host."""
INVALID_TEXT = "invalid_text"
"""The attempt's text held what UTF-8 cannot encode (a lone surrogate); it was repaired with U+FFFD where
it entered the farm, and the attempt judged as repaired."""
VERIFIER_FAULT = "verifier_fault"
"""The verifier failed while judging this attempt but judges the task's reference soundly: whatever the
attempt did to it, the attempt gets 0 (a verifier error is never an escape from a 0)."""
TRUNCATED = "truncated"
"""Part of the attempt (a reply, an observation, a step list) was cut to the bounds of a stored
trajectory; the verdict was given on the whole attempt."""


@dataclass
class Verdict:
    reward: float
    passed: bool
    status: Status
    verifier_version: str
    reasons: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    """Machine-readable extras: per-test outcomes, timings, speedup."""

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "passed": self.passed,
            "status": self.status,
            "reasons": list(self.reasons),
            "flags": list(self.flags),
            "verifier_version": self.verifier_version,
            "details": self.details,
        }


def failed(version: str, *reasons: str, flags: tuple[str, ...] = ()) -> Verdict:
    """The attempt is wrong: reward 0, a real score."""
    return Verdict(reward=0.0, passed=False, status="ok", verifier_version=version, reasons=list(reasons),
                   flags=list(flags))


def errored(version: str, reason: str) -> Verdict:
    """The verifier could not judge: not a score, never a pass."""
    return Verdict(reward=0.0, passed=False, status="error", verifier_version=version, reasons=[reason])


def unreadable_source(version: str, source: str, max_bytes: int) -> Verdict | None:
    """The failing verdict for source code that is empty, too big or does not parse; else None.

    Parsing runs nothing of the submission (compile only), so it is safe on the host.
    """
    if not source.strip():
        return failed(version, "empty submission", flags=(NO_ANSWER,))
    if len(source.encode("utf-8", "surrogateescape")) > max_bytes:
        return failed(version, f"submission larger than {max_bytes} bytes")
    try:
        compile(source, "submission.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return failed(version, f"does not compile: {exc}")
    return None
