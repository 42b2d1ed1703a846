"""Names that belong to credentials: a node's name, a consumer's cursor, the Atropos trainer's registration and
each Atropos environment id and name are the credential's that made them.

One row per (kind, name): the credential holding it, when it was claimed, and who gave it (empty: its first use
claimed it; else the operator credential that reassigned it). A name is claimed by the first credential that uses
it and is refused to every other until an operator reassigns it; the rows outlive farmd, so a restart hands no
name to whoever speaks first. Which kinds exist and what a name of each looks like is the API's to check; here
is only what is stored and how it changes, each change one transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from farmd.names import FARMD
from farmd.store.database import Database, Transaction

_COLUMNS = "kind, name, credential, claimed_at, assigned_by"


@dataclass(frozen=True, slots=True)
class NameRow:
    kind: str
    name: str
    credential: str
    """The credential's name (``farmd.names.FARMD`` for farmd's own)."""
    claimed_at: float
    assigned_by: str = ""
    """"": claimed by its first use; else the operator credential that reassigned it."""


def _row(row: Any) -> NameRow:
    return NameRow(str(row[0]), str(row[1]), str(row[2]), float(row[3]), str(row[4]))


async def claim_in(db: Transaction, kind: str, name: str, credential: str) -> NameRow:
    """Claim ``name`` for ``credential`` inside the caller's write transaction, unless it is held: the row as it
    stands after (another credential's, if it was theirs)."""
    await db.execute("INSERT INTO names(kind, name, credential, claimed_at, assigned_by) VALUES (?,?,?,?,'') "
                     "ON CONFLICT(kind, name) DO NOTHING", (kind, name, credential, time.time()))
    row = await db.fetchone(f"SELECT {_COLUMNS} FROM names WHERE kind=? AND name=?", (kind, name))
    assert row is not None
    return _row(row)


async def assign_in(db: Transaction, kind: str, name: str, credential: str) -> None:
    """``name`` is ``credential``'s, whoever held it, inside the caller's write transaction: for a name made
    in that transaction (an Atropos environment id registered now), which no one can have used before it."""
    await db.execute("INSERT INTO names(kind, name, credential, claimed_at, assigned_by) VALUES (?,?,?,?,'') "
                     "ON CONFLICT(kind, name) DO UPDATE SET credential=excluded.credential, "
                     "claimed_at=excluded.claimed_at, assigned_by=''", (kind, name, credential, time.time()))


async def forget_in(db: Transaction, kinds: tuple[str, ...]) -> int:
    """Every name of ``kinds`` let go, inside the caller's write transaction (what an Atropos reset forgets, its
    trainer registration and environment ids, it forgets with them). Returns how many."""
    return await db.execute(f"DELETE FROM names WHERE kind IN ({','.join('?' * len(kinds))})", kinds)


class NameRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def holder(self, kind: str, name: str) -> NameRow | None:
        """Who holds ``name`` of ``kind``; None: nobody yet."""
        row = await self._db.one(f"SELECT {_COLUMNS} FROM names WHERE kind=? AND name=?", (kind, name))
        return _row(row) if row is not None else None

    async def claim(self, kind: str, name: str, credential: str) -> NameRow:
        """``name`` for ``credential`` if nobody holds it; the row as it stands after (the holder's, whoever it
        is). Two first uses at once: one transaction wins, the other reads its row."""
        async with self._db.write() as db:
            return await claim_in(db, kind, name, credential)

    async def reassign(self, kind: str, name: str, credential: str, by: str) -> tuple[NameRow, str]:
        """Give ``name`` to ``credential`` (an operator ``by`` decided so), whoever held it: the row after, and the
        credential that held it before ("" for nobody)."""
        async with self._db.write() as db:
            before = await db.fetchone("SELECT credential FROM names WHERE kind=? AND name=?", (kind, name))
            row = await db.fetchone(
                    "INSERT INTO names(kind, name, credential, claimed_at, assigned_by) VALUES (?,?,?,?,?) "
                    "ON CONFLICT(kind, name) DO UPDATE SET credential=excluded.credential, "
                    f"claimed_at=excluded.claimed_at, assigned_by=excluded.assigned_by RETURNING {_COLUMNS}",
                    (kind, name, credential, time.time(), by))
        assert row is not None
        return _row(row), str(before[0]) if before is not None else ""

    async def take(self, kind: str, name: str) -> NameRow | None:
        """``name`` for farmd itself, from whoever held it (the config named it farmd's): the row it had before,
        if another held it."""
        row, before = await self.reassign(kind, name, FARMD, FARMD)
        return None if before in ("", FARMD) else NameRow(kind, name, before, row.claimed_at)

    async def listing(self, kind: str | None = None, after: int = 0, limit: int = 100) -> list[tuple[int, NameRow]]:
        """Names in the order they were first claimed, from just after position ``after``, each with its position
        (a page token's)."""
        where, args = ("AND kind=?", [kind]) if kind else ("", [])
        rows = await self._db.all(f"SELECT rowid, {_COLUMNS} FROM names WHERE rowid > ? {where} "
                                  "ORDER BY rowid LIMIT ?", (after, *args, limit))
        return [(int(r[0]), _row(r[1:])) for r in rows]
