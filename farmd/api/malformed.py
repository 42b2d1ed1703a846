"""Requests that do not parse are the caller's error: INVALID_ARGUMENT, not grpc's UNKNOWN.

grpc decodes a request before any handler runs and reports a decode failure as
UNKNOWN ("Unexpected DecodeError"), which reads like a server fault. This interceptor
has the decoder hand back a marker instead, and the handler abort with a message
that names the message type it expected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from farmd.api.errors import abort


class _Malformed:
    def __init__(self, detail: str) -> None:
        self.detail = detail


def _tolerant(decode: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if decode is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return decode(raw)
        except DecodeError as exc:
            return _Malformed(str(exc))
    return parse


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], bad: _Malformed) -> None:
    await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {bad.detail}", "MALFORMED_REQUEST")


def _checked_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, _Malformed):
            await _refuse(context, request)
        return await behavior(request, context)
    return run


def _checked_unary_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if isinstance(request, _Malformed):
            await _refuse(context, request)
        async for reply in behavior(request, context):
            yield reply
    return run


def _checked_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def parsed() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await _refuse(context, request)
                yield request
        return await behavior(parsed(), context)
    return run


class MalformedInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        if handler is None or not details.method.startswith("/farm."):
            return handler
        decode = _tolerant(handler.request_deserializer)
        encode = handler.response_serializer
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_checked_unary(handler.unary_unary), decode, encode)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_checked_unary_stream(handler.unary_stream), decode, encode)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_checked_stream(handler.stream_unary), decode, encode)
        return handler
