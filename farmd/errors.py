"""farm's errors: one base, flat subclasses named by the boundary they cross.

Every public error class of farmd is here, under ``FarmError`` (``tests/test_errors.py`` walks the package
to hold it). Library code raises these; only entry points (``farmd.cli``) decide exit codes, and only
``farmd.api`` maps them to gRPC status codes (``farmd.api.errors``). Code that runs inside a box on the
standard library alone (``farmd/verifier/judge.py``, ``farmd/sandbox/stub.py``, ``farmd/intake/env_runner.py``)
cannot import this module and keeps its own.

Each kind says whether farmd retries it, in its docstring and as ``retried`` (``is_retried`` reads it): True,
farmd tries the same work again by itself (a rollout's job goes back to the queue with backoff, up to its
attempts; a node asks its coordinator again); False, what met it is refused or fails for good until someone
changes something. A rollout that meets an error fails its job as ``retried`` says (``farmd.rollout``); the
scheduler decides the backoff. None is ever a score.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ActiveLost",
    "AgentError",
    "AgentSpecError",
    "AtroposInvalid",
    "AttackerError",
    "BadClaim",
    "BadExpression",
    "BadRequest",
    "BodyInvalid",
    "BudgetExhausted",
    "CgroupUnavailable",
    "CheckBudgetSpent",
    "ConfigError",
    "Conflict",
    "ContributedError",
    "ContributedVerifierFailed",
    "CursorError",
    "DataDirInUse",
    "EndpointError",
    "FailedPrecondition",
    "FarmError",
    "FarmdFailed",
    "Forbidden",
    "ForcedStop",
    "GeneratorBug",
    "InfraFailure",
    "IsolationUnavailable",
    "JoinRefused",
    "LinkDown",
    "LoopFailed",
    "NameHeld",
    "NoReplica",
    "NotCanonical",
    "NotFound",
    "OffloadFailed",
    "OutOfDomain",
    "PackageError",
    "PolicyError",
    "PolicyRemoved",
    "Refused",
    "ReplicaDown",
    "RequestFailed",
    "SandboxError",
    "SeccompUnavailable",
    "StoreError",
    "SyncFailed",
    "TaskBankError",
    "TaskError",
    "VllmFailed",
    "WeightsRefused",
    "is_retried",
]


class FarmError(Exception):
    """Base of every error farm raises on purpose.

    ``reason`` names one cause in UPPER_SNAKE (``POLICY_HASH_MISMATCH``) for callers that branch on
    it: the API sends it as the status's ``google.rpc.ErrorInfo.reason``. None: the kind's own.

    ``retried``: whether farmd tries again what met it. A plain ``FarmError`` (raised by no one on purpose) is
    never retried; every kind says its own.
    """

    reason: str | None = None
    retried: ClassVar[bool] = False
    """Whether farmd tries again by itself what met this (see the module). Every kind declares its own."""

    def __init__(self, *args: object, reason: str | None = None) -> None:
        super().__init__(*args)
        if reason is not None:
            self.reason = reason


def is_retried(exc: BaseException) -> bool:
    """Whether farmd tries again what ``exc`` ended: an error's own ``transient`` where it carries one
    (``InfraFailure``, ``EndpointError``), else its kind's ``retried``. Anything else is a bug, which says nothing
    about trying again: retried up to the job's attempts, so one flaky bug cannot fail a run at once."""
    if isinstance(exc, InfraFailure | EndpointError):
        return exc.transient
    if isinstance(exc, FarmError):
        return exc.retried
    return True


# -- configuration --------------------------------------------------------------------------------


class ConfigError(FarmError):
    """A setting is missing, malformed or contradicts another. Never retried: an operator must fix it."""

    retried = False


class DataDirInUse(ConfigError):
    """Another farmd serves from this data directory: one farmd per data directory. Never retried."""

    retried = False


# -- API requests: what a caller asked for (never retried by farmd; the caller may ask again) -------


class BadRequest(FarmError):
    """A caller asked for something out of range or unknown; nothing was changed. Never retried."""

    retried = False


class OutOfDomain(BadRequest):
    """A record holds numbers outside their domain (``farmd.domain``: a NaN reward, a token id past int32, a
    positive logprob, JSON nested too deep). ``problems`` names each, with where; nothing of it was kept.
    Never retried: the same record is out of its domain again."""

    reason = "OUT_OF_DOMAIN"
    retried = False

    def __init__(self, problems: list[str]) -> None:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        super().__init__(f"a record out of its domain: {shown}")
        self.problems = list(problems)


class NotFound(FarmError):
    """A caller named something (a trajectory, a policy) that does not exist. Never retried."""

    retried = False


class PolicyRemoved(NotFound):
    """A policy version whose content the farm removed once nothing could use it any more (no job queued or leased
    for it, not among its line's newest, not pinned): its hash and metadata are kept, and the message says when and
    why. Publishing the same content again brings it back. Never retried."""

    reason = "POLICY_REMOVED"
    retried = False


class Conflict(FarmError):
    """What the caller asked to create exists already and is someone else's (a node name a connected
    node holds). Never retried."""

    retried = False


class Forbidden(FarmError):
    """The caller is known, but what it asked is not theirs to do (another contributor's environment name,
    a bounty above their reputation, reviewing their own submission). Never retried."""

    retried = False


class NameHeld(Forbidden):
    """A name the caller used (a node's, a consumer's, an Atropos environment id) belongs to another credential,
    the one that made it: only an operator may give it to someone else (``farmctl names reassign``). Never
    retried."""

    reason = "NAME_HELD"
    retried = False

    def __init__(self, message: str, *, kind: str, name: str, holder: str) -> None:
        super().__init__(message)
        self.kind, self.name, self.holder = kind, name, holder


class FailedPrecondition(FarmError):
    """The call is well formed, but this node is not in a state to do it (no workers to rescore on). Never
    retried by farmd: the caller may ask again once the state has changed."""

    retried = False


class Refused(FarmError):
    """A call turned away with a code no other kind of farm error stands for (RESOURCE_EXHAUSTED, DATA_LOSS):
    the handler that raises it decides the code. ``code`` is the gRPC status code's name (``farmd.api.errors``
    makes it one: gRPC types stop at ``farmd/api``). Never retried by farmd: the caller may ask again."""

    retried = False

    def __init__(self, code: str, detail: str, reason: str) -> None:
        super().__init__(detail, reason=reason)
        self.code = code


class BudgetExhausted(Refused):
    """A credential's budget (``farmd.api.budget``: open streams, unfinished pieces and bytes) is spent:
    RESOURCE_EXHAUSTED, and the call that asked ends. Never retried by farmd: the caller may ask again once
    its other calls have finished."""

    retried = False

    def __init__(self, detail: str) -> None:
        super().__init__("RESOURCE_EXHAUSTED", detail, "CREDENTIAL_BUDGET")


class BodyInvalid(BadRequest, ValueError):
    """An HTTP request body that does not hold together; ``loc`` is where (as FastAPI's validation errors say it:
    Atropos's and SandboxFusion's servers are FastAPI, so their clients read a 422 in that shape). Never retried:
    the same body is refused again."""

    retried = False

    def __init__(self, loc: list[str | int], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message

    def detail(self) -> list[dict[str, object]]:
        return [{"loc": ["body", *self.loc], "msg": self.message, "type": "value_error"}]


class AtroposInvalid(BodyInvalid):
    """An Atropos request that does not hold together. Never retried: the same body is refused again."""

    retried = False


# -- the sandbox ----------------------------------------------------------------------------------


class PolicyError(FarmError):
    """A sandbox policy asks for something invalid (a bound out of range, a bad path). Never retried."""

    retried = False


class IsolationUnavailable(FarmError):
    """The host cannot give a box every isolation feature, so untrusted code must not run. Never
    retried: farmd refuses to start rollouts on such a host.

    ``missing`` lists each missing feature with what to do about it.
    """

    retried = False

    def __init__(self, missing: list[str]) -> None:
        self.missing = list(missing)
        lines = "\n".join(f"  - {m}" for m in self.missing)
        super().__init__(f"refusing to run untrusted code: this host cannot isolate it:\n{lines}")


class SeccompUnavailable(FarmError, RuntimeError):
    """libseccomp cannot be loaded, or made no filter: no box may start without one. Never retried: the
    host check (``farmd doctor``, ``farmd serve``) says what to install."""

    retried = False


class CgroupUnavailable(FarmError, RuntimeError):
    """This host gives farmd no cgroup to bound a box's memory, processes and CPU in. Never retried: the
    host check says what to change."""

    retried = False


class SandboxError(FarmError):
    """The sandbox itself failed (not the code inside it): an infrastructure failure, so the rollout
    is retried. A program that crashes, times out or exhausts a bound is a result, never this.
    """

    retried = True


class OffloadFailed(FarmError, RuntimeError):
    """The worker process (``farmd.offload``) died, or could not start, while doing the work: nothing the
    caller's input did (the input is not trusted to be why, but it is not blamed either: the caller decides).
    Retried: a fresh worker process may well finish it (an endpoint's reply is asked for again)."""

    retried = True


# -- agents and model endpoints -------------------------------------------------------------------


class AgentError(FarmError):
    """The agent could not make an attempt (not that it made a bad one): an infrastructure failure,
    retried like any, never a score."""

    retried = True


class AgentSpecError(AgentError):
    """An agent spec (``reference``, ``random``, ``openai:MODEL@ENDPOINT``, ...) is malformed or unknown.
    Refused when a run is asked for; never retried."""

    retried = False


class EndpointError(AgentError):
    """The model behind an agent failed to answer (after the client's own retries where a retry
    could help). Never a score, so a dead inference server cannot look like a failing policy.

    Retried unless ``transient`` is False: ``transient`` says whether trying the job again later may
    succeed: connection errors, timeouts, 429 and 5xx are, and the scheduler retries the job with backoff;
    a 4xx for a request the endpoint will never accept is not, and the job fails at once. ``status`` is the
    last HTTP status seen (None when there was no response), ``attempts`` how many requests
    were made.
    """

    retried = True

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1,
                 transient: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.transient = transient


# -- environments, verifiers and rollouts ---------------------------------------------------------


class TaskError(FarmError):
    """A task cannot be made as asked (unknown environment, difficulty out of range). Refused when
    asked for directly; a rollout that meets it fails as infrastructure (``InfraFailure``) at once: the
    same job would meet it again. Never retried."""

    retried = False


class GeneratorBug(FarmError):
    """A generated puzzle (``farmd.envs.shell``) broke one of its own invariants: a bug in its generator,
    never the attempt's fault. Never retried: the same seed makes the same puzzle."""

    retried = False


class BadExpression(FarmError, ValueError):
    """Text that is not a plain arithmetic expression (why, in words): an answer's, so its verifier scores
    it, and never raises it past itself. Never retried: the same text is refused again."""

    retried = False


class BadClaim(FarmError, ValueError):
    """A value a runner in a box claimed that cannot be parsed (or is abusive): that test's failure, as the
    verifier kit scores it. Never retried."""

    retried = False


class NotCanonical(FarmError, ValueError):
    """A value computed on the host (a reference's output) that is not built from exact builtin types
    within the judge's bounds (``farmd.verifier.canon``): the environment's bug. Never retried: the same
    task computes the same value. (The box's judge has its own, ``farmd.verifier.judge.NotCanonical``.)"""

    retried = False


class InfraFailure(FarmError):
    """A rollout could not be produced honestly (its endpoint, box or verifier failed): never
    scored. Retried unless ``transient`` is False: False, trying again cannot help (an endpoint that
    refuses the request), so the scheduler fails the job at once; True: retried with backoff up to its
    attempts."""

    retried = True

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class TaskBankError(FarmError, ValueError):
    """The task bank was asked something invalid: an unknown environment, a difficulty out of range,
    a reward outside [0, 1], a setting out of range, or saved state it cannot read. Never retried.
    """

    retried = False


# -- intake: contributed environments -------------------------------------------------------------


class PackageError(BadRequest):
    """A submission that cannot be taken as it is; ``problems`` lists each thing to fix. Never retried: the
    contributor submits it again fixed."""

    retried = False

    def __init__(self, problems: list[str]) -> None:
        super().__init__("the submission cannot be taken: " + "; ".join(problems[:20]), reason="BAD_SUBMISSION")
        self.problems = problems


class ContributedError(FarmError):
    """The contributed environment's code failed a call: ``evidence`` says how (what intake reports). In the
    funnel it is evidence, never tried again; serving, a rollout whose task it could not make is retried up
    to its job's attempts (a box of its code may fail once and not twice)."""

    retried = True

    def __init__(self, op: str, evidence: str) -> None:
        super().__init__(f"{op}: {evidence}", reason="CONTRIBUTED_ENV_FAILED")
        self.op = op
        self.evidence = evidence


class ContributedVerifierFailed(FarmError):
    """A contributed verifier failed while judging one attempt. Not the farm's own failure, so
    ``verify_safely`` does not take it for one: it judges the task's reference the same way to decide whom to
    blame (``farmd.intake.served``), and an attempt that breaks the verifier gets its 0. Never retried
    itself: what it decides is a verdict, or an infrastructure failure that is."""

    retried = False


class CheckBudgetSpent(FarmError):
    """A submission's checks cost more than the farm lets them (``BoxedEnvironment``'s budgets: box seconds
    in all, a verdict's CPU and wall seconds): the environment's own cost, a verdict on it, never a farm
    failure to try again. ``evidence`` says which budget and by how much. Never retried."""

    retried = False

    def __init__(self, evidence: str) -> None:
        super().__init__(evidence, reason="CHECK_BUDGET_SPENT")
        self.evidence = evidence


class AttackerError(FarmError):
    """The LLM attacker gave no proposals (its endpoint failed, or its reply held none): ``tokens`` it cost
    all the same. Infrastructure, which tier 2 records as a note, never a verdict either way; never retried
    (tier 2 goes on without it)."""

    retried = False

    def __init__(self, message: str, *, tokens: int = 0) -> None:
        super().__init__(message, reason="ATTACKER_UNAVAILABLE")
        self.tokens = tokens


# -- the store ------------------------------------------------------------------------------------


class StoreError(FarmError):
    """The store cannot be opened or used as it is (a newer schema, a broken file). Never retried:
    farmd stops rather than write to a database it does not understand."""

    retried = False


class CursorError(StoreError):
    """A consumer's cursor was moved somewhere the stream has not reached. Nothing was changed; the
    caller may ask again (the API answers INVALID_ARGUMENT). Not a broken store, so farmd goes on. Never
    retried by farmd."""

    retried = False


# -- the daemon and the fleet ---------------------------------------------------------------------


class JoinRefused(FarmError):
    """A coordinator refused this node for a reason only an operator can change (a wrong credential or role,
    a host that cannot isolate, a taken name). Never retried: ``farmd serve --join`` exits."""

    retried = False


class LinkDown(FarmError):
    """A node's coordinator is not connected now (or the request's stream ended before its reply). Retried:
    the link connects again, forever, and what was asked is asked again (results stay in the outbox)."""

    retried = True


class RequestFailed(FarmError):
    """A node's coordinator answered a request with an error. Retried: leases are asked for again, and
    results it did not take stay in the outbox for the next connection."""

    retried = True


class ActiveLost(FarmError):
    """This coordinator lost the lock that made it the farm's active one (its session ended, or stopped answering:
    ``farmd.store.postgres``) and stopped serving, so that a standby may take over. ``farmd serve`` exits with a
    failure, for a supervisor to start it again: it then waits as a standby. Never retried in the process."""

    retried = False


class ForcedStop(FarmError):
    """A second signal cut farmd's graceful shutdown short. The entry point exits at once on it,
    waiting for nothing that is still stopping; library code never exits the process itself. Never
    retried."""

    retried = False


# -- entry points (``farmd.cli``) -----------------------------------------------------------------


class FarmdFailed(FarmError):
    """A farmd started by ``LocalFarmd`` (``make run``, ``make tour``) exited or did not come up; the message
    ends with its log. Never retried: its log says what to fix."""

    retried = False


class LoopFailed(FarmError):
    """``make run``'s learning loop failed (farmd or the trainer); the message ends with the trainer's log.
    Never retried."""

    retried = False


class ReplicaDown(FarmError):
    """The model server a request was sent to was taken out while it waited (``farmd.agents.replicas``). Retried:
    the request goes to another replica of its endpoint."""

    retried = True


class NoReplica(FarmError):
    """No server of a model endpoint is up. Retried: the job is an infrastructure failure, leased again once a
    replica answers its health checks."""

    retried = True


class WeightsRefused(FarmError, ValueError):
    """A published version's content is not weights a model server may load (``farmd.agents.weights``). Never
    retried: the same bytes are refused again."""

    retried = False


class SyncFailed(FarmError):
    """A model server did not take a policy version. Retried: the weight sync tries the replica again, and keeps
    it out of service until it has the version the others serve."""

    retried = True


class VllmFailed(FarmError):
    """The vLLM server ``make run ENGINE=vllm`` started exited or did not come up; the message ends with its log.
    Never retried: the job reports it and stops."""

    retried = False
