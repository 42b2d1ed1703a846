"""A real HTTP server on port 0 that plays an OpenAI-compatible chat endpoint, with scripted misbehaviour.

    async with fake_endpoint(responder) as ep:
        ep.script.extend([Reply.status(500), Reply.hang(), Reply.text("```sh\\nls\\n```")])
        ... ep.url ... ep.calls ... ep.requests

Each request to ``/v1/chat/completions`` takes the next scripted ``Reply`` or, when
the script is empty, ``responder(request_json)``. JSON replies keep the connection
open for the next request (``ep.connections`` counts them); raw and closing replies
end it. Everything it starts is cancelled and closed on exit.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class Reply:
    kind: Literal["json", "chunked", "raw", "hang", "close"] = "json"
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def text(cls, content: str | None, *, prompt_tokens: int = 11, completion_tokens: int = 7, chunked: bool = False,
             finish_reason: str = "stop", token_ids: list[int] | None = None,
             prompt_token_ids: list[int] | None = None, logprobs: list[float] | None = None,
             ids_as_tokens: bool = False, tool_calls: list[tuple[str, str, str]] | None = None,
             choices: list[str] | None = None) -> Reply:
        """A completion as vLLM writes it: ``token_ids`` on each choice and ``prompt_token_ids`` at the top
        (vLLM's return_token_ids), ``logprobs.content`` per token (with ``ids_as_tokens``, tokens written
        ``token_id:N`` and no ``token_ids``: return_tokens_as_token_ids), ``tool_calls`` as ``(id, name,
        arguments)``, and ``choices`` (texts) for a reply with several choices."""
        texts = choices if choices is not None else [content]
        listed = []
        for index, text in enumerate(texts):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls is not None:
                message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                         for i, n, a in tool_calls]
            choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish_reason}
            if token_ids is not None and not ids_as_tokens:
                choice["token_ids"] = [t + 1000 * index for t in token_ids]
            if logprobs is not None:
                tokens = [f"token_id:{t}" for t in token_ids or []] if ids_as_tokens \
                    else [f"t{i}" for i in range(len(logprobs))]
                choice["logprobs"] = {"content": [{"token": token, "logprob": lp, "bytes": list(token.encode()),
                                                   "top_logprobs": []} for token, lp in zip(tokens, logprobs,
                                                                                            strict=True)]}
            listed.append(choice)
        body: dict[str, Any] = {
            "id": "cmpl-1", "object": "chat.completion", "model": "fake", "choices": listed,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens * len(texts),
                      "total_tokens": prompt_tokens + completion_tokens * len(texts)}}
        if prompt_token_ids is not None:
            body["prompt_token_ids"] = prompt_token_ids
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
        self.connections = 0
        self.gets: list[str] = []
        """Paths of GET requests (health checks, weight labels), which are not counted in ``requests``."""
        self.labels: deque[str] = deque()
        """What ``GET /weight_info`` answers next (``weight_version``); empty: 404, a server that cannot say."""
        self.label = ""
        """What it answers once ``labels`` is empty ("": 404)."""
        self.health = Reply("json", 200, {})
        """What ``GET /health`` answers (``Reply.hang()``: a server that hangs)."""
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
        posted = False
        try:
            while request_line := (await reader.readline()).decode():
                headers: dict[str, str] = {}
                while (line := (await reader.readline()).decode().strip()):
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method, path = request_line.split(" ")[:2]
                if method == "GET":  # the client's health checks and weight-label reads: not requests
                    self.gets.append(path)
                    answer = self.get_reply(path)
                    if answer.kind == "hang":
                        await reader.read()
                        break
                    if not await self._send(answer, writer):
                        break
                    continue
                if not posted:  # a connection that carried a request (health checks open their own)
                    posted = True
                    self.connections += 1
                self.paths.append(path)
                self.headers.append(headers)
                self.requests.append(json.loads(body))
                self.arrived.set()
                if path != "/v1/chat/completions":
                    reply = Reply.error(404, f"no route {path}")
                else:
                    reply = self.script.popleft() if self.script else self.responder(self.requests[-1])
                if reply.kind == "hang":
                    await reader.read()  # no reply, ever: until the client gives up and closes
                    break
                if not await self._send(reply, writer):
                    break
        except ConnectionError:
            pass  # the client went away: nothing to answer
        finally:
            writer.close()
            self._handlers.discard(task)

    def get_reply(self, path: str) -> Reply:
        if path == "/health":
            return self.health
        if path == "/weight_info":
            label = self.labels.popleft() if self.labels else self.label
            return Reply("json", 200, {"weight_version": label}) if label else Reply.error(404, "no route")
        return Reply.error(404, f"no route {path}")

    async def _send(self, reply: Reply, writer: asyncio.StreamWriter) -> bool:
        """Send ``reply``; whether the connection stays open for another request."""
        if reply.kind == "close":
            return False
        if reply.kind == "raw":
            writer.write(reply.body)
            await writer.drain()
            return False
        data = json.dumps(reply.body).encode()
        head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Whatever')}",
                "Content-Type: application/json"]
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
        return True

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


@contextmanager
def threaded_endpoint(responder: Callable[[dict[str, Any]], Reply] | None = None) -> Iterator[FakeEndpoint]:
    """``fake_endpoint`` on a loop of its own thread: for a farmd in another process to call while the test waits."""
    ready = threading.Event()
    found: list[FakeEndpoint] = []
    stop = threading.Event()

    async def serve() -> None:
        async with fake_endpoint(responder) as ep:
            found.append(ep)
            ready.set()
            await asyncio.to_thread(stop.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield found[0]
    finally:
        stop.set()
        thread.join(10)
