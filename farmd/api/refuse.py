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


def refusal(code: grpc.StatusCode, detail: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that ends any call with ``code`` and ``detail`` and reads nothing of it."""

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, detail)

    return grpc.stream_unary_rpc_method_handler(refuse)
