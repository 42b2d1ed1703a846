"""What one credential may hold in farmd at once, across all of its calls.

A per-call bound does not bound a caller: a node credential that opens a hundred Work streams, each
holding unfinished result pieces up to the per-stream bound, holds a hundred times that. So the calls
that keep what a caller sent until more of it arrives (a node's Work stream with records in pieces,
PublishPolicy and Submit uploads, and requests to the Atropos API, whose bodies are held whole while they
are read and checked) draw on one account per credential: open streams, pending pieces and pending bytes. Past a bound the call that asks is refused with RESOURCE_EXHAUSTED, saying which bound and
what the credential holds; what it already holds, and every other credential, are untouched. A call
returns everything it took when it ends, however it ends.

A credential is known by the token its call carries (its sha256, as credentials keep it), named by the
farm's ``[[credentials]]`` where they name it. A farm with no credentials trusts its callers (loopback):
they all draw on one account.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from farmd.api.auth import bearer_token
from farmd.config import Credential, token_sha256
from farmd.errors import BudgetExhausted

log = logging.getLogger("farmd.api.budget")

DEFAULT_STREAMS = 64
DEFAULT_PENDING_BYTES = 256 << 20
DEFAULT_PENDING_PIECES = 4096
@dataclass
class _Account:
    name: str
    streams: int = 0
    pieces: int = 0
    bytes: int = 0


class Budgets:
    """One account per credential; ``stream`` opens a call's share of it."""

    def __init__(self, credentials: Iterable[Credential] = (), *, streams: int = DEFAULT_STREAMS,
                 pending_bytes: int = DEFAULT_PENDING_BYTES, pending_pieces: int = DEFAULT_PENDING_PIECES) -> None:
        if min(streams, pending_bytes, pending_pieces) < 1:
            raise ValueError("a credential's budget holds at least one stream, piece and byte")
        self.streams = streams
        self.pending_bytes = pending_bytes
        self.pending_pieces = pending_pieces
        self._names = {c.token_sha256: c.name for c in credentials}
        self._accounts: dict[str, _Account] = {}

    def _key(self, token: str | None) -> tuple[str, str]:
        if not token:
            return "", "this farm's callers"
        digest = token_sha256(token)
        return digest, f"credential {self._names.get(digest, 'of this token')!r}"

    def held(self, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[int, int, int]:
        """(streams, pieces, bytes) the caller of ``context`` holds now."""
        account = self._accounts.get(self._key(_token(context))[0])
        return (account.streams, account.pieces, account.bytes) if account else (0, 0, 0)

    def stream(self, context: grpc.aio.ServicerContext[Any, Any], method: str
               ) -> contextlib.AbstractAsyncContextManager[Share]:
        """A gRPC call's share of its credential's account (``call``)."""
        return self.call(_token(context), method)

    @contextlib.asynccontextmanager
    async def call(self, token: str | None, method: str) -> AsyncIterator[Share]:
        """The share of the account of the credential whose token is ``token`` that one call holds, for as
        long as the call is open. RESOURCE_EXHAUSTED (``Exhausted``) when the credential has ``streams`` such
        calls open already."""
        key, name = self._key(token)
        account = self._accounts.get(key)
        if account is None:
            account = self._accounts[key] = _Account(name)
        if account.streams >= self.streams:
            log.warning("%s has %d streams open; %s refused", name, account.streams, method,
                        extra={"event": "budget_refused", "bound": "streams", "method": method})
            raise BudgetExhausted(f"{name} has {account.streams} streams open (uploads and node streams), its most: "
                            f"{method} is refused until one ends")
        account.streams += 1
        share = Share(self, account, method)
        try:
            yield share
        finally:
            share.release()
            account.streams -= 1
            if not (account.streams or account.pieces or account.bytes) and self._accounts.get(key) is account:
                del self._accounts[key]


def _token(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    return bearer_token(tuple(context.invocation_metadata() or ()))


class Share:
    """What one call holds of its credential's account: ``take`` before keeping, ``give`` when let go."""

    def __init__(self, budgets: Budgets, account: _Account, method: str) -> None:
        self._budgets = budgets
        self._account = account
        self._method = method
        self.pieces = 0
        self.bytes = 0

    def take(self, nbytes: int, pieces: int = 0) -> None:
        """Count ``nbytes`` and ``pieces`` as held; RESOURCE_EXHAUSTED (nothing taken) past either bound."""
        budgets, account = self._budgets, self._account
        if account.bytes + nbytes > budgets.pending_bytes or account.pieces + pieces > budgets.pending_pieces:
            bound = "bytes" if account.bytes + nbytes > budgets.pending_bytes else "pieces"
            log.warning("%s holds %d bytes in %d pieces; %s refused %d more", account.name, account.bytes,
                        account.pieces, self._method, nbytes,
                        extra={"event": "budget_refused", "bound": bound, "method": self._method})
            raise BudgetExhausted(f"{account.name} holds {account.bytes} bytes in {account.pieces} unfinished pieces across "
                            f"its calls, at most {budgets.pending_bytes} bytes and {budgets.pending_pieces} pieces: "
                            f"{self._method} cannot keep {nbytes} bytes more until its calls finish what they "
                            "started")
        account.bytes += nbytes
        account.pieces += pieces
        self.bytes += nbytes
        self.pieces += pieces

    def give(self, nbytes: int, pieces: int = 0) -> None:
        nbytes, pieces = min(nbytes, self.bytes), min(pieces, self.pieces)
        self._account.bytes -= nbytes
        self._account.pieces -= pieces
        self.bytes -= nbytes
        self.pieces -= pieces

    def release(self) -> None:
        """Everything this call holds, given back (its end)."""
        self.give(self.bytes, self.pieces)
