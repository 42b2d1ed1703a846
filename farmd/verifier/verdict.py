"""What a verifier says about one attempt.

A verdict with ``status == "error"`` is not a score: the verifier (or the
infrastructure under it) failed, and the attempt must be neither rewarded nor
punished for it. Everything the attempt did wrong, including making the judge's
box misbehave, is ``status == "ok"`` with ``passed == False``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# The flags a verdict may carry live with every other flag, in farmd/flags.py; named here too
# because every verifier reaches for them.
from farmd.flags import (
    INVALID_TEXT,
    NO_ANSWER,
    RULE_BROKEN,
    SANDBOX_VIOLATION,
    SUSPECTED_HACK,
    TIMEOUT,
    TRUNCATED,
    UNPARSEABLE,
    VERIFIER_FAULT,
)

Status = Literal["ok", "error"]


__all__ = ["INVALID_TEXT", "NO_ANSWER", "RULE_BROKEN", "SANDBOX_VIOLATION", "SUSPECTED_HACK", "TIMEOUT", "TRUNCATED",
           "UNPARSEABLE", "VERIFIER_FAULT", "Status", "Verdict", "errored", "failed", "unreadable_source"]


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
    """The failing verdict for source code that is empty or too big; else None.

    Nothing here parses: compiling untrusted text can fail in every way the compiler can (a
    RecursionError on a long expression, a MemoryError on a deep one), so it is compiled in the
    judge's box, where any failure is the submission's (``unparseable``). A lone surrogate counts
    as the three bytes of the U+FFFD it will be judged as.
    """
    if not source.strip():
        return failed(version, "empty submission", flags=(NO_ANSWER,))
    if len(source) > max_bytes or len(source.encode("utf-8", "surrogatepass")) > max_bytes:
        return failed(version, f"submission larger than {max_bytes} bytes")
    return None
