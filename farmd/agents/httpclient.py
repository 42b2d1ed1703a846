"""A minimal HTTP/1.1 client over asyncio streams: one JSON POST per connection.

farm talks to inference servers (vLLM, SGLang, any OpenAI-compatible API) with
nothing but the standard library: a request is one connection (``Connection:
close``), the response body is read by ``Content-Length``, by chunked transfer
coding or up to the end of the stream, within a size bound. Cancellation is
prompt (everything is a stream await) and always closes the connection; callers
bound the time with ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_HEADERS = 100
_LINE_LIMIT = 64 * 1024


class HttpError(Exception):
    """The exchange failed below HTTP semantics: no connection, a reset, a malformed or cut response."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    reason: str
    headers: dict[str, str]
    """Names in lower case; a repeated header keeps its last value."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Url:
    scheme: str
    host: str
    port: int
    path: str
    """The path prefix, without a trailing slash (``/v1``)."""

    @classmethod
    def parse(cls, url: str) -> Url:
        """``http(s)://host[:port][/path]``; ValueError for anything else."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{url!r}: the scheme must be http or https")
        if not parts.hostname:
            raise ValueError(f"{url!r}: no host")
        if parts.username or parts.password:
            raise ValueError(f"{url!r}: credentials in the URL are not supported (use key_env)")
        port = parts.port or (443 if parts.scheme == "https" else 80)  # .port raises ValueError if malformed
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def join(self, path: str) -> str:
        return f"{self.path}/{path.lstrip('/')}"

    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority()}{self.path}"


async def post_json(url: Url, path: str, payload: Any, headers: dict[str, str] | None = None, *,
                    max_body_bytes: int = MAX_BODY_BYTES) -> HttpResponse:
    """POST ``payload`` as JSON to ``url`` + ``path``; the response, whatever its status.

    Raises HttpError for transport failures. Not bounded in time: wrap it in ``asyncio.timeout``.
    """
    body = json.dumps(payload).encode()
    head = [f"POST {url.join(path)} HTTP/1.1", f"Host: {url.authority()}", "Content-Type: application/json",
            "Accept: application/json", f"Content-Length: {len(body)}", "Connection: close",
            "User-Agent: farmd"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
    context = ssl.create_default_context() if url.scheme == "https" else None
    try:
        reader, writer = await asyncio.open_connection(url.host, url.port, ssl=context, limit=_LINE_LIMIT)
    except (OSError, ValueError) as exc:
        raise HttpError(f"cannot connect to {url}: {exc or type(exc).__name__}") from exc
    try:
        writer.write(request)
        await writer.drain()
        return await _read_response(reader, max_body_bytes)
    except (OSError, ValueError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise HttpError(f"{url}: {type(exc).__name__}: {exc}") from exc
    finally:
        writer.close()
        # A peer that never finishes closing (TLS) must not hold the caller; the transport is closed anyway.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


async def _read_response(reader: asyncio.StreamReader, max_body_bytes: int) -> HttpResponse:
    while True:
        line = await _line(reader)
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {line[:100]!r}")
        status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
        headers = await _headers(reader)
        if not 100 <= status < 200:  # an interim response (100 Continue) is followed by the real one
            break
    if status in (204, 304):
        return HttpResponse(status, reason, headers, b"")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _chunked(reader, max_body_bytes)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if not 0 <= length <= max_body_bytes:
            raise ValueError(f"a response body of {length} bytes (the bound is {max_body_bytes})")
        body = await reader.readexactly(length)
    else:
        body = await _until_eof(reader, max_body_bytes)
    return HttpResponse(status, reason, headers, body)


async def _until_eof(reader: asyncio.StreamReader, max_body_bytes: int) -> bytes:
    body = bytearray()
    while data := await reader.read(64 * 1024):
        body += data
        if len(body) > max_body_bytes:
            raise ValueError(f"a response body over {max_body_bytes} bytes")
    return bytes(body)


async def _line(reader: asyncio.StreamReader) -> str:
    raw = await reader.readuntil(b"\n")
    return raw.decode("latin-1").rstrip("\r\n")


async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    while True:
        line = await _line(reader)
        if not line:
            return headers
        if len(headers) >= MAX_HEADERS:
            raise ValueError(f"more than {MAX_HEADERS} headers")
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"a malformed header line: {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()


async def _chunked(reader: asyncio.StreamReader, max_body_bytes: int) -> bytes:
    body = bytearray()
    while True:
        size_line = await _line(reader)
        size = int(size_line.split(";", 1)[0].strip(), 16)
        if size < 0:
            raise ValueError("a negative chunk size")
        if size == 0:
            await _headers(reader)  # trailers, up to the blank line
            return bytes(body)
        if len(body) + size > max_body_bytes:
            raise ValueError(f"a response body over {max_body_bytes} bytes")
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("a chunk not followed by CRLF")
