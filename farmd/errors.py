"""farm's errors: one base, flat subclasses named by the boundary they cross.

Library code raises these; only entry points (``farmd.cli``) decide exit codes, and only
``farmd.api`` maps them to gRPC status codes (``farmd.api.errors``, which also keeps the one error
that carries a gRPC code, ``Refused``: gRPC types stop at ``farmd/api``).

Whether a failure is retried is the scheduler's decision (``farmd.scheduler``), made from what
these say: each kind's docstring says which way it goes. None is ever a score.
"""

from __future__ import annotations

__all__ = [
    "AgentError", "AgentSpecError", "BadRequest", "ConfigError", "Conflict", "CursorError", "EndpointError", "FailedPrecondition", "FarmError",
    "ForcedStop", "InfraFailure", "IsolationUnavailable", "JoinRefused", "NameHeld", "NotFound", "OutOfDomain", "PolicyError", "PolicyRemoved",
    "SandboxError", "StoreError",
    "TaskBankError", "TaskError",
]


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


# -- configuration --------------------------------------------------------------------------------


class ConfigError(FarmError):
    """A setting is missing, malformed or contradicts another. Never retried: an operator must fix it."""


# -- API requests: what a caller asked for (never retried by farmd; the caller may ask again) -------


class BadRequest(FarmError):
    """A caller asked for something out of range or unknown; nothing was changed."""


class OutOfDomain(BadRequest):
    """A record holds numbers outside their domain (``farmd.domain``: a NaN reward, a token id past int32, a
    positive logprob, JSON nested too deep). ``problems`` names each, with where; nothing of it was kept."""

    reason = "OUT_OF_DOMAIN"

    def __init__(self, problems: list[str]) -> None:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        super().__init__(f"a record out of its domain: {shown}")
        self.problems = list(problems)


class NotFound(FarmError):
    """A caller named something (a trajectory, a policy) that does not exist."""


class PolicyRemoved(NotFound):
    """A policy version whose content the farm removed once nothing could use it any more (no job queued or leased
    for it, not among its line's newest, not pinned): its hash and metadata are kept, and the message says when and
    why. Publishing the same content again brings it back."""

    reason = "POLICY_REMOVED"


class Conflict(FarmError):
    """What the caller asked to create exists already and is someone else's (a node name a connected
    node holds)."""


class Forbidden(FarmError):
    """The caller is known, but what it asked is not theirs to do (another contributor's environment name,
    a bounty above their reputation, reviewing their own submission)."""


class NameHeld(Forbidden):
    """A name the caller used (a node's, a consumer's, an Atropos environment id) belongs to another credential,
    the one that made it: only an operator may give it to someone else (``farmctl names reassign``)."""

    reason = "NAME_HELD"

    def __init__(self, message: str, *, kind: str, name: str, holder: str) -> None:
        super().__init__(message)
        self.kind, self.name, self.holder = kind, name, holder


class FailedPrecondition(FarmError):
    """The call is well formed, but this node is not in a state to do it (no workers to rescore on)."""


# -- the sandbox ----------------------------------------------------------------------------------


class PolicyError(FarmError):
    """A sandbox policy asks for something invalid (a bound out of range, a bad path). Never retried."""


class IsolationUnavailable(FarmError):
    """The host cannot give a box every isolation feature, so untrusted code must not run. Never
    retried: farmd refuses to start rollouts on such a host.

    ``missing`` lists each missing feature with what to do about it.
    """

    def __init__(self, missing: list[str]) -> None:
        self.missing = list(missing)
        lines = "\n".join(f"  - {m}" for m in self.missing)
        super().__init__(f"refusing to run untrusted code: this host cannot isolate it:\n{lines}")


class SandboxError(FarmError):
    """The sandbox itself failed (not the code inside it): an infrastructure failure, so the rollout
    is retried. A program that crashes, times out or exhausts a bound is a result, never this.
    """


# -- agents and model endpoints -------------------------------------------------------------------


class AgentError(FarmError):
    """The agent could not make an attempt (not that it made a bad one): an infrastructure failure,
    retried like any, never a score."""


class AgentSpecError(AgentError):
    """An agent spec (``reference``, ``random``, ``openai:MODEL@ENDPOINT``, ...) is malformed or unknown.
    Refused when a run is asked for; never retried."""


class EndpointError(AgentError):
    """The model behind an agent failed to answer (after the client's own retries where a retry
    could help). Never a score, so a dead inference server cannot look like a failing policy.

    ``transient`` says whether trying the job again later may succeed: connection errors,
    timeouts, 429 and 5xx are, and the scheduler retries the job with backoff; a 4xx for a
    request the endpoint will never accept is not, and the job fails at once. ``status`` is the
    last HTTP status seen (None when there was no response), ``attempts`` how many requests
    were made.
    """

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1,
                 transient: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.transient = transient


# -- environments and rollouts --------------------------------------------------------------------


class TaskError(FarmError):
    """A task cannot be made as asked (unknown environment, difficulty out of range). Refused when
    asked for directly; a rollout that meets it fails as infrastructure (``InfraFailure``)."""


class InfraFailure(FarmError):
    """A rollout could not be produced honestly (its endpoint, box or verifier failed): never
    scored. ``transient`` False: trying again cannot help (an endpoint that refuses the request),
    so the scheduler fails the job at once; True: retried with backoff up to its attempts."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class TaskBankError(FarmError, ValueError):
    """The task bank was asked something invalid: an unknown environment, a difficulty out of range,
    a reward outside [0, 1], a setting out of range, or saved state it cannot read. Never retried.
    """


# -- the store ------------------------------------------------------------------------------------


class StoreError(FarmError):
    """The store cannot be opened or used as it is (a newer schema, a broken file). Never retried:
    farmd stops rather than write to a database it does not understand."""


class CursorError(StoreError):
    """A consumer's cursor was moved somewhere the stream has not reached. Nothing was changed; the
    caller may ask again (the API answers INVALID_ARGUMENT). Not a broken store, so farmd goes on."""


# -- the daemon -----------------------------------------------------------------------------------


class JoinRefused(FarmError):
    """A coordinator refused this node for a reason only an operator can change (a wrong credential or role,
    a host that cannot isolate, a taken name). Never retried: ``farmd serve --join`` exits."""


class ForcedStop(FarmError):
    """A second signal cut farmd's graceful shutdown short. The entry point exits at once on it,
    waiting for nothing that is still stopping; library code never exits the process itself."""
