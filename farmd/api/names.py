"""Names a call uses, bound to the credential that calls: a node's name in its hello, a consumer's in a stream
or an ack, a policy line's in a publish. The calling credential is the one whose token the call carries (the role interceptor let it in);
a name the request claims never decides who the caller is. A farm with no credentials binds nothing.

And the operator's two calls on names (``FarmService.ListNames`` and ``ReassignName``): what is held by whom,
and giving a name to another credential, the one way a name changes hands.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from farmd import names
from farmd.api.auth import credential_for
from farmd.config import Credential
from farmd.errors import BadRequest, FailedPrecondition, NotFound
from farmd.store import Store
from farmd.store.names import NameRow

log = logging.getLogger("farmd.api.names")


class NameGuard:
    def __init__(self, store: Store, credentials: Iterable[Credential]) -> None:
        self._store = store
        self._credentials = tuple(credentials)

    @property
    def binds(self) -> bool:
        """Whether names are bound at all: only on a farm with credentials."""
        return bool(self._credentials)

    def caller(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Credential | None:
        """The credential whose token a call carries; None on a farm without credentials."""
        if not self._credentials:
            return None
        credential = credential_for(self._credentials, metadata)
        if credential is None:  # the interceptor refuses these first; here only if it was bypassed
            raise BadRequest("no credential")
        return credential

    async def use(self, kind: str, name: str, context: Any) -> None:
        """Let the call's credential use ``name``: claimed on its first use, ``NameHeld`` if another's."""
        caller = self.caller(tuple(context.invocation_metadata() or ()))
        if caller is not None:
            await names.bind(self._store.names, kind, name, caller.name)

    async def listing(self, kind: str, after: int, limit: int) -> list[tuple[int, NameRow]]:
        if kind and kind not in names.KINDS:
            raise BadRequest(f"no kind of name {kind[:100]!r}: one of {', '.join(names.KINDS)}")
        return await self._store.names.listing(kind or None, after, limit)

    async def reassign(self, kind: str, name: str, credential: str, context: Any) -> tuple[NameRow, str]:
        """Give ``name`` to ``credential`` (a credential of this farm): the operator calling decided so."""
        operator = self.caller(tuple(context.invocation_metadata() or ()))
        if operator is None:
            raise FailedPrecondition("this farm has no credentials, so no name belongs to anyone: there is nothing "
                                     "to reassign (give the farm [[credentials]] to bind names)")
        names.check(kind, name)
        if not any(c.name == credential for c in self._credentials):
            known = ", ".join(sorted(c.name for c in self._credentials))
            raise NotFound(f"no credential {credential[:100]!r} on this farm (it has {known[:300]})")
        row, previous = await self._store.names.reassign(kind, name, credential, operator.name)
        log.warning("operator %r gave %s %r to credential %r (it was %s)", operator.name, names.KINDS[kind], name,
                    credential, repr(previous) if previous else "nobody's",
                    extra={"event": "name_reassigned", "kind": kind, "bound_name": name, "credential": credential,
                           "previous": previous, "operator": operator.name})
        return row, previous
