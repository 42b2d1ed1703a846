"""The one place farm's errors become gRPC status codes, with a message a person can act on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from farmd.agents.errors import AgentSpecError, EndpointError
from farmd.envs.base import TaskError
from farmd.errors import (
    BadRequest,
    ConfigError,
    FarmError,
    IsolationUnavailable,
    NotFound,
    PolicyError,
    SandboxError,
)
from farmd.text import clip, valid_text

T = TypeVar("T")

MAX_DETAIL_CHARS = 500
"""A status's details travel in a header, which clients refuse past 16 KiB (and a message may quote
what the caller sent, a name of any length): a reason, not a copy of the request."""

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (PolicyError, grpc.StatusCode.INVALID_ARGUMENT),
    (AgentSpecError, grpc.StatusCode.INVALID_ARGUMENT),
    (TaskError, grpc.StatusCode.INVALID_ARGUMENT),
    (EndpointError, grpc.StatusCode.UNAVAILABLE),
    (ConfigError, grpc.StatusCode.FAILED_PRECONDITION),
    (IsolationUnavailable, grpc.StatusCode.FAILED_PRECONDITION),
    (SandboxError, grpc.StatusCode.UNAVAILABLE),
    (FarmError, grpc.StatusCode.INTERNAL),
]


def status_for(exc: BaseException) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


async def guarded(context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call``; a farm error aborts the RPC with its mapped code instead of a traceback."""
    try:
        return await call()
    except FarmError as exc:
        await context.abort(status_for(exc), clip(valid_text(str(exc))[0], MAX_DETAIL_CHARS)[0])
        raise  # abort raises; this keeps type checkers honest
