"""The SQL of consumers' cursors: how far each trainer's stream of trajectories or of finished groups has
been acknowledged, never moved backwards nor past what was stored."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from farmd.errors import CursorError
from farmd.store.database import Database
from farmd.store.filters import subscription

CURSOR_KINDS = ("trajectories", "groups")
"""What a consumer's cursor counts: stored trajectories (``seq``) or finished groups (``done_seq``)."""


def _kind(kind: str) -> str:
    if kind not in CURSOR_KINDS:
        raise ValueError(f"a cursor counts {' or '.join(CURSOR_KINDS)}, not {kind!r}")
    return kind


@dataclasses.dataclass(frozen=True, slots=True)
class Cursor:
    """A consumer's cursor as acked: its name, what it counts (``kind``), where it stands, when it last moved."""

    name: str
    kind: str
    acked: int
    updated_at: float


def _consumer_rows(rows: list[Any]) -> list[Cursor]:
    return [Cursor(name=n, kind=k, acked=int(a), updated_at=float(t)) for n, k, a, t in rows]


class ConsumerRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def cursor(self, consumer: str, kind: str) -> int:
        """Where ``consumer``'s cursor of ``kind`` (``trajectories`` or ``groups``) stands; 0 if it never acked."""
        row = await self._db.one("SELECT acked_seq FROM consumers WHERE name=? AND kind=?", (consumer, _kind(kind)))
        return int(row[0]) if row else 0

    async def ack(self, consumer: str, kind: str, up_to: int) -> int:
        """Move ``consumer``'s cursor of ``kind`` to ``up_to`` (never backwards). Returns the cursor.

        ``up_to`` counts trajectories (``seq``), or finished groups (``done_seq``) for ``groups``; a
        cursor past the last one would silently skip what comes next, so it is refused.
        """
        column, table = ("done_seq", "groups") if _kind(kind) == "groups" else ("seq", "trajectories")
        async with self._db.write() as db:
            row = await db.fetchone(f"SELECT COALESCE(MAX({column}), 0) FROM {table}")
            high = int(row[0]) if row else 0
            if not 0 <= up_to <= high:
                raise CursorError(f"cannot ack up to {up_to}: the stream has only reached {high}")
            row = await db.fetchone(
                "INSERT INTO consumers(name, kind, acked_seq, updated_at) VALUES (?,?,?,?) ON CONFLICT(name, kind) "
                f"DO UPDATE SET acked_seq={db.sql.greatest('consumers.acked_seq', 'excluded.acked_seq')}, updated_at=excluded.updated_at "
                "RETURNING acked_seq", (consumer, kind, up_to, time.time()))
        return int(row[0]) if row else up_to

    async def consumers(self, limit: int = -1) -> list[Cursor]:
        """Cursors that were acked (the ``limit`` that moved last; -1: all): name, kind, position, when it moved."""
        return _consumer_rows(await self._db.all("SELECT name, kind, acked_seq, updated_at FROM consumers "
                                                 "ORDER BY updated_at DESC, name, kind LIMIT ?", (limit,)))

    async def consumers_named(self, name: str, kind: str) -> list[Cursor]:
        """``consumers()``'s row for one cursor, if it was ever acked."""
        return _consumer_rows(await self._db.all(
            "SELECT name, kind, acked_seq, updated_at FROM consumers WHERE name=? AND kind=?", (name, _kind(kind))))

    async def consumed(self, kind: str, position: int) -> int:
        """Trajectories a cursor of ``kind`` at ``position`` has passed: for ``groups``, every trajectory of
        the groups that finished at or before it (kept as a running total, so this is one lookup)."""
        if _kind(kind) == "trajectories" or position <= 0:
            return max(0, position)
        row = await self._db.one("SELECT done_total FROM groups WHERE done_seq=?", (position,))
        return int(row[0] or 0) if row else 0

    async def unconsumed(self, kind: str, position: int, agent: str | None, envs: Sequence[str]) -> int:
        """Stored trajectories of ``agent`` in ``envs`` past a cursor of ``kind`` at ``position`` (for
        ``groups``: the sizes of matching groups that finished after it). A scan of what lies past the
        cursor: a subscribed consumer's backlog, which a trainer keeps short (withdrawn ones never come)."""
        if _kind(kind) == "trajectories":
            where, args = subscription(agent, envs, streamed=True)
            row = await self._db.one(f"SELECT COUNT(*) FROM trajectories WHERE seq > ? {where}", (position, *args))
        else:
            where, args = subscription(agent, envs, streamed=True, groups=True)
            row = await self._db.one(f"SELECT COALESCE(SUM(size), 0) FROM groups WHERE done_seq > ? {where}",
                                     (position, *args))
        return int(row[0] or 0)
