"""Atropos's HTTP API (atroposlib 0.4.0), served by farmd (``farmd serve --atropos HOST:PORT``).

The same paths, request and response bodies and status codes as atroposlib's own server, so its
environments and trainers switch by changing the URL. What stands behind them is farm's: the queue is
in the store (``farmd.atropos.queue``) and survives restarts; pushed groups are checked before they are
kept (``farmd.atropos.groups``: 422 with FastAPI's ``detail`` shape when they do not hold together);
bodies are bounded before they are read, gzip bodies inflated within a bound, and JSON parsed and
written off the event loop. With credentials configured, a call carries a bearer token: a ``trainer``
registers and takes batches, an ``environment`` registers and pushes groups, an ``operator`` may do
both. What a credential registers is its own (``farmd.atropos.queue``): the trainer registration (batches and
resets are its credential's) and each environment id (pushes under it, its disconnect and its status); another
credential is refused with 403 and the ``detail`` naming who holds it. Without, anyone may, as with Atropos.
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from farmd.api.auth import OPERATOR, TRAINER, bearer_token, credential_for
from farmd.api.budget import Budgets
from farmd.api.http_site import HttpSite, body_counted
from farmd.atropos import groups
from farmd.atropos.queue import AtroposQueue
from farmd.config import Credential
from farmd.errors import AtroposInvalid, BudgetExhausted, FarmError, Forbidden, NotFound

log = logging.getLogger("farmd.api.atropos")

ENVIRONMENT = "environment"
MAX_BODY_BYTES = 64 << 20
"""A request as sent (compressed or not)."""
MAX_INFLATED_BYTES = 256 << 20
"""A gzip body once inflated: a small body that inflates without end is refused, not followed."""
MAX_PARSING = 2
"""Pushes inflated and checked at once: a 256 MiB body is gigabytes as Python lists while it is checked, so
more wait their turn (the work is CPU-bound on farmd's cores anyway)."""
GZIP_AT_BYTES = 1000
"""Replies this long or longer go gzipped to a client that accepts it (as Atropos's GZipMiddleware)."""

_TRAINERS = frozenset({OPERATOR, TRAINER})
_ENVIRONMENTS = frozenset({OPERATOR, ENVIRONMENT})
_EITHER = _TRAINERS | _ENVIRONMENTS
_CALLER = web.RequestKey("farm_credential", str)
"""Where a request keeps the name of the credential that made it (absent: the farm has none)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AtroposServer:
    def __init__(self, queue: AtroposQueue, listen: str, credentials: Iterable[Credential],
                 budgets: Budgets | None = None) -> None:
        self._queue = queue
        self._site = HttpSite(listen, "the Atropos API", "--atropos")
        self._credentials = tuple(credentials)
        self._budgets = budgets or Budgets(self._credentials)
        """A request's body counts against its credential while it is read, inflated, checked and queued."""
        self._parsing = asyncio.Semaphore(MAX_PARSING)

    @property
    def address(self) -> str:
        return self._site.address

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        routes: list[tuple[str, str, frozenset[str], Handler]] = [
            ("GET", "/", _EITHER, self._root),
            ("POST", "/register", _TRAINERS, self._register),
            ("POST", "/register-env", _ENVIRONMENTS, self._register_env),
            ("POST", "/disconnect-env", _ENVIRONMENTS, self._disconnect_env),
            ("GET", "/wandb_info", _EITHER, self._wandb_info),
            ("GET", "/info", _EITHER, self._info),
            ("GET", "/batch", _TRAINERS, self._batch),
            ("GET", "/latest_example", _EITHER, self._latest_example),
            ("POST", "/scored_data", _ENVIRONMENTS, self._scored_data),
            ("POST", "/scored_data_list", _ENVIRONMENTS, self._scored_data_list),
            ("GET", "/status", _EITHER, self._status),
            ("GET", "/status-env", _ENVIRONMENTS, self._status_env),
            ("GET", "/reset_data", _TRAINERS, self._reset_data),
        ]
        for method, path, roles, handler in routes:
            app.router.add_route(method, path, self._guarded(roles, handler))
        # Bodies are inflated here, within a bound and off the event loop (``_body``), not by aiohttp.
        await self._site.start(app, auto_decompress=False)

    async def stop(self) -> None:
        await self._site.stop()

    def _guarded(self, roles: frozenset[str], handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            header = request.headers.get("Authorization")
            if self._credentials:
                caller = credential_for(self._credentials, (("authorization", header),) if header else ())
                if caller is None:
                    return _detail(401, "this farm needs a token: send Authorization: Bearer TOKEN")
                if not caller.roles & roles:
                    return _detail(403, f"credential {caller.name!r} ({', '.join(sorted(caller.roles))}) may not call "
                                        f"{request.path}: it needs {' or '.join(sorted(roles))}")
                request[_CALLER] = caller.name
            try:
                token = bearer_token((("authorization", header),) if header else ())
                async with body_counted(self._budgets, token, request, MAX_BODY_BYTES):
                    return await handler(request)
            except BudgetExhausted as exc:
                return _detail(429, str(exc))
            except AtroposInvalid as exc:
                return _reply(request, {"detail": exc.detail()}, status=422)
            except NotFound as exc:
                return _detail(404, str(exc))
            except Forbidden as exc:  # a name another credential holds
                return _detail(403, str(exc))
            except _Refused as exc:
                return exc.response
            except FarmError as exc:
                return _detail(400, str(exc))
        return guarded

    # -- the routes ----------------------------------------------------------------------------------

    async def _root(self, request: web.Request) -> web.StreamResponse:
        return _reply(request, {"message": "AtroposLib API"})

    async def _register(self, request: web.Request) -> web.StreamResponse:
        registration = await asyncio.to_thread(groups.registration, await _body(request))
        return _reply(request, await self._queue.register(registration, _owner(request)))

    async def _register_env(self, request: web.Request) -> web.StreamResponse:
        wanted = await asyncio.to_thread(groups.env_registration, await _body(request))
        return _reply(request, await self._queue.register_env(wanted, _owner(request)))

    async def _disconnect_env(self, request: web.Request) -> web.StreamResponse:
        env_id = await asyncio.to_thread(groups.env_id, await _body(request))
        return _reply(request, await self._queue.disconnect_env(env_id, _owner(request)))

    async def _wandb_info(self, request: web.Request) -> web.StreamResponse:
        return _reply(request, self._queue.wandb_info())

    async def _info(self, request: web.Request) -> web.StreamResponse:
        return _reply(request, self._queue.info())

    async def _batch(self, request: web.Request) -> web.StreamResponse:
        return await _reply_large(request, await self._queue.batch(_owner(request)))

    async def _latest_example(self, request: web.Request) -> web.StreamResponse:
        return await _reply_large(request, await self._queue.latest_example())

    async def _scored_data(self, request: web.Request) -> web.StreamResponse:
        (answer,), _refused = await self._push(request, many=False)
        return _reply(request, answer)

    async def _scored_data_list(self, request: web.Request) -> web.StreamResponse:
        """Atropos's answer for the groups kept. atroposlib has no answer for a list kept in part (it refuses a
        list whole), so when some groups are refused the reply is a 422 whose ``detail`` names each refused
        group's place and why (FastAPI's shape), beside the usual counts of the groups kept: the others were
        stored. atroposlib's environments do not resend a list on a 4xx, so nothing is pushed twice."""
        answers, refused = await self._push(request, many=True)
        buffered = [a for a in answers if a["status"] == "buffered"]
        reply: dict[str, Any] = {"status": "received", "groups_processed": len(answers)}
        if buffered:
            reply["buffered"] = len(buffered)
            reply["last_buffer_size"] = buffered[-1]["buffer_size"]
        if not refused:
            return _reply(request, reply)
        log.warning("Atropos push: %d of %d groups refused (%s), the others kept", len(refused),
                    len(refused) + len(answers), refused[0].message[:300],
                    extra={"event": "atropos_refused", "refused": len(refused), "kept": len(answers)})
        reply.update(status="partial", refused=[exc.loc[0] for exc in refused],
                     detail=[d for exc in refused for d in exc.detail()])
        return _reply(request, reply, status=422)

    async def _push(self, request: web.Request, *, many: bool) -> tuple[list[dict[str, Any]], list[AtroposInvalid]]:
        """The groups kept (the queue's answer for each) and the groups refused, each with its place and why."""
        sent = await _read(request)
        async with self._parsing:
            checked = await asyncio.to_thread(groups.scored_groups, await _inflated(request, sent), many=many)
        kept = [c for c in checked if isinstance(c, groups.Checked)]
        refused = [c for c in checked if isinstance(c, AtroposInvalid)]
        return (await self._queue.push(kept, owner=_owner(request)) if kept else []), refused

    async def _status(self, request: web.Request) -> web.StreamResponse:
        return _reply(request, self._queue.status())

    async def _status_env(self, request: web.Request) -> web.StreamResponse:
        env_id = await asyncio.to_thread(groups.env_id, await _body(request))
        return _reply(request, await self._queue.status_env(env_id, _owner(request)))

    async def _reset_data(self, request: web.Request) -> web.StreamResponse:
        dropped = await self._queue.reset(_owner(request))
        log.info("Atropos reset: %d groups dropped from the queue (kept in the store)", dropped,
                 extra={"event": "atropos_reset", "dropped": dropped})
        return web.Response(text="Reset successful", content_type="text/plain")


def _owner(request: web.Request) -> str | None:
    """The credential that made ``request``, whose names it may use (None: the farm has no credentials)."""
    return request.get(_CALLER)


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


async def _body(request: web.Request) -> bytes:
    """The request's body, inflated if it came gzipped; refused past the bounds before it is all read."""
    return await _inflated(request, await _read(request))


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _Refused(_detail(413, f"a request is at most {MAX_BODY_BYTES} bytes")) from None


async def _inflated(request: web.Request, body: bytes) -> bytes:
    if "gzip" not in request.headers.get("Content-Encoding", "").lower() or not body:
        return body
    try:
        return await asyncio.to_thread(_inflate, body)
    except _TooLarge:
        raise _Refused(_detail(413, f"a request inflates to at most {MAX_INFLATED_BYTES} bytes")) from None
    except (zlib.error, EOFError):
        raise _Refused(web.Response(status=400, text="Invalid gzip payload", content_type="text/plain")) from None


class _TooLarge(Exception):
    pass


def _inflate(body: bytes) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, MAX_INFLATED_BYTES + 1)
    if len(out) > MAX_INFLATED_BYTES or inflater.unconsumed_tail:
        raise _TooLarge
    if not inflater.eof:
        raise EOFError("a gzip body cut short")
    return out


def _detail(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


def _reply(request: web.Request, value: Any, status: int = 200) -> web.Response:
    return _compressed(request, web.Response(status=status, body=json.dumps(value).encode(),
                                             content_type="application/json"))


async def _reply_large(request: web.Request, value: dict[str, Any] | bytes) -> web.Response:
    """A reply that may be megabytes (a batch): JSON already (groups as stored), or written off the event loop."""
    body = value if isinstance(value, bytes) else await asyncio.to_thread(lambda: json.dumps(value).encode())
    return _compressed(request, web.Response(body=body, content_type="application/json"))


def _compressed(request: web.Request, response: web.Response) -> web.Response:
    if len(response.body or b"") >= GZIP_AT_BYTES and "gzip" in request.headers.get("Accept-Encoding", ""):  # type: ignore[arg-type]
        response.enable_compression()
    return response
