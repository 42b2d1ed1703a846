"""A real HTTP server on port 0 that plays an OpenAI-compatible chat endpoint, with scripted misbehaviour.

    async with fake_endpoint(responder) as ep:
        ep.script.extend([Reply.status(500), Reply.hang(), Reply.text("```sh\\nls\\n```")])
        ... ep.url ... ep.calls ... ep.requests

Each request to ``/v1/chat/completions`` takes the next scripted ``Reply`` or, when
the script is empty, ``responder(request_json)``. Everything it starts is cancelled
and closed on exit.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class Reply:
    kind: Literal["json", "chunked", "raw", "hang", "close"] = "json"
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, content: str, *, prompt_tokens: int = 11, completion_tokens: int = 7, chunked: bool = False,
             finish_reason: str = "stop") -> Reply:
        body = {"id": "cmpl-1", "object": "chat.completion", "model": "fake",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": finish_reason}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}
        return cls("chunked" if chunked else "json", 200, body)

    @classmethod
    def error(cls, status: int, message: str = "nope", **headers: str) -> Reply:
        return cls("json", status, {"error": {"message": message}}, dict(headers))

    @classmethod
    def raw(cls, data: bytes) -> Reply:
        return cls("raw", body=data)

    @classmethod
    def hang(cls) -> Reply:
        return cls("hang")

    @classmethod
    def close(cls) -> Reply:
        return cls("close")


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


class FakeEndpoint:
    def __init__(self, responder: Callable[[dict[str, Any]], Reply] | None) -> None:
        self.responder = responder or (lambda request: Reply.text("hello"))
        self.script: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.port = 0
        self.arrived = asyncio.Event()
        """Set once a request has been read."""
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            request_line = (await reader.readline()).decode()
            headers: dict[str, str] = {}
            while (line := (await reader.readline()).decode().strip()):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            path = request_line.split(" ")[1]
            self.paths.append(path)
            self.headers.append(headers)
            self.requests.append(json.loads(body))
            self.arrived.set()
            if path != "/v1/chat/completions":
                reply = Reply.error(404, f"no route {path}")
            else:
                reply = self.script.popleft() if self.script else self.responder(self.requests[-1])
            await self._send(reply, writer)
        finally:
            writer.close()
            self._handlers.discard(task)

    async def _send(self, reply: Reply, writer: asyncio.StreamWriter) -> None:
        if reply.kind == "hang":
            await asyncio.sleep(3600)
        if reply.kind == "close":
            return
        if reply.kind == "raw":
            writer.write(reply.body)
            await writer.drain()
            return
        data = json.dumps(reply.body).encode()
        head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Whatever')}",
                "Content-Type: application/json", "Connection: close"]
        head += [f"{k.replace('_', '-')}: {v}" for k, v in reply.headers.items()]
        if reply.kind == "chunked":
            head.append("Transfer-Encoding: chunked")
            chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(data[i:i + 7]), data[i:i + 7])
                              for i in range(0, len(data), 7))
            payload = chunks + b"0\r\nX-Trailer: yes\r\n\r\n"
        else:
            head.append(f"Content-Length: {len(data)}")
            payload = data
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()

    async def stop(self) -> None:
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)


@asynccontextmanager
async def fake_endpoint(responder: Callable[[dict[str, Any]], Reply] | None = None) -> AsyncIterator[FakeEndpoint]:
    endpoint = FakeEndpoint(responder)
    server = await asyncio.start_server(endpoint.handle, "127.0.0.1", 0)
    endpoint.port = server.sockets[0].getsockname()[1]
    try:
        yield endpoint
    finally:
        server.close()
        await endpoint.stop()
        await server.wait_closed()
