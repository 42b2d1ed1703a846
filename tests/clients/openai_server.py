"""A real OpenAI-compatible chat server on port 0 that answers like vLLM, with token ids and logprobs.

    with openai_server(lambda messages: "<answer>4</answer>") as server:
        ... server.url ... server.requests ...

Its "tokenizer" is byte-level: token ``b`` (0-255) is the byte ``b``, and five special tokens mark roles
and ends. The chat template writes each message as ``[ROLE] + UTF-8 bytes of content + [END]`` and a
generation prompt of ``[ASSISTANT]``; a completion is the reply's bytes then ``[END]``. So the next turn's
prompt always starts with this turn's prompt and completion tokens (the prefix property a trainer relies
on), and tests can check token ids by decoding them. Each token's logprob is ``logprob(position, token)``:
distinct and known, so a test can compare what the farm stored with what was sent.

As vLLM does, it returns ``choices[i].token_ids`` and a top-level ``prompt_token_ids`` only when asked
(``"return_token_ids": true``) and ``choices[i].logprobs.content`` only with ``"logprobs": true``; with
``"return_tokens_as_token_ids": true`` each logprob entry's ``token`` is ``"token_id:N"``.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SPECIAL = {"system": 256, "user": 257, "assistant": 258, "tool": 259}
END = 260
NAMES = {**{v: f"<|{k}|>" for k, v in SPECIAL.items()}, END: "<|end|>"}

Responder = Callable[[list[dict[str, Any]]], str]
"""The reply's text, given the request's messages (called once per choice)."""


def encode_message(message: dict[str, Any]) -> list[int]:
    return [SPECIAL[message["role"]], *message.get("content", "").encode(), END]


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The chat template applied to ``messages``, with the generation prompt."""
    return [token for m in messages for token in encode_message(m)] + [SPECIAL["assistant"]]


def completion_ids(text: str) -> list[int]:
    return [*text.encode(), END]


def decode(ids: list[int]) -> str:
    """The text of byte tokens; special tokens dropped (as ``skip_special_tokens`` does)."""
    return bytes(i for i in ids if i < 256).decode(errors="replace")


def logprob(position: int, token: int) -> float:
    """The sampling logprob the server reports for ``token`` at ``position`` of a completion."""
    return -round(0.01 * (position + 1) + token * 1e-5, 6)


def token_text(token: int) -> str:
    return NAMES.get(token) or bytes([token]).decode("latin-1")


class Server:
    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(request)
            number = next(self._ids)
        messages = request["messages"]
        prompt = prompt_ids(messages)
        max_tokens = int(request.get("max_tokens") or 1 << 30)
        choices = []
        completion_tokens = 0
        for index in range(int(request.get("n") or 1)):
            ids = completion_ids(self.responder(messages))
            finish = "stop"
            if len(ids) > max_tokens:
                ids, finish = ids[:max_tokens], "length"
            completion_tokens += len(ids)
            choice: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": decode(ids)},
                                      "finish_reason": finish, "logprobs": None}
            if request.get("logprobs"):
                as_ids = request.get("return_tokens_as_token_ids")
                choice["logprobs"] = {"content": [
                    {"token": f"token_id:{t}" if as_ids else token_text(t), "logprob": logprob(i, t),
                     "bytes": [t] if t < 256 else list(NAMES[t].encode()), "top_logprobs": []}
                    for i, t in enumerate(ids)]}
            if request.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        body: dict[str, Any] = {
            "id": f"chatcmpl-{number}", "object": "chat.completion", "created": 0, "model": request.get("model"),
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt) + completion_tokens}}
        if request.get("return_token_ids"):
            body["prompt_token_ids"] = prompt
        return body


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            request = json.loads(self.rfile.read(length))
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            self._send(200, server.complete(request))

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's output is for the test

    return Handler


@contextmanager
def openai_server(responder: Responder) -> Iterator[Server]:
    """Serve on 127.0.0.1, port 0, from a thread; shut down and closed on exit."""
    server = Server(responder)
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    http.daemon_threads = True
    server.port = http.server_address[1]
    thread = threading.Thread(target=http.serve_forever, name="openai-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        http.shutdown()
        http.server_close()
        thread.join()
