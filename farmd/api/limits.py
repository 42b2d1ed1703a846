"""What a call may cost farmd: how many may be open at once, how large each message may be.

grpc reads a request message whole before any handler sees it, up to the server's
``grpc.max_receive_message_length``; a longer one it refuses from its length prefix,
without reading it. That limit (``MAX_MESSAGE_BYTES``) is therefore what one open
call can make farmd hold, and it is set to the largest message any call needs (a
policy chunk). Each method then has its own limit (``message_limit``), checked
before the message is parsed: a run, an ack or a health check is kilobytes.

Below the messages, HTTP/2 lets a client send a stream's window ahead of any read.
grpc's default grows the windows to megabytes as soon as a client pushes data fast
(its bandwidth-delay probe), so callers nobody authenticated could park hundreds of
megabytes in farmd before a handler refused them. With the probe off (grpc-go and
grpc-java run fixed windows when told to) a stream holds 64 KiB until its message
is read, and a read opens the window to that message's size. Measured here, with
this message limit: 64 concurrent 3.7 MB health checks cost farmd +220 MB resident
with the probe, +2 MB without; a publish over a 40 ms round trip went from 100 MB/s
to 21 MB/s (a megabyte chunk per round trip), on loopback it is unchanged.

How many calls may be open at once is bounded per kind: the farm's own calls
(``max_calls``, the ``max_concurrent_calls`` setting; a trainer's stream counts for as
long as it is open) and the calls open to anyone (health, reflection) each have
room of their own, so watchers nobody authenticated cannot crowd out a trainer, and
the other way round. A call over its room is turned away before its request is read.
grpc's own bound (``server_bound``) covers both rooms and the calls being turned away.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from farmd.api.auth import is_open
from farmd.api.errors import abort
from farmd.api.refuse import refusal

POLICY_CHUNK_BYTES = 1 << 20
"""Policies travel in chunks of this size (both ways)."""

DEFAULT_MESSAGE_BYTES = 64 << 10
"""Every request but those below: names, numbers, a cursor."""

MAX_MESSAGE_BYTES = POLICY_CHUNK_BYTES + DEFAULT_MESSAGE_BYTES
"""The most grpc reads of one request message: a policy chunk with its header."""

_MESSAGE_LIMITS = {
    "/farm.v1.FarmService/PublishPolicy": MAX_MESSAGE_BYTES,
    "/farm.v1.NodeService/Work": MAX_MESSAGE_BYTES,  # a node's results, in pieces of at most this
    "/farm.v1.FarmService/Verify": MAX_MESSAGE_BYTES,  # completions to judge: farm_client splits larger batches
}

MAX_OPEN_CALLS = 16
"""Health checks and reflection open at once (anyone may make them: kept small)."""

_TURNING_AWAY = 64
"""Room in grpc's bound for calls on their way to being refused (no token, over a room)."""


def message_limit(method: str) -> int:
    """The largest request message ``method`` takes, in bytes."""
    return _MESSAGE_LIMITS.get(method, DEFAULT_MESSAGE_BYTES)


def server_options() -> list[tuple[str, int]]:
    """grpc server options that bound what a request can make farmd hold before it is read."""
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.http2.bdp_probe", 0)]


def server_bound(max_calls: int) -> int:
    """grpc's ``maximum_concurrent_rpcs`` for a farm that allows ``max_calls`` of its own calls."""
    return max_calls + MAX_OPEN_CALLS + _TURNING_AWAY


class _TooLarge:
    def __init__(self, size: int) -> None:
        self.size = size


class _Room:
    """Calls of one kind open now, at most ``limit``."""

    def __init__(self, limit: int, full: str) -> None:
        self.limit = limit
        self.open = 0
        self.full = refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, full, "TOO_MANY_CALLS")

    def enter(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def leave(self, _: object = None) -> None:
        self.open -= 1


class CallLimits(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Bounds open calls per kind and each method's messages (see the module's docstring).

    Runs after authentication: a caller without a token is turned away before it is counted.
    """

    def __init__(self, max_calls: int, max_open_calls: int = MAX_OPEN_CALLS) -> None:
        if max_calls < 1 or max_open_calls < 1:
            raise ValueError("a room for calls holds at least one")
        self._farm = _Room(max_calls, f"this farm has {max_calls} calls open, its max_concurrent_calls: "
                                      "try again when one ends, or raise the setting")
        self._open = _Room(max_open_calls, f"{max_open_calls} health or reflection calls are open: try again")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        task = asyncio.current_task()
        if handler is None or task is None:
            return handler
        room = self._open if is_open(details.method) else self._farm
        if not room.enter():
            return room.full
        # grpc runs each call, this interceptor included, in a task of its own that ends however the
        # call does: cancelled before its request arrived, refused, failed or finished.
        task.add_done_callback(room.leave)
        return _bounded(handler, details.method, message_limit(details.method))


def _bounded(handler: grpc.RpcMethodHandler[Any, Any], method: str, limit: int) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with each request message over ``limit`` bytes refused before it is parsed."""
    behaviors = (handler.unary_unary, handler.unary_stream, handler.stream_unary, handler.stream_stream)
    if not all(b is None or inspect.iscoroutinefunction(b) or inspect.isasyncgenfunction(b) for b in behaviors):
        return handler  # a synchronous handler runs in grpc's threads; farmd registers none
    decode = handler.request_deserializer

    def parse(raw: bytes) -> Any:
        if len(raw) > limit:
            return _TooLarge(len(raw))
        return decode(raw) if decode is not None else raw

    async def refuse(context: grpc.aio.ServicerContext[Any, Any], message: _TooLarge) -> None:
        await abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{method} takes messages of at most {limit} bytes; this one has {message.size}",
                    "MESSAGE_TOO_LARGE")

    encode = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_one(handler.unary_unary, refuse), parse, encode)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_one(handler.unary_stream, refuse), parse, encode)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_many(handler.stream_unary, refuse), parse, encode)
    both = handler.stream_stream
    assert both is not None
    return grpc.stream_stream_rpc_method_handler(_many(both, refuse), parse, encode)


_Refuse = Callable[[grpc.aio.ServicerContext[Any, Any], _TooLarge], Awaitable[None]]


def _one(behavior: Callable[..., Any], refuse: _Refuse) -> Callable[..., Any]:
    """A single-request behavior that refuses an oversized request. The wrapper keeps the behavior's
    kind (coroutine or async generator): grpc treats the two differently."""
    if inspect.isasyncgenfunction(behavior):
        async def replies(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if isinstance(request, _TooLarge):
                await refuse(context, request)
            async for reply in behavior(request, context):
                yield reply
        return replies

    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, _TooLarge):
            await refuse(context, request)
        return await behavior(request, context)
    return run


def _many(behavior: Callable[..., Any], refuse: _Refuse) -> Callable[..., Any]:
    """A streaming-request behavior that refuses the first oversized request it meets."""
    def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        async def each() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _TooLarge):
                    await refuse(context, request)
                yield request
        return each()

    if inspect.isasyncgenfunction(behavior):
        async def replies(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
                          ) -> AsyncIterator[Any]:
            async for reply in behavior(checked(requests, context), context):
                yield reply
        return replies

    async def run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await behavior(checked(requests, context), context)
    return run
