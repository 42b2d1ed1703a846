"""farm's errors: one base, flat subclasses named by the boundary they cross.

Library code raises these; only entry points (``farmd.cli``) decide exit codes,
and only ``farmd.api`` maps them to gRPC status codes.
"""

from __future__ import annotations


class FarmError(Exception):
    """Base of every error farm raises on purpose.

    ``reason`` names one cause in UPPER_SNAKE (``POLICY_HASH_MISMATCH``) for callers that branch on
    it: the API sends it as the status's ``google.rpc.ErrorInfo.reason``. None: the kind's own.
    """

    reason: str | None = None

    def __init__(self, *args: object, reason: str | None = None) -> None:
        super().__init__(*args)
        if reason is not None:
            self.reason = reason


class ConfigError(FarmError):
    """A setting is missing, malformed or contradicts another."""


class PolicyError(FarmError):
    """A sandbox policy asks for something invalid (a bound out of range, a bad path)."""


class BadRequest(FarmError):
    """A caller asked for something out of range or unknown; nothing was changed."""


class NotFound(FarmError):
    """A caller named something (a trajectory, a policy) that does not exist."""


class FailedPrecondition(FarmError):
    """The call is well formed, but this node is not in a state to do it (no workers to rescore on)."""


class IsolationUnavailable(FarmError):
    """The host cannot give a box every isolation feature, so untrusted code must not run.

    ``missing`` lists each missing feature with what to do about it.
    """

    def __init__(self, missing: list[str]) -> None:
        self.missing = list(missing)
        lines = "\n".join(f"  - {m}" for m in self.missing)
        super().__init__(f"refusing to run untrusted code: this host cannot isolate it:\n{lines}")


class SandboxError(FarmError):
    """The sandbox itself failed (not the code inside it): an infrastructure failure.

    A program that crashes, times out or exhausts a bound is a result, never this.
    """
