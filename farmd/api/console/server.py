"""farmd's web console: a page and its assets, and the gateway's calls, on one HTTP port.

aiohttp on farmd's own event loop: a console call is a coroutine beside the gRPC server's, parsed and
serialized off the loop (``gateway``). The page is static (``static/``: HTML, JS and CSS that ship in
the package, no build step, nothing fetched from elsewhere), and everything it shows comes from the
calls. Every reply forbids the browser to run anything but the page's own files
(``Content-Security-Policy``), so text an attempt or a contributor wrote is shown, never run.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from farmd.api.console.gateway import Answer, Gateway
from farmd.api.http_site import HttpSite

log = logging.getLogger("farmd.api.console")

STATIC_DIR = Path(__file__).with_name("static")
MAX_REQUEST_BYTES = 256 << 10
"""A console call's body is a request message: filters, a note, an id. Anything bigger is refused unread."""
_ASSETS = {"app.js": "text/javascript", "plot.js": "text/javascript", "style.css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class ConsoleServer:
    def __init__(self, gateway: Gateway, listen: str) -> None:
        self._gateway = gateway
        self._site = HttpSite(listen, "the console", "--http")

    @property
    def address(self) -> str:
        return self._site.address

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[self._guard])
        app.on_response_prepare.append(_secure)  # every reply, the router's own 404s and 405s too
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._asset)
        app.router.add_get("/api/v1/whoami", self._whoami)
        app.router.add_post("/api/v1/{service}/{method}", self._call)
        await self._site.start(app)

    async def stop(self) -> None:
        await self._site.stop()

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if self._gateway.read_only and not _local_name(request.host, self._site.host):
            # A farm without credentials trusts whoever reaches it; a page on another site that points its
            # own name at this address (DNS rebinding) must not be one of them.
            return _json(Answer(421, '{"code": "MISDIRECTED", "reason": "MISDIRECTED", '
                                     '"message": "this console answers its own address only"}'))
        return await handler(request)

    async def _page(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Content-Type": "text/html; charset=utf-8",
                                                                   "Cache-Control": "no-cache"})

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        kind = _ASSETS.get(name)
        if kind is None:
            raise web.HTTPNotFound(text="no such asset")
        return web.FileResponse(STATIC_DIR / name, headers={"Content-Type": f"{kind}; charset=utf-8",
                                                           "Cache-Control": "no-cache"})

    async def _whoami(self, request: web.Request) -> web.StreamResponse:
        return _json(self._gateway.whoami(request.headers.get("Authorization")))

    async def _call(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            # A form on another site can post text/plain without asking: only JSON is a console call.
            return _json(Answer(415, '{"code": "INVALID_ARGUMENT", "reason": "UNSUPPORTED_MEDIA_TYPE", '
                                     '"message": "a console call is a JSON body (Content-Type: application/json)"}'))
        path = f"{request.match_info['service']}/{request.match_info['method']}"
        authorization = request.headers.get("Authorization")
        answer = self._gateway.refusal(path, authorization)
        if answer is None:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _json(Answer(413, '{"code": "RESOURCE_EXHAUSTED", "reason": "TOO_LARGE", '
                                         f'"message": "a console call is at most {MAX_REQUEST_BYTES} bytes"}}'))
            answer = await self._gateway.call(path, body, authorization)
        return _json(answer)


async def _secure(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(_HEADERS)


def _json(answer: Answer) -> web.Response:
    return web.Response(status=answer.status, text=answer.body, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def _local_name(host_header: str | None, listen_host: str) -> bool:
    """Whether a request's Host names this console: an address, localhost, or the name it listens on."""
    if not host_header:
        return False
    name = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    name = name.strip("[]").lower()
    if name in {"localhost", listen_host.lower(), socket.gethostname().lower()}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
