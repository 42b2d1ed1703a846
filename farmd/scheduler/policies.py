"""Published policies: checked, stored, and made the version new jobs run.

Content goes to a file as it arrives, hashed on the way (``farmd.store.policy_files``): farmd holds a
chunk, never a policy. Whatever ends a publish before the policy is stored (a wrong hash, a bound, a
cancelled caller) removes the file before the caller hears of it.

Policies are published to a named line. A job's ``policy_version`` is the version that produces its
trajectory, chosen when it is leased from its agent spec (``version_for``): ``torch:NAME`` runs the version
last published to line NAME; ``openai:MODEL@ENDPOINT`` the version of the line the operator says that endpoint
serves (``[endpoints.NAME] serves``) when MODEL is that line's model there (``policy_model``): the version farmd's
weight sync has loaded into every replica (``synced``), or for an endpoint farm does not sync the line's newest.
Anything else (scripted agents, any other model, on that server or another) 0, no farm policy. For a model
server the version leased is what the farm expects: the trajectory records the version the server said it
sampled with (``farmd.agents.replicas``). Publishing content the farm already holds (a trainer
resumed from a checkpoint) makes that version its line's current one again. A trainer's staleness
counts the versions between a trajectory's and the current one along its own line's lineage (``behind``).
Publications only grow, so they are held here, not read per lease.

A version's content is kept only while something can use it (``remove_unused``): the newest ``keep_newest``
versions of each line (the current one first), an operator's pins, and any version a job queued or leased runs;
every version's hash and metadata are kept for good, and one whose content is gone says so (``PolicyRemoved``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import itertools
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from typing import IO

from farm_client.tinylm_blob import FORMAT, SPECIALS, PolicyFormatError, read_layout

from farmd.errors import BadRequest, FailedPrecondition, NotFound, PolicyRemoved, StoreError
from farmd.records import Policy
from farmd.store import Store
from farmd.store.policy_files import PolicyUpload
from farmd.store.retention import PolicyState, Removed
from farmd.text import is_sha256

log = logging.getLogger("farmd.scheduler.policies")

MAX_URI_CHARS = 4096
MAX_POLICY_READ_BYTES = 1 << 30
"""The most a worker reads whole into memory to load (``content``); larger policies are a uri's business."""
MAX_VOCAB_READ_BYTES = 64 << 20
"""The largest policy whose vocabulary the coordinator reads to check what a node says it sampled (a tiny LM's
blob is a few MB; a larger one is not a policy a ``torch:`` worker loads here)."""
_VERSIONS_KNOWN = 4096
"""Versions whose records ``Policies`` keeps in memory (a publish every step adds one; each is a few hundred bytes)."""
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
    if not is_sha256(text):
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

    __slots__ = ("current", "depth", "recent")

    def __init__(self) -> None:
        self.current = 0
        self.depth: dict[int, int] = {}
        self.recent: dict[int, None] = {}
        """Its versions in the order they were last published: the newest last."""

    def add(self, version: int) -> None:
        if version not in self.depth:
            self.depth[version] = self.depth.get(self.current, -1) + 1
        self.current = version
        self.recent.pop(version, None)
        self.recent[version] = None

    def newest(self, n: int) -> list[int]:
        """The ``n`` versions published to it last (each counted once), the current one first."""
        return list(itertools.islice(reversed(self.recent), n))

    def behind(self, version: int) -> int:
        """How many versions lie between ``version`` and the current one along the lineage (a version on a
        dropped branch counts its distance too); every version the line has when it never was on it."""
        here = self.depth.get(self.current, -1)
        at = self.depth.get(version)
        return here + 1 if at is None else abs(here - at)


def line_of(spec: str, endpoint_lines: Mapping[str, tuple[str, str]] | None = None) -> str | None:
    """The policy line an agent spec runs, or None when it runs no farm policy.

    ``endpoint_lines``: endpoint name -> (the line that endpoint serves, the model name of its policy there), from
    the operator's config: only that model is the line's; another model on the same server runs no farm policy.
    """
    kind, _, rest = spec.partition(":")
    rest = rest.partition("?")[0]
    if kind == "torch":
        return rest if LINE_NAME.fullmatch(rest) else None
    if kind == "openai" and endpoint_lines:
        model, _, name = rest.rpartition("@")
        line, policy_model = endpoint_lines.get(name, (None, None))
        return line if model == policy_model else None
    return None


def endpoint_of(spec: str) -> str | None:
    """The endpoint an ``openai:MODEL@ENDPOINT`` spec names (None for other specs)."""
    kind, _, rest = spec.partition(":")
    return rest.partition("?")[0].rpartition("@")[2] or None if kind == "openai" else None


class Policies:
    def __init__(self, store: Store, on_published: Callable[[int], None],
                 endpoint_lines: Mapping[str, tuple[str, str]] | None = None) -> None:
        self._store = store
        self._on_published = on_published
        """Told each stored policy's version (the scheduler's: new leases run it)."""
        self._endpoint_lines = dict(endpoint_lines or {})
        self._synced: dict[str, int] = {}
        """Endpoints whose servers farmd loads each version into -> the version every replica has loaded."""
        self.watchers: list[Callable[[Policy], None]] = []
        """Told each policy published (after it is stored): the weight sync."""
        self._lines: dict[str | None, _Line] = {None: _Line()}
        """Each line's publications (None: every line's together): ``load``, then each publish."""
        self._by_version: OrderedDict[int, Policy] = OrderedDict()
        self._vocab: OrderedDict[int, int | None] = OrderedDict()
        """Each version's vocabulary size, once read (``vocab_size``)."""
        self._loaded = False
        self._keeping = asyncio.Lock()
        """Held by a publish from storing its content to making it current, and by ``remove_unused`` from choosing
        what to remove to deleting it: a removal never deletes what a publish of the same content just put back,
        and never chooses a version a publish is making current."""

    async def load(self) -> None:
        """Read the publications from the store (once, at start; publishes keep them current)."""
        self._lines = {None: _Line()}
        for name, version in await self._store.publications():
            self._published(name, version)
        self._loaded = True

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
        """The version a job of agent ``spec`` runs if leased now (0: no farm policy); for an endpoint farmd syncs,
        the version its replicas have all loaded."""
        line = line_of(spec, self._endpoint_lines)
        if line is None:
            return 0
        endpoint = endpoint_of(spec)
        if endpoint is not None and endpoint in self._synced:
            return self._synced[endpoint]
        return self.latest(line)

    def syncs(self, endpoint: str) -> None:
        """``endpoint``'s replicas get each version from farmd's weight sync: its jobs lease the version synced."""
        self._synced.setdefault(endpoint, 0)

    def synced(self, endpoint: str, version: int) -> None:
        """Every replica of ``endpoint`` has loaded ``version``: its jobs run it from now on (an earlier version
        too, loaded again for a trainer resumed from its checkpoint)."""
        self._synced[endpoint] = version

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
            self._know(policy)
        return policy.sha256

    def known_sha256(self, version: int) -> str | None:
        """``version``'s hash when this process published or looked it up lately (None: ask ``sha256_of``)."""
        policy = self._by_version.get(version)
        return None if policy is None else policy.sha256

    def _know(self, policy: Policy) -> None:
        """Versions are immutable: what is known of one stays true. The newest few thousand are kept."""
        self._by_version[policy.version] = policy
        self._by_version.move_to_end(policy.version)
        while len(self._by_version) > _VERSIONS_KNOWN:
            self._by_version.popitem(last=False)

    async def vocab_size(self, version: int) -> int | None:
        """How many tokens policy ``version`` samples from, when it is a tiny LM policy whose content farmd holds
        (None for a uri alone, another kind of content, or one past ``MAX_VOCAB_READ_BYTES``): what bounds the
        token ids a node reports for a rollout of that version. Read once per version, off the event loop."""
        if version in self._vocab:
            return self._vocab[version]
        size: int | None = None
        policy = self._by_version.get(version) or (await self._store.policy_by_version(version) if version > 0 else None)
        if policy is not None and policy.uri is None and policy.size <= MAX_VOCAB_READ_BYTES:
            try:
                content = await self.content(policy.sha256)
            except PolicyRemoved:
                # Not cached: published again, it is back. Nothing goes unchecked meanwhile: a version's content
                # is kept while a job is leased for it, and a record naming another version than its lease's
                # is refused by the store (``complete_leases``), whatever its tokens.
                return None
            try:
                layout = await asyncio.to_thread(read_layout, io.BytesIO(content))
                size = SPECIALS + len(layout.config["vocab"])
            except PolicyFormatError:
                size = None
        self._vocab[version] = size
        while len(self._vocab) > _VERSIONS_KNOWN:  # the newest versions' only, as ``_by_version`` keeps
            self._vocab.popitem(last=False)
        return size

    async def content(self, sha256: str) -> bytes:
        """The whole content of the policy hashed ``sha256``, for a worker to load (bounded)."""
        policy = await self.find(sha256)
        if policy.size > MAX_POLICY_READ_BYTES:
            raise BadRequest(f"policy {policy.version} is {policy.size} bytes; a worker loads at most "
                             f"{MAX_POLICY_READ_BYTES}")
        data = bytearray()
        async with contextlib.aclosing(self.chunks(policy, 1 << 20)) as chunks:
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
            async with self._keeping:
                policy = await self._store.add_policy(actual, upload, uri or None, name)
                self._published(name, policy.version)
                self._know(policy)  # its jobs' workers start loading it without asking the store
        finally:
            if upload is not None:
                await upload.discard()  # safe after add_policy kept it, too
        self._on_published(policy.version)
        for watcher in self.watchers:
            watcher(policy)
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
        await self._held(policy.version)
        return policy

    async def _held(self, version: int) -> None:
        """``PolicyRemoved`` (saying when and why) when ``version``'s content was removed."""
        state = await self._store.retention.state(version)
        if state is not None and state.removed_at is not None:
            raise PolicyRemoved(removed_message(state))

    async def chunks(self, policy: Policy, chunk_bytes: int) -> AsyncGenerator[bytes, None]:
        """``policy``'s content, ``chunk_bytes`` at a time; nothing for a uri alone. Content removed since it was
        found raises ``PolicyRemoved``; a file gone missing otherwise, ``StoreError``."""
        try:
            async with contextlib.aclosing(self._store.policy_content(policy.sha256, chunk_bytes)) as content:
                async for chunk in content:
                    yield chunk
        except StoreError:
            await self._held(policy.version)
            raise

    # -- keeping content while something can use it ---------------------------------------------

    async def remove_unused(self, keep_newest: int) -> list[Removed]:
        """Remove the content of every version nothing can use any more: not among the ``keep_newest`` versions
        published last to any line (so never a line's current version, the only one a lease chooses), not pinned,
        no job queued or leased for it. Its hash and metadata stay. Returns what was removed.

        A lease chooses its version inside the store's write transaction, and the store marks versions removed in
        one too, where it also reads which versions jobs are leased for: a version is either leased first (and
        kept) or marked first, and then no lease can choose it, since only a line's current version is chosen and
        that is kept here. Publishes wait meanwhile (``_keeping``), so a version being made current again is kept.
        """
        if keep_newest < 1:
            raise ValueError("keep_newest is at least 1: a line's current version is always kept")
        async with self._keeping:
            if not self._loaded:  # unread lines would keep nothing: every line's current version would go
                await self.load()
            keep = {v for line, held in self._lines.items() if line is not None for v in held.newest(keep_newest)}
            why = (f"nothing could use it any more: no job was queued or leased for it, it was not pinned, and it was "
                   f"not among the newest {keep_newest} versions of any line (policy_keep_newest)")
            removed = await self._store.retention.remove_unused(keep, why)
            removed += [r for r in await self._store.retention.leftovers() if r not in removed]
            freed = await self._store.retention.drop_content(removed)
        if removed:
            log.info("removed the content of %d policy versions (%d bytes): %s", len(removed), freed,
                     ", ".join(str(r.version) for r in removed[:20]) + (" ..." if len(removed) > 20 else ""),
                     extra={"event": "policies_removed", "versions": [r.version for r in removed], "bytes": freed})
        return removed

    async def pin(self, version: int, pinned: bool) -> PolicyState:
        """Pin ``version`` (its content is kept whatever else holds) or unpin it; ``NotFound`` for no such version,
        ``FailedPrecondition`` (reason ``POLICY_REMOVED``) to pin one whose content is gone already."""
        state = await self._store.retention.pin(version, pinned)
        if state is None:
            raise NotFound(f"no policy version {version}")
        if pinned and state.removed_at is not None:
            raise FailedPrecondition(f"{removed_message(state)}; nothing is left to pin",
                                     reason=PolicyRemoved.reason)
        return state

    async def listing(self, before: int, limit: int) -> list[PolicyState]:
        """Versions below ``before`` (0: from the newest), newest first: what each is, pinned, removed and why."""
        return await self._store.retention.listing(before, limit)


def removed_message(state: PolicyState) -> str:
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.removed_at or 0))
    return (f"policy version {state.version} (line {state.name!r}, sha256 {state.sha256}) was removed at {at}: "
            f"{state.removed_why}. Its hash and metadata are kept; publishing the same content again restores it")
