"""Names that belong to credentials: the kinds there are, what a name of each looks like, and the refusal a
credential gets for using another's.

A name is the credential's that first used it (a node's hello, a trainer's stream, ack or publish to a
policy line, an Atropos registration); any other credential is refused with ``NameHeld`` until an operator reassigns it. Held here as
data so the API, the Atropos queue and ``farmctl`` say the same thing; the rows are the store's
(``farmd.store.names``). A farm with no credentials binds nothing: there is no credential to bind a name to.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

from farmd.errors import BadRequest, NameHeld
from farmd.records import NODE_NAME

log = logging.getLogger("farmd.names")

NODE = "node"
CONSUMER = "consumer"
POLICY_LINE = "policy-line"
ATROPOS_TRAINER = "atropos-trainer"
ATROPOS_ENV = "atropos-env"
ATROPOS_NAME = "atropos-name"
VERIFY_AGENT = "verify-agent"

KINDS: dict[str, str] = {
    NODE: "node name",
    CONSUMER: "consumer",
    POLICY_LINE: "policy line",
    ATROPOS_TRAINER: "Atropos trainer registration",
    ATROPOS_ENV: "Atropos environment id",
    ATROPOS_NAME: "Atropos environment name",
    VERIFY_AGENT: "verify agent",
}
"""Each kind, as a refusal names it."""

FARMD = "(farmd)"
"""The holder of names farmd uses itself (the Atropos feed's consumer): no credential can be named this
(credential names are letters, digits, '.', '_' and '-')."""

TRAINER = "trainer"
"""The one name of kind ``atropos-trainer``: an Atropos API serves one trainer, whose registration, batches and
reset are its credential's."""

MAX_CONSUMER_CHARS = 200
_ENV_ID = re.compile(r"0|[1-9][0-9]{0,17}")
_ATROPOS_NAME = re.compile(r"atropos:[A-Za-z0-9_.-]{1,64}")
"""The farm environment an Atropos environment's groups are stored under (``farmd.atropos.records.env_name``)."""


def check(kind: str, name: str) -> str:
    """``name`` if it is a well-formed name of ``kind``; BadRequest saying what one looks like otherwise."""
    if kind not in KINDS:
        raise BadRequest(f"no kind of name {kind!r}: one of {', '.join(KINDS)}")
    ok = {NODE: lambda: bool(NODE_NAME.fullmatch(name)),
          CONSUMER: lambda: 0 < len(name) <= MAX_CONSUMER_CHARS and name == name.strip(),
          POLICY_LINE: lambda: bool(NODE_NAME.fullmatch(name)),  # the same shape as a node's (``LINE_NAME``)
          ATROPOS_TRAINER: lambda: name == TRAINER,
          ATROPOS_ENV: lambda: bool(_ENV_ID.fullmatch(name)),
          ATROPOS_NAME: lambda: bool(_ATROPOS_NAME.fullmatch(name)),
          VERIFY_AGENT: lambda: bool(NODE_NAME.fullmatch(name))}[kind]()
    if not ok:
        shape = {NODE: "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                 CONSUMER: f"1-{MAX_CONSUMER_CHARS} characters, no spaces at either end",
                 POLICY_LINE: "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                 ATROPOS_TRAINER: f"{TRAINER!r}", ATROPOS_ENV: "an environment id, a number from 0",
                 ATROPOS_NAME: "'atropos:' and 1-64 letters, digits, '.', '_' or '-'",
                 VERIFY_AGENT: "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"}[kind]
        raise BadRequest(f"a {KINDS[kind]} is {shape}, not {name[:100]!r}")
    return name


def held(kind: str, name: str, holder: str, caller: str) -> NameHeld:
    """The refusal for ``caller`` using ``name``, which ``holder`` holds."""
    whose = "farmd itself" if holder == FARMD else f"credential {holder!r}"
    return NameHeld(f"{KINDS[kind]} {name[:100]!r} belongs to {whose}, not to credential {caller!r}: a name is its "
                    f"maker's; use one of your own, or have an operator give it to you (farmctl names reassign "
                    f"{kind} NAME CREDENTIAL)", kind=kind, name=name, holder=holder)


class Holding(Protocol):
    @property
    def credential(self) -> str: ...


class Records(Protocol):
    """The store's calls this needs (``farmd.store.names.NameRecords``)."""

    async def holder(self, kind: str, name: str) -> Holding | None: ...

    async def claim(self, kind: str, name: str, credential: str) -> Holding: ...


async def bind(records: Records, kind: str, name: str, credential: str) -> None:
    """Let ``credential`` use ``name`` of ``kind``: claimed for it on its first use, refused (``NameHeld``) when
    another credential holds it. A read when the name is held already, which is every use but the first."""
    row = await records.holder(kind, name)
    if row is None:
        row = await records.claim(kind, name, credential)
        if row.credential == credential:
            log.info("%s %r is credential %r's from now on", KINDS[kind], name, credential,
                     extra={"event": "name_claimed", "kind": kind, "bound_name": name, "credential": credential})
    if row.credential != credential:
        log.warning("credential %r was refused %s %r: it is %r's", credential, KINDS[kind], name, row.credential,
                    extra={"event": "name_refused", "kind": kind, "bound_name": name, "credential": credential,
                           "holder": row.credential})
        raise held(kind, name, row.credential, credential)
