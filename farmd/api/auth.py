"""Shared-token authentication for every call (when farmd is started with a token)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

# Health checks and reflection stay open so load balancers and grpcurl can see a node.
_OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "this farm needs a token: pass --token or set FARM_TOKEN")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if details.method.startswith(_OPEN_PREFIXES):
            return await continuation(details)
        for key, value in details.invocation_metadata or ():
            if key == "authorization" and hmac.compare_digest(str(value).encode(), self._expected):
                return await continuation(details)
        return self._deny
