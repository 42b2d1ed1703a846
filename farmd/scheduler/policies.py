"""Published policies: checked, stored, and made the version new jobs run.

Content goes to a file as it arrives, hashed on the way (``farmd.store.policy_files``): farmd holds a
chunk, never a policy. Whatever ends a publish before the policy is stored (a wrong hash, a bound, a
cancelled caller) removes the file before the caller hears of it.

Policies are published to a named line. A job's ``policy_version`` is the version that produces its
trajectory, chosen when it is leased from its agent spec (``version_for``): ``torch:NAME`` runs the version
last published to line NAME; ``openai:MODEL@ENDPOINT`` that of the line the operator says that endpoint
serves (``[endpoints.NAME] serves``), when it says so; anything else (scripted agents, an endpoint serving
a model the farm never saw) 0, no farm policy. Publishing content the farm already holds (a trainer
resumed from a checkpoint) makes that version its line's current one again. A trainer's staleness
counts the versions between a trajectory's and the current one along its own line's lineage (``behind``).
Publications only grow, so they are held here, not read per lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import re
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from typing import IO

from farm_client.tinylm_blob import FORMAT, SPECIALS, PolicyFormatError, read_layout

from farmd.errors import BadRequest, NotFound
from farmd.records import Policy
from farmd.store import Store
from farmd.store.policy_files import PolicyUpload

MAX_URI_CHARS = 4096
MAX_POLICY_READ_BYTES = 1 << 30
"""The most a worker reads whole into memory to load (``content``); larger policies are a uri's business."""
MAX_VOCAB_READ_BYTES = 64 << 20
"""The largest policy whose vocabulary the coordinator reads to check what a node says it sampled (a tiny LM's
blob is a few MB; a larger one is not a policy a ``torch:`` worker loads here)."""
_HEX = frozenset("0123456789abcdef")
LINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A policy line's name: what ``torch:NAME`` says."""


@dataclass(frozen=True, slots=True)
class PolicyChunk:
    """One piece of a publish: the first non-empty ``sha256`` and ``uri`` seen are the policy's."""

    sha256: str
    uri: str
    data: bytes
    name: str = ""
    """The line it is published to; the first non-empty one seen is the policy's."""


def check_sha256(text: str) -> None:
    if not (len(text) == 64 and set(text) <= _HEX):
        raise BadRequest("sha256 is 64 lowercase hex digits")


def check_content(content: IO[bytes]) -> None:
    """``BadRequest`` for content that says it is a tiny LM policy (``torch:NAME`` agents load those) and is not
    one a worker could load: every size it declares is checked against the bytes it holds, from its
    archive's directory and its pickle alone, so a few kilobytes that declare a model of gigabytes cost
    farmd nothing. Content that says it is something else is another kind of policy: stored, never loaded."""
    try:
        read_layout(content)
    except PolicyFormatError as exc:
        if exc.claimed:
            raise BadRequest(f"this policy says it is a {FORMAT} policy, and no worker could load it: {exc}",
                             reason="BAD_POLICY") from None


class _Line:
    """One line's lineage: which version is current, and each version's depth in it.

    A version first published is one deeper than the version current then. Publishing one the line already
    holds (a trainer resumed from its checkpoint) makes it current again at its own depth: what was published
    after it is a branch the trainer no longer has, not progress, so the trajectories it learned from before
    the crash are no staler after it than they were then.
    """

    __slots__ = ("current", "depth")

    def __init__(self) -> None:
        self.current = 0
        self.depth: dict[int, int] = {}

    def add(self, version: int) -> None:
        if version not in self.depth:
            self.depth[version] = self.depth.get(self.current, -1) + 1
        self.current = version

    def behind(self, version: int) -> int:
        """How many versions lie between ``version`` and the current one along the lineage (a version on a
        dropped branch counts its distance too); every version the line has when it never was on it."""
        here = self.depth.get(self.current, -1)
        at = self.depth.get(version)
        return here + 1 if at is None else abs(here - at)


def line_of(spec: str, endpoint_lines: Mapping[str, str] | None = None) -> str | None:
    """The policy line an agent spec runs, or None when it runs no farm policy.

    ``endpoint_lines``: endpoint name -> the line that endpoint serves (from the operator's config).
    """
    kind, _, rest = spec.partition(":")
    rest = rest.partition("?")[0]
    if kind == "torch":
        return rest if LINE_NAME.fullmatch(rest) else None
    if kind == "openai" and endpoint_lines:
        return endpoint_lines.get(rest.rpartition("@")[2])
    return None


class Policies:
    def __init__(self, store: Store, on_published: Callable[[int], None],
                 endpoint_lines: Mapping[str, str] | None = None) -> None:
        self._store = store
        self._on_published = on_published
        """Told each stored policy's version (the scheduler's: new leases run it)."""
        self._endpoint_lines = dict(endpoint_lines or {})
        self._lines: dict[str | None, _Line] = {None: _Line()}
        """Each line's publications (None: every line's together): ``load``, then each publish."""
        self._by_version: dict[int, Policy] = {}
        self._vocab: dict[int, int | None] = {}
        """Each version's vocabulary size, once read (``vocab_size``)."""

    async def load(self) -> None:
        """Read the publications from the store (once, at start; publishes keep them current)."""
        self._lines = {None: _Line()}
        for name, version in await self._store.publications():
            self._published(name, version)

    def _published(self, name: str, version: int) -> None:
        self._lines.setdefault(name, _Line()).add(version)
        self._lines[None].add(version)

    def newest(self) -> int:
        """The highest version ever published, of any line (0: none): versions only move forward."""
        return max(self._lines[None].depth, default=0)

    def latest(self, line: str) -> int:
        """The version last published to ``line``; 0 when none was."""
        found = self._lines.get(line)
        return found.current if found is not None else 0

    def unpublished(self, spec: str) -> str | None:
        """The policy line whose jobs of agent ``spec`` cannot run yet: a ``torch:`` line nobody has published
        to (a worker would have nothing to load). None: they can run now (an endpoint answers with whatever it
        serves until a policy is published). CreateRun refuses such a run; demand queues none for it."""
        line = self.line_for(spec) if spec.startswith("torch:") else None
        return line if line is not None and not self.latest(line) else None

    def version_for(self, spec: str) -> int:
        """The version a job of agent ``spec`` runs if leased now (0: no farm policy)."""
        line = line_of(spec, self._endpoint_lines)
        return 0 if line is None else self.latest(line)

    def line_for(self, spec: str) -> str | None:
        return line_of(spec, self._endpoint_lines)

    def behind(self, line: str | None, version: int) -> int:
        """Versions between ``version`` and the current one of ``line`` (None: of every line together), along
        the lineage: every one of them when it never was published there."""
        found = self._lines.get(line)
        return found.behind(version) if found is not None else 0

    async def sha256_of(self, version: int) -> str:
        """The content hash of ``version`` (``NotFound`` when there is none): what a worker fetches it by."""
        policy = self._by_version.get(version)
        if policy is None:
            policy = await self._store.policy_by_version(version) if version > 0 else None
            if policy is None:
                raise NotFound(f"no policy version {version}")
            self._by_version[version] = policy
        return policy.sha256

    async def vocab_size(self, version: int) -> int | None:
        """How many tokens policy ``version`` samples from, when it is a tiny LM policy whose content farmd holds
        (None for a uri alone, another kind of content, or one past ``MAX_VOCAB_READ_BYTES``): what bounds the
        token ids a node reports for a rollout of that version. Read once per version, off the event loop."""
        if version in self._vocab:
            return self._vocab[version]
        size: int | None = None
        policy = self._by_version.get(version) or (await self._store.policy_by_version(version) if version > 0 else None)
        if policy is not None and policy.uri is None and policy.size <= MAX_VOCAB_READ_BYTES:
            content = await self.content(policy.sha256)
            try:
                layout = await asyncio.to_thread(read_layout, io.BytesIO(content))
                size = SPECIALS + len(layout.config["vocab"])
            except PolicyFormatError:
                size = None
        self._vocab[version] = size
        return size

    async def content(self, sha256: str) -> bytes:
        """The whole content of the policy hashed ``sha256``, for a worker to load (bounded)."""
        policy = await self.find(sha256)
        if policy.size > MAX_POLICY_READ_BYTES:
            raise BadRequest(f"policy {policy.version} is {policy.size} bytes; a worker loads at most "
                             f"{MAX_POLICY_READ_BYTES}")
        data = bytearray()
        async with contextlib.aclosing(self._store.policy_content(sha256, 1 << 20)) as chunks:
            async for chunk in chunks:
                data += chunk
        return bytes(data)

    async def publish(self, chunks: AsyncIterable[PolicyChunk]) -> Policy:
        """Store the policy ``chunks`` carry: content, a uri, or both. A declared sha256 must be the
        content's (or, for a uri alone, the uri's); the same content twice is the same version."""
        declared = uri = name = ""
        upload: PolicyUpload | None = None
        try:
            async for chunk in chunks:
                declared = declared or chunk.sha256
                uri = uri or chunk.uri
                name = name or chunk.name
                if not chunk.data:
                    continue
                upload = upload or await self._store.policy_upload()
                await upload.write(chunk.data)
            if declared:
                check_sha256(declared)
            if name and not LINE_NAME.fullmatch(name):
                raise BadRequest("a policy's name is 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                                 "or digit")
            if len(uri) > MAX_URI_CHARS:
                raise BadRequest(f"a policy uri is at most {MAX_URI_CHARS} characters")
            if upload is None and not uri:
                raise BadRequest("a policy needs content or a uri")
            if upload is not None:
                await upload.inspect(check_content)
            actual = upload.sha256 if upload is not None else hashlib.sha256(uri.encode()).hexdigest()
            if declared and declared != actual:
                raise BadRequest(f"content hashes to {actual}, not the declared {declared}",
                                 reason="POLICY_HASH_MISMATCH")
            policy = await self._store.add_policy(actual, upload, uri or None, name)
        finally:
            if upload is not None:
                await upload.discard()  # safe after add_policy kept it, too
        self._published(name, policy.version)
        self._on_published(policy.version)
        return policy

    async def find(self, sha256: str, name: str | None = None) -> Policy:
        """The policy with content hash ``sha256``; "": the latest published (of line ``name``, if given)."""
        if sha256:
            check_sha256(sha256)
        policy = await (self._store.policy_by_hash(sha256) if sha256 else self._store.latest_policy(name))
        if policy is None:
            if sha256:
                raise NotFound("no such policy")
            raise NotFound(f"no policy named {name!r} has been published" if name else "no policy has been published")
        return policy

    def chunks(self, policy: Policy, chunk_bytes: int) -> AsyncGenerator[bytes, None]:
        """``policy``'s content, ``chunk_bytes`` at a time; nothing for a uri alone. A file gone
        missing raises ``StoreError``."""
        return self._store.policy_content(policy.sha256, chunk_bytes)
