"""Published policies: checked, stored, and made the version new jobs run.

Content goes to a file as it arrives, hashed on the way (``farmd.store.policy_files``): farmd holds a
chunk, never a policy. Whatever ends a publish before the policy is stored (a wrong hash, a bound, a
cancelled caller) removes the file before the caller hears of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from dataclasses import dataclass

from farmd.errors import BadRequest, NotFound
from farmd.records import Policy
from farmd.store import Store
from farmd.store.policy_files import PolicyUpload

MAX_URI_CHARS = 4096
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class PolicyChunk:
    """One piece of a publish: the first non-empty ``sha256`` and ``uri`` seen are the policy's."""

    sha256: str
    uri: str
    data: bytes


def check_sha256(text: str) -> None:
    if not (len(text) == 64 and set(text) <= _HEX):
        raise BadRequest("sha256 is 64 lowercase hex digits")


class Policies:
    def __init__(self, store: Store, on_published: Callable[[int], None]) -> None:
        self._store = store
        self._on_published = on_published
        """Told each stored policy's version (the scheduler's: new leases run it)."""

    async def publish(self, chunks: AsyncIterable[PolicyChunk]) -> Policy:
        """Store the policy ``chunks`` carry: content, a uri, or both. A declared sha256 must be the
        content's (or, for a uri alone, the uri's); the same content twice is the same version."""
        declared = uri = ""
        upload: PolicyUpload | None = None
        try:
            async for chunk in chunks:
                declared = declared or chunk.sha256
                uri = uri or chunk.uri
                if not chunk.data:
                    continue
                upload = upload or await self._store.policy_upload()
                await upload.write(chunk.data)
            if declared:
                check_sha256(declared)
            if len(uri) > MAX_URI_CHARS:
                raise BadRequest(f"a policy uri is at most {MAX_URI_CHARS} characters")
            if upload is None and not uri:
                raise BadRequest("a policy needs content or a uri")
            actual = upload.sha256 if upload is not None else hashlib.sha256(uri.encode()).hexdigest()
            if declared and declared != actual:
                raise BadRequest(f"content hashes to {actual}, not the declared {declared}",
                                 reason="POLICY_HASH_MISMATCH")
            policy = await self._store.add_policy(actual, upload, uri or None)
        finally:
            if upload is not None:
                await upload.discard()  # safe after add_policy kept it, too
        self._on_published(policy.version)
        return policy

    async def find(self, sha256: str) -> Policy:
        """The policy with content hash ``sha256``; "": the latest published."""
        if sha256:
            check_sha256(sha256)
        policy = await (self._store.policy_by_hash(sha256) if sha256 else self._store.latest_policy())
        if policy is None:
            raise NotFound("no such policy" if sha256 else "no policy has been published")
        return policy

    def content(self, policy: Policy, chunk_bytes: int) -> AsyncGenerator[bytes, None]:
        """``policy``'s content, ``chunk_bytes`` at a time; nothing for a uri alone. A file gone
        missing raises ``StoreError``."""
        return self._store.policy_content(policy.sha256, chunk_bytes)
