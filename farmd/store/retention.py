"""The SQL of keeping policy content: which versions still hold it, pins, removal, and the disk it all takes.

A version's row (hash, size, line, times) is kept for good; its content (a file under ``policies/``, or the blob an
older farmd stored) only while something can still use it. What may use it is decided by the caller
(``farmd.scheduler.policies``: the newest versions of each line, as it holds them) and here, inside the one write
transaction that marks versions removed: a job queued or leased for the version, or an operator's pin. A lease tags
its jobs inside a write transaction too, so a version is either marked removed before a lease could choose it (and
the caller never lets a lease choose it: see ``Policies.remove_unused``) or found leased and kept.

A removed row says when and why (``removed_at``, ``removed_why``); its file goes after the transaction commits, so a
crash between leaves a file that ``leftovers`` finds, never a row that names content that is gone (a file is named
by its hash, so the row need not name it). Reached as
``store.retention``; it shares the store's connections.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from farmd.store.policy_files import FOLDER

if TYPE_CHECKING:
    from farmd.store.database import Database
    from farmd.store.policy_files import PolicyFiles

_STATE_COLUMNS = "version, sha256, size, uri, created_at, name, pinned_at, removed_at, removed_why, " \
                 "file IS NOT NULL OR blob IS NOT NULL"
_WITH_CONTENT = "removed_at IS NULL AND (file IS NOT NULL OR blob IS NOT NULL)"
"""The partial index ``policies_with_content``'s condition, written out so SQLite takes it."""


@dataclass(frozen=True, slots=True)
class PolicyState:
    """A policy version as the store keeps it: what it is, and whether its content is still held."""

    version: int
    sha256: str
    size: int
    uri: str | None
    created_at: float
    name: str
    pinned_at: float | None
    removed_at: float | None
    removed_why: str
    has_content: bool
    """Content is held (a file or an older farmd's blob); False for a uri alone and for a removed version."""


@dataclass(frozen=True, slots=True)
class Removed:
    """A version whose content a sweep removed: its row is marked; its file (named by its hash) goes next."""

    version: int
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The disk the store and the policies take now, and what the store knows of the policies."""

    at: float
    store_bytes: int
    """The database: its file, its write-ahead log and its shared-memory index."""
    policy_bytes: int
    """Everything under ``policies/``: content kept, and uploads in progress."""
    policy_files: int
    kept: int
    """Versions whose content is held."""
    removed: int
    pinned: int
    removed_bytes: int
    """Content removed so far, by the sizes the removed versions were published with."""


def _state(row: Any) -> PolicyState:
    version, sha256, size, uri, created_at, name, pinned_at, removed_at, why, content = row
    return PolicyState(int(version), str(sha256), int(size), None if uri is None else str(uri), float(created_at),
                       str(name), None if pinned_at is None else float(pinned_at),
                       None if removed_at is None else float(removed_at), str(why or ""), bool(content))


class RetentionRecords:
    def __init__(self, db: Database, files: PolicyFiles) -> None:
        self._db = db
        self._files = files

    async def state(self, version: int) -> PolicyState | None:
        row = await self._db.one(f"SELECT {_STATE_COLUMNS} FROM policies WHERE version=?", (version,))
        return _state(row) if row else None

    async def listing(self, before: int, limit: int) -> list[PolicyState]:
        """Versions below ``before`` (0: from the newest), newest first, at most ``limit``."""
        where, args = ("WHERE version < ?", (before,)) if before > 0 else ("", ())
        rows = await self._db.all(f"SELECT {_STATE_COLUMNS} FROM policies {where} ORDER BY version DESC LIMIT ?",
                                      (*args, limit))
        return [_state(r) for r in rows]

    async def pin(self, version: int, pinned: bool) -> PolicyState | None:
        """Pin ``version`` (its content is kept whatever else holds) or unpin it. Returns its state after; None when
        there is no such version. A removed version is not pinned (the state says it was removed): its content is
        gone, and a pin would promise what the farm no longer holds."""
        async with self._db.write() as db:
            rows = await db.execute_fetchall(f"SELECT {_STATE_COLUMNS} FROM policies WHERE version=?", (version,))
            if not rows:
                return None
            found = _state(next(iter(rows)))
            if pinned and found.removed_at is not None:
                return found
            if pinned and found.pinned_at is None:
                await db.execute("UPDATE policies SET pinned_at=? WHERE version=?", (time.time(), version))
            elif not pinned and found.pinned_at is not None:
                await db.execute("UPDATE policies SET pinned_at=NULL WHERE version=?", (version,))
            rows = await db.execute_fetchall(f"SELECT {_STATE_COLUMNS} FROM policies WHERE version=?", (version,))
            return _state(next(iter(rows)))

    async def remove_unused(self, keep: Iterable[int], why: str) -> list[Removed]:
        """Mark removed, in one write transaction, every version that holds content and is neither in ``keep``, nor
        pinned, nor the version of a job queued or leased; returns them, for ``drop_content`` to delete their files.
        A blob an older farmd stored goes in the same transaction (it is a column, not a file).

        A read first asks whether any version could go at all: a farm that removed what it could already (every
        sweep but those after a publish) takes no write transaction, so a sweep never queues behind a flush."""
        kept = json.dumps(sorted(set(keep)))
        kept_versions = self._db.sql.json_values("?", "k", integers=True)
        unused = f"{_WITH_CONTENT} AND pinned_at IS NULL AND version NOT IN (SELECT k.value FROM {kept_versions})"
        if await self._db.one(f"SELECT 1 FROM policies WHERE {unused} LIMIT 1", (kept,)) is None:
            return []
        now = time.time()
        async with self._db.write() as db:
            rows = await db.execute_fetchall(
                f"UPDATE policies SET removed_at=?, removed_why=?, blob=NULL, file=NULL WHERE {unused} "
                f"AND version NOT IN (SELECT DISTINCT policy_version FROM jobs WHERE state IN ('queued', 'leased')) "
                f"RETURNING version, sha256, size", (now, why, kept))
        return [Removed(int(v), str(sha), int(size)) for v, sha, size in rows]

    async def drop_content(self, removed: list[Removed]) -> int:
        """Delete the files of versions ``remove_unused`` marked (in a thread). Returns the bytes given back."""
        if not removed:
            return 0
        return await self._files.remove_content([f"{FOLDER}/{r.sha256}" for r in removed])

    async def leftovers(self) -> list[Removed]:
        """Removed versions whose files are still there (a farmd that stopped between marking and deleting)."""
        held = await self._files.content_held()
        if not held:
            return []
        rows = await self._db.all(
            "SELECT version, sha256, size FROM policies WHERE removed_at IS NOT NULL AND sha256 IN "
            f"(SELECT h.value FROM {self._db.sql.json_values('?', 'h')})", (json.dumps(sorted(held)),))
        return [Removed(int(v), str(sha), int(size)) for v, sha, size in rows]

    async def usage(self) -> DiskUsage:
        """The disk the store and the policies take now (sizes read in a thread) and the versions' counts."""
        sizes = await self._db.size()
        files, policy_bytes = await self._files.content_usage()
        row = await self._db.one(
            f"SELECT COALESCE(SUM(CASE WHEN {_WITH_CONTENT} THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN removed_at IS NOT NULL THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN pinned_at IS NOT NULL THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN removed_at IS NOT NULL THEN size ELSE 0 END), 0) FROM policies")
        kept, removed, pinned, removed_bytes = (int(x) for x in row)
        return DiskUsage(time.time(), sizes, policy_bytes, files, kept, removed, pinned, removed_bytes)

