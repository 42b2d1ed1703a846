"""The SQL of published policies: versions by content hash, the lines they were published to, and their
content, kept in files beside the database (``farmd.store.policy_files``) or, written by an older farmd,
in a blob read a slice at a time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

from farmd.errors import StoreError
from farmd.records import Policy
from farmd.store.database import Database
from farmd.store.policy_files import PolicyFiles, PolicyUpload

POLICY_COLUMNS = "version, sha256, size, uri, created_at, name"


class PolicyRecords:
    def __init__(self, db: Database, files: PolicyFiles) -> None:
        self._db = db
        self.files = files
        """Where policies' content lives: files beside the database."""

    # -- policies -------------------------------------------------------------------------------

    async def policy_upload(self) -> PolicyUpload:
        """Somewhere to write a policy's content as it arrives; ``add_policy`` keeps it, ``discard`` drops it."""
        return await self.files.upload()

    async def add_policy(self, sha256: str, content: PolicyUpload | bytes | None, uri: str | None,
                         name: str = "") -> Policy:
        """Publish a policy to line ``name``: its content (an upload that hashed to ``sha256``, or bytes)
        and/or a uri. The same content twice is the same version (and the same file), published again:
        the line's current version once more."""
        if isinstance(content, bytes):
            upload = await self.files.upload()
            try:
                await upload.write(content)
                return await self.add_policy(sha256, upload, uri, name)
            finally:
                await upload.discard()
        file = None
        if content is not None:
            if content.sha256 != sha256:
                raise ValueError(f"the content hashes to {content.sha256}, not {sha256}")
            known = await self._db.one(f"SELECT {POLICY_COLUMNS}, file, removed_at FROM policies WHERE sha256=?",
                                       (sha256,))
            if known is not None and known[6] is None and known[7] is None:  # in an older farmd's blob: no copy
                return await self._republish(Policy(*known[:6]), name)
            file = await self.files.keep(content)  # before the row: a row never names a file that is not there
        now = time.time()
        size = content.size if content is not None else 0
        async with self._db.write() as db:
            row = await db.fetchone(f"SELECT {POLICY_COLUMNS} FROM policies WHERE sha256=?", (sha256,))
            if row is None:
                next_version = await db.fetchone("SELECT COALESCE(MAX(version), 0) + 1 FROM policies")
                version = int(next_version[0]) if next_version else 1
                await db.execute("INSERT INTO policies(version, sha256, size, blob, uri, created_at, file, name) "
                                 "VALUES (?,?,?,NULL,?,?,?,?)", (version, sha256, size, uri, now, file, name))
                policy = Policy(version, sha256, size, uri, now, name)
            else:
                policy = Policy(*row)
                if file is not None:  # its content was removed (``store.retention``): published again, it is back
                    await db.execute("UPDATE policies SET file=?, removed_at=NULL, removed_why=NULL "
                                     "WHERE version=? AND removed_at IS NOT NULL", (file, policy.version))
            await db.execute("INSERT INTO publications(name, version, at) VALUES (?,?,?)", (name, policy.version, now))
        return policy

    async def _republish(self, policy: Policy, name: str) -> Policy:
        async with self._db.write() as db:
            await db.execute("INSERT INTO publications(name, version, at) VALUES (?,?,?)",
                             (name, policy.version, time.time()))
        return policy

    async def policy_by_hash(self, sha256: str) -> Policy | None:
        row = await self._db.one(f"SELECT {POLICY_COLUMNS} FROM policies WHERE sha256=?", (sha256,))
        return Policy(*row) if row else None

    async def policy_by_version(self, version: int) -> Policy | None:
        row = await self._db.one(f"SELECT {POLICY_COLUMNS} FROM policies WHERE version=?", (version,))
        return Policy(*row) if row else None

    async def publications(self) -> list[tuple[str, int]]:
        """Every publication, (line, version), in the order they were made (one per trainer step: small
        enough to hold)."""
        return [(str(name), int(version)) for name, version in
                await self._db.all("SELECT name, version FROM publications ORDER BY seq")]

    async def policy_content(self, sha256: str, chunk_bytes: int) -> AsyncGenerator[bytes, None]:
        """A policy's content, ``chunk_bytes`` at a time, never read whole: from its file, or from the
        blob an older farmd stored it in. Nothing for a policy that is only a uri (or none at all);
        ``StoreError`` for one whose content was removed."""
        row = await self._db.one("SELECT version, file, blob IS NOT NULL, removed_at FROM policies WHERE sha256=?",
                                 (sha256,))
        if row is None:
            return
        version, name, in_blob, removed_at = row
        if removed_at is not None:  # not "nothing": a caller must never take no bytes for the content
            raise StoreError(f"the content of policy {version} was removed")
        if name is not None:
            try:
                async for chunk in self.files.read(name, chunk_bytes):
                    yield chunk
            except FileNotFoundError as exc:
                raise StoreError(f"the content of policy {version} ({name}) is missing from the data directory"
                                 ) from exc
            return
        offset = 0
        while in_blob:
            chunk = await self._db.blob_slice("policies", "blob", "version", int(version), offset, chunk_bytes)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    async def latest_policy(self, name: str | None = None) -> Policy | None:
        """The policy published last (to line ``name``, when given)."""
        where, args = ("", ()) if name is None else ("WHERE p.name = ?", (name,))
        row = await self._db.one(
            f"SELECT {', '.join('v.' + c.strip() for c in POLICY_COLUMNS.split(','))} FROM publications p "
            f"JOIN policies v ON v.version = p.version {where} ORDER BY p.seq DESC LIMIT 1", args)
        return Policy(*row) if row else None
