"""The one place a call ends in an error: farm's errors become gRPC status codes with details.

Every error status farmd sends carries a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer (the same code and message, and a ``google.rpc.ErrorInfo`` with domain ``farm`` and a reason
in UPPER_SNAKE), so a client in any language can branch on the reason instead of parsing the text:
``grpc_status.rpc_status.from_call`` in Python, ``status.FromError`` in Go. Handlers raise farm
errors under ``guarded``; what cannot raise (interceptors, refusals before a request is read) calls
``abort`` or builds ``status_trailer`` once (``refuse.refusal``; ``refuse.UnknownMethods`` answers
methods nobody serves). The statuses grpc makes itself (a deadline, a message over the receive
limit, a call over its concurrency bound) carry none: no farmd code sees those calls.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.rpc.error_details_pb2 import ErrorInfo
from google.rpc.status_pb2 import Status

from farmd.errors import (
    AgentSpecError,
    BadRequest,
    CgroupUnavailable,
    ConfigError,
    Conflict,
    CursorError,
    EndpointError,
    FailedPrecondition,
    FarmError,
    Forbidden,
    InfraFailure,
    IsolationUnavailable,
    LinkDown,
    NotFound,
    OffloadFailed,
    PolicyError,
    Refused,
    RequestFailed,
    SandboxError,
    SeccompUnavailable,
    TaskError,
)
from farmd.text import bounded

log = logging.getLogger("farmd.api")

T = TypeVar("T")

DOMAIN = "farm"
"""``ErrorInfo.domain`` of every error farmd sends."""

DETAILS_KEY = "grpc-status-details-bin"

MAX_DETAIL_CHARS = 500
"""A status's message travels in a header twice (as itself and inside the details), which clients
refuse past 16 KiB, and a message may quote what the caller sent, a name of any length: a reason,
not a copy of the request."""


# The first kind an error is an instance of decides; the reason is the error's own when it names one. ``Refused``
# (``BudgetExhausted`` too) carries its own code. Kinds not named here (a generator's bug, a contributed
# environment's failure, the attacker's) are INTERNAL, with their own reason where they name one.
_CODES: list[tuple[type[BaseException], grpc.StatusCode, str]] = [
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    (CursorError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    (NotFound, grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
    (Conflict, grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS"),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"),
    (Forbidden, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
    (PolicyError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SANDBOX_POLICY"),
    (AgentSpecError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_AGENT"),
    (TaskError, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TASK"),
    (EndpointError, grpc.StatusCode.UNAVAILABLE, "ENDPOINT_UNAVAILABLE"),
    (InfraFailure, grpc.StatusCode.UNAVAILABLE, "INFRASTRUCTURE"),
    (ConfigError, grpc.StatusCode.FAILED_PRECONDITION, "MISCONFIGURED"),
    (IsolationUnavailable, grpc.StatusCode.FAILED_PRECONDITION, "NO_ISOLATION"),
    (SeccompUnavailable, grpc.StatusCode.FAILED_PRECONDITION, "NO_ISOLATION"),
    (CgroupUnavailable, grpc.StatusCode.FAILED_PRECONDITION, "NO_ISOLATION"),
    (OffloadFailed, grpc.StatusCode.UNAVAILABLE, "OFFLOAD_FAILED"),
    (LinkDown, grpc.StatusCode.UNAVAILABLE, "COORDINATOR_UNAVAILABLE"),
    (RequestFailed, grpc.StatusCode.UNAVAILABLE, "COORDINATOR_UNAVAILABLE"),
    (SandboxError, grpc.StatusCode.UNAVAILABLE, "SANDBOX_UNAVAILABLE"),
    (FarmError, grpc.StatusCode.INTERNAL, "INTERNAL"),
]


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and ``ErrorInfo`` reason ``exc`` is sent with."""
    if isinstance(exc, Refused):
        code = getattr(grpc.StatusCode, exc.code, None)
        return (code, exc.reason or code.name) if isinstance(code, grpc.StatusCode) else (grpc.StatusCode.INTERNAL,
                                                                                          "INTERNAL")
    for kind, code, reason in _CODES:
        if isinstance(exc, kind):
            own = exc.reason if isinstance(exc, FarmError) else None
            return code, own or reason
    return grpc.StatusCode.INTERNAL, "INTERNAL"


_LEASE_EXPIRED = "lease expired"


def failure_status(error: str) -> Status:
    """A job's stored error (``Kind: message``, as a worker reports it) as a ``google.rpc.Status``: the code and
    reason its kind is sent with when a call fails (a rollout's endpoint or box that failed is UNAVAILABLE
    INFRASTRUCTURE), DEADLINE_EXCEEDED for a lease that ran out, and UNAVAILABLE ROLLOUT_FAILED for a kind
    farm does not know (a node's word: only a known class name decides a code)."""
    kind, colon, _ = error.partition(":")
    known = _error_class(kind.strip()) if colon else None
    if known is not None:
        code, reason = next(((c, r) for k, c, r in _CODES if issubclass(known, k)), (grpc.StatusCode.INTERNAL,
                                                                                       "INTERNAL"))
    elif _LEASE_EXPIRED in error:
        code, reason = grpc.StatusCode.DEADLINE_EXCEEDED, "LEASE_EXPIRED"
    else:
        code, reason = grpc.StatusCode.UNAVAILABLE, "ROLLOUT_FAILED"
    status = Status(code=code.value[0], message=clean_detail(error))
    status.details.add().Pack(ErrorInfo(reason=reason, domain=DOMAIN))
    return status


def error_status(exc: FarmError) -> Status:
    """``exc`` as a ``google.rpc.Status`` carried in a reply (one item's error among others that succeeded): the
    code and reason it would end a call with."""
    code, reason = status_for(exc)
    status = Status(code=code.value[0], message=clean_detail(str(exc)))
    status.details.add().Pack(ErrorInfo(reason=reason, domain=DOMAIN))
    return status


def _error_class(name: str) -> type[BaseException] | None:
    pending: list[type[BaseException]] = [FarmError]
    while pending:
        kind = pending.pop()
        if kind.__name__ == name:
            return kind
        pending.extend(kind.__subclasses__())
    return None


def clean_detail(text: str) -> str:
    """``text`` as a status message: valid UTF-8 (grpc refuses to send anything else), and short."""
    return bounded(text, MAX_DETAIL_CHARS)


def status_trailer(code: grpc.StatusCode, detail: str, reason: str) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata that carries ``google.rpc.Status`` for an error. ``detail`` must be the
    status message sent with it, as it is: clients check that the two agree."""
    info = ErrorInfo(reason=reason, domain=DOMAIN)
    status = Status(code=code.value[0], message=detail)
    status.details.add().Pack(info)
    return ((DETAILS_KEY, status.SerializeToString()),)


async def abort(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, detail: str, reason: str
                ) -> NoReturn:
    """End the call with ``code``, ``detail`` and an ``ErrorInfo`` of ``reason``."""
    detail = clean_detail(detail)
    await context.abort(code, detail, trailing_metadata=status_trailer(code, detail, reason))
    raise AssertionError("context.abort returned")  # it raises; this keeps NoReturn honest


async def abort_for(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    """End the call with the status ``exc`` maps to. An error farm did not raise on purpose is a bug:
    logged whole here, sent as INTERNAL without its text (it may hold anything)."""
    if isinstance(exc, FarmError):
        code, reason = status_for(exc)
        await abort(context, code, str(exc), reason)
    log.error("a call failed with an unexpected error", exc_info=exc, extra={"event": "api_bug"})
    await abort(context, grpc.StatusCode.INTERNAL, f"farmd failed unexpectedly ({type(exc).__name__}); "
                "its log has the details", "INTERNAL")


async def guarded(context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call``; an error ends the RPC with its mapped status instead of a traceback."""
    try:
        return await call()
    except grpc.aio.AbortError:
        raise  # the call already ended with a status of its own
    except Exception as exc:
        await abort_for(context, exc)


async def guarded_stream(context: grpc.aio.ServicerContext[Any, Any], replies: AsyncGenerator[T, None]
                         ) -> AsyncIterator[T]:
    """``replies``, for a server-streaming method; an error ends the RPC as ``guarded`` would. A call
    cancelled mid-stream closes ``replies`` then and there, not whenever it is collected."""
    async with contextlib.aclosing(replies):
        try:
            async for reply in replies:
                yield reply
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_for(context, exc)
