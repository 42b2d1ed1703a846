"""Shared-token authentication for every call (when farmd is started with a token).

The token travels in the call's headers, so it is checked before a byte of the
request is read: a call without it is turned away by a handler that reads nothing
(``refusal``), and costs farmd its headers, not its body.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from farmd.api.refuse import refusal

# Health checks and reflection stay open so load balancers and grpcurl can see a node.
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


def is_open(method: str) -> bool:
    """Whether ``method`` answers callers without a token."""
    return method.startswith(OPEN_PREFIXES)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self._deny = refusal(grpc.StatusCode.UNAUTHENTICATED,
                             "this farm needs a token: pass --token or set FARM_TOKEN", "UNAUTHENTICATED")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if is_open(details.method):
            return await continuation(details)
        for key, value in details.invocation_metadata or ():
            if key == "authorization" and isinstance(value, str) and \
                    hmac.compare_digest(value.encode(), self._expected):
                return await continuation(details)
        return self._deny
