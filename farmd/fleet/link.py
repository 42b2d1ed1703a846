"""A node's one connection to its coordinator: NodeService.Work, kept open, reopened when it drops.

``run`` connects, says hello, and waits for the welcome; then ``request`` sends one message and waits
for the reply that names it. When the stream ends (the coordinator restarted, the network dropped) every
request waiting on it fails with ``LinkDown`` and ``run`` connects again after a backoff, forever: a node
outlives its coordinator's restarts. Only a refusal that trying again cannot change (a wrong credential,
the wrong role, a host that cannot isolate, a name that is taken when the node first joins) ends ``run``,
with ``JoinRefused``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
from farm.v1 import node_pb2, node_pb2_grpc
from grpc_status import rpc_status

from farmd.errors import JoinRefused, LinkDown, RequestFailed

log = logging.getLogger("farmd.fleet")

_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc's stubs lack it

_BACKOFF_MIN_S = 0.2
_BACKOFF_MAX_S = 5.0
_REQUEST_TIMEOUT_S = 60.0
_PERMANENT = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
              grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT}
"""Refusals no reconnect changes."""
NAME_TAKEN_S = 90.0
"""How long a name the coordinator says is taken is tried again before the node gives up. Usually it is this
node's own earlier connection (a machine rebooted faster than its coordinator noticed) and clears once the
coordinator marks it lost; a second live node under the same name never clears, and is refused then."""

CHANNEL_OPTIONS = [
    # A coordinator that vanished without closing the connection is noticed within about a minute.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.max_receive_message_length", 64 << 20),
]


def _reason(exc: grpc.aio.AioRpcError) -> str:
    with contextlib.suppress(Exception):
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
        if status is not None:
            return str(status.message)
    return str(exc.details() or exc.code().name)


class Link:
    """``hello()`` builds the hello for each connection; ``on_connect(welcome)`` runs after each welcome
    (it may make requests: resend buffered results)."""

    def __init__(self, target: str, hello: Callable[[], node_pb2.NodeHello], *,
                 on_connect: Callable[[node_pb2.Welcome, bool], Coroutine[Any, Any, None]],
                 credentials: grpc.ChannelCredentials | None = None, token: str | None = None,
                 server_name: str | None = None) -> None:
        self.target = target
        self._hello = hello
        self._on_connect = on_connect
        self._credentials = credentials
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = [*CHANNEL_OPTIONS, *([("grpc.ssl_target_name_override", server_name)] if server_name else [])]
        self.connected = asyncio.Event()
        self.welcome: node_pb2.Welcome | None = None
        self.welcomed = asyncio.Event()
        """Set at the first welcome: the node has the verifier key and may start its worker."""
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[node_pb2.WorkResponse]] = {}
        self._queue: asyncio.Queue[node_pb2.WorkRequest | None] | None = None
        self._closing = False
        self._channel: grpc.aio.Channel | None = None
        self.connections = 0

    def channel(self) -> grpc.aio.Channel:
        """A new channel to the coordinator, with this node's TLS settings."""
        if self._credentials is not None:
            return grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
        return grpc.aio.insecure_channel(self.target, options=self._options)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def run(self) -> None:
        backoff = _BACKOFF_MIN_S
        taken_since: float | None = None
        while not self._closing:
            connections = self.connections
            try:
                await self._session()
            except JoinRefused:
                raise
            except grpc.aio.AioRpcError as exc:
                taken = exc.code() == grpc.StatusCode.ALREADY_EXISTS
                taken_since = (taken_since or time.monotonic()) if taken else None
                if exc.code() in _PERMANENT or (taken_since is not None and
                                                time.monotonic() - taken_since > NAME_TAKEN_S):
                    raise JoinRefused(f"the coordinator at {self.target} refused this node ({exc.code().name}): "
                                      f"{_reason(exc)}") from None
                log.warning("coordinator %s: %s; trying again in %.1fs", self.target, _reason(exc), backoff,
                            extra={"event": "link_down", "code": exc.code().name})
            except (OSError, LinkDown) as exc:
                log.warning("coordinator %s: %s; trying again in %.1fs", self.target, exc, backoff)
            if self._closing:
                break
            if self.connections > connections:
                backoff = _BACKOFF_MIN_S  # it was welcomed: this drop starts a new series of tries
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(_BACKOFF_MAX_S, backoff * 2)

    async def _session(self) -> None:
        queue: asyncio.Queue[node_pb2.WorkRequest | None] = asyncio.Queue()

        async def outgoing() -> AsyncIterator[node_pb2.WorkRequest]:
            while (message := await queue.get()) is not None:
                yield message

        channel = self._channel = self.channel()
        hook: asyncio.Task[None] | None = None
        try:
            call: Any = node_pb2_grpc.NodeServiceStub(channel).Work(outgoing(), metadata=self._metadata)
            queue.put_nowait(node_pb2.WorkRequest(id=next(self._ids), hello=self._hello()))
            first = await call.read()
            if first is _EOF or first.WhichOneof("kind") != "welcome":
                raise LinkDown("the coordinator ended the stream without a welcome")
            first_time = self.welcome is None
            self.welcome = first.welcome
            self._queue = queue
            self.connections += 1
            self.connected.set()
            self.welcomed.set()
            log.info("joined %s as %s (connection %d)", self.target, first.welcome.name, self.connections,
                     extra={"event": "joined", "coordinator": self.target})
            hook = asyncio.get_running_loop().create_task(self._on_connect(first.welcome, first_time))
            while (reply := await call.read()) is not _EOF:
                waiting = self._pending.pop(reply.reply_to, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(reply)
            raise LinkDown("the coordinator ended the stream")
        finally:
            self.connected.clear()
            self._queue = None
            queue.put_nowait(None)
            for waiting in self._pending.values():
                if not waiting.done():
                    waiting.set_exception(LinkDown("the connection to the coordinator dropped"))
            self._pending.clear()
            if hook is not None:
                hook.cancel()
                await asyncio.gather(hook, return_exceptions=True)
            await channel.close(None)
            self._channel = None

    async def request(self, timeout_s: float = _REQUEST_TIMEOUT_S, **kind: Any) -> node_pb2.WorkResponse:
        """Send one request (``lease=LeaseRequest(...)``, ...) and wait for its reply."""
        queue = self._queue
        if queue is None:
            raise LinkDown("not connected to the coordinator")
        message_id = next(self._ids)
        waiting: asyncio.Future[node_pb2.WorkResponse] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = waiting
        queue.put_nowait(node_pb2.WorkRequest(id=message_id, **kind))
        try:
            reply = await asyncio.wait_for(waiting, timeout_s)
        except TimeoutError:
            raise LinkDown(f"the coordinator did not answer within {timeout_s:.0f}s") from None
        finally:
            self._pending.pop(message_id, None)
        if reply.error:
            raise RequestFailed(reply.error)
        return reply

    async def close(self) -> None:
        self._closing = True
        if self._queue is not None:
            self._queue.put_nowait(None)
        if self._channel is not None:
            await self._channel.close(None)
