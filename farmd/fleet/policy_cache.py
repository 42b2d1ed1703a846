"""The policies a node has fetched, on its disk, by content hash: what its torch agents load.

A job arrives with the exact version it was leased with and that version's sha256, so a node never asks
"the latest": it runs what it was told or nothing. Content it lacks is fetched from the coordinator in
chunks (``fetch``), checked against the hash, and written beside the others; past ``max_bytes`` the least
recently used are removed (never the one just asked for). Two rollouts wanting one policy fetch it once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from farmd.errors import InfraFailure, NotFound
from farmd.private import make_dir
from farmd.text import is_sha256

log = logging.getLogger("farmd.fleet.policies")

_KNOWN_VERSIONS = 4096


class PolicyCache:
    """``fetch(sha256)`` returns the content the coordinator holds under that hash (unchecked)."""

    def __init__(self, directory: Path, max_bytes: int, fetch: Callable[[str], Awaitable[bytes]]) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._fetch = fetch
        self._versions: OrderedDict[int, str] = OrderedDict()
        self._fetching: dict[str, asyncio.Future[bytes]] = {}
        self.counters = {"hits": 0, "fetched": 0, "evicted": 0}

    async def open(self) -> None:
        await asyncio.to_thread(make_dir, self.directory)

    def learn(self, version: int, sha256: str) -> None:
        """A lease said ``version`` is ``sha256`` (the coordinator's word: the content is checked on fetch)."""
        if version and is_sha256(sha256):
            self._versions.pop(version, None)
            self._versions[version] = sha256
            while len(self._versions) > _KNOWN_VERSIONS:
                self._versions.popitem(last=False)

    def known_sha256(self, version: int) -> str | None:
        return self._versions.get(version)

    async def sha256_of(self, version: int) -> str:
        sha = self._versions.get(version)
        if sha is None:
            raise NotFound(f"no lease named policy version {version} on this node")
        return sha

    def cached(self) -> list[str]:
        """The hashes on disk now (for heartbeats: the coordinator lists them per node)."""
        try:
            return sorted(p.name for p in self.directory.iterdir() if len(p.name) == 64)
        except FileNotFoundError:
            return []

    async def content(self, sha256: str) -> bytes:
        if not is_sha256(sha256):
            raise NotFound("a policy is named by its sha256")
        data = await asyncio.to_thread(self._read, sha256)
        if data is not None:
            self.counters["hits"] += 1
            return data
        pending = self._fetching.get(sha256)
        if pending is None:
            pending = self._fetching[sha256] = asyncio.get_running_loop().create_future()
            try:
                data = await self._fetch_checked(sha256)
                pending.set_result(data)
            except BaseException as exc:
                pending.set_exception(exc)
                pending.exception()  # retrieved here: those waiting on it raise it themselves
                raise
            finally:
                del self._fetching[sha256]
            return data
        return await asyncio.shield(pending)

    async def _fetch_checked(self, sha256: str) -> bytes:
        data = await self._fetch(sha256)
        actual = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        if actual != sha256:
            raise InfraFailure(f"the coordinator sent policy content hashing to {actual}, not {sha256}")
        await asyncio.to_thread(self._store, sha256, data)
        self.counters["fetched"] += 1
        log.info("fetched policy %s (%d bytes)", sha256[:12], len(data),
                 extra={"event": "policy_fetched", "sha256": sha256, "bytes": len(data)})
        return data

    def _read(self, sha256: str) -> bytes | None:
        path = self.directory / sha256
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:  # a torn or tampered file is fetched again
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recency is the file's mtime: it survives a restart
        return data

    def _store(self, sha256: str, data: bytes) -> None:
        tmp = self.directory / f".tmp-{sha256}"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.directory / sha256)
        self._evict(keep=sha256)

    def _evict(self, keep: str) -> None:
        files = []
        for path in self.directory.iterdir():
            if len(path.name) == 64:
                st = path.stat()
                files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.max_bytes:
                break
            if path.name == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            self.counters["evicted"] += 1
