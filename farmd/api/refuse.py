"""Turning a call away before a byte of its request is read.

grpc reads a unary request whole (up to the server's receive limit) before the
handler runs. A handler of a request-*streaming* shape is started with nothing
read, so one that aborts at once costs the server the call's headers and no more,
whatever the method's real shape: the caller only ever sees the status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from farmd.api.errors import clean_detail, status_trailer


def refusal(code: grpc.StatusCode, detail: str, reason: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that ends any call with ``code``, ``detail`` and an ``ErrorInfo`` of ``reason``,
    and reads nothing of it."""
    detail = clean_detail(detail)
    trailer = status_trailer(code, detail, reason)  # built once: a flood of refusals costs no encoding

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, detail, trailing_metadata=trailer)

    return grpc.stream_unary_rpc_method_handler(refuse)


class UnknownMethods(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Answers every method no service took, after all of them: UNIMPLEMENTED with details, where
    grpc's own answer has none. Register it last."""

    def __init__(self) -> None:
        self._refusal = refusal(grpc.StatusCode.UNIMPLEMENTED,
                                "farmd serves no such method (server reflection lists those it does)",
                                "UNIMPLEMENTED")

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return self._refusal
