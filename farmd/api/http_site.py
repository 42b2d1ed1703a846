"""One HTTP port of farmd's (the console, the Atropos API): aiohttp on farmd's own event loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from farmd.api.budget import Budgets
from farmd.errors import ConfigError


class HttpSite:
    """Where ``what`` listens (``HOST:PORT``, port 0: any free one), once ``start``ed."""

    def __init__(self, listen: str, what: str, flag: str) -> None:
        host, _, port = listen.rpartition(":")
        if not port.isdigit() or not host:
            raise ConfigError(f"{flag} takes HOST:PORT, not {listen!r}")
        self.host, self._port, self._what = host.strip("[]"), int(port), what
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self, app: web.Application, **runner_args: Any) -> None:
        runner = web.AppRunner(app, access_log=None, **runner_args)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self._port, reuse_address=True).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"cannot serve {self._what} on {self.host}:{self._port}: {exc.strerror}") from exc
        self._runner = runner
        self.port = int(runner.addresses[0][1]) if runner.addresses else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@contextlib.asynccontextmanager
async def body_counted(budgets: Budgets, token: str | None, request: web.Request, max_body: int
                       ) -> AsyncIterator[None]:
    """While ``request`` is handled, its body counts against its credential's budget (``BudgetExhausted`` when the
    credential holds too much already): as declared, capped at ``max_body``; with no declared length, the most it
    may be, since a chunked body's size is known only once it is read."""
    async with budgets.call(token, f"{request.method} {request.path}") as share:
        declared = request.content_length
        share.take(min(max_body, declared if declared is not None else max_body if request.body_exists else 0),
                   pieces=1)
        yield
