"""Policy content in files beside the database, and a store whose files only farmd can read."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from farmd.store import Store
from farmd.store.policy_files import PolicyFiles, PolicyUpload
from farmd.store.schema import MIGRATIONS


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def uploads(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(".")) if folder.exists() else []


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.sqlite_only
async def test_content_goes_to_a_private_file_named_by_its_hash(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        content = os.urandom(10_000)
        digest = hashlib.sha256(content).hexdigest()
        upload = await store.policy_upload()
        for i in range(0, len(content), 3000):
            await upload.write(content[i:i + 3000])
        policy = await store.add_policy(digest, upload, None)
        assert (policy.version, policy.size) == (1, len(content))
        path = tmp_path / "policies" / digest
        assert path.read_bytes() == content and mode(path) == 0o600 and mode(path.parent) == 0o700
        assert b"".join([c async for c in store.policy_content(digest, 4096)]) == content
        assert [len(c) async for c in store.policy_content(digest, 4096)] == [4096, 4096, 1808]
        assert (await store.add_policy(digest, content, None)).version == 1, "the same content, the same version"
        assert sorted(os.listdir(tmp_path / "policies")) == [digest]

        with pytest.raises(ValueError, match="hashes to"):
            await store.add_policy("0" * 64, b"other", None)
        assert sorted(os.listdir(tmp_path / "policies")) == [digest] and await store.policy_by_hash("0" * 64) is None
        assert [c async for c in store.policy_content("0" * 64, 4096)] == []
    finally:
        await store.close()


async def test_a_discarded_upload_leaves_nothing_even_mid_write(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        upload = await store.policy_upload()
        await upload.write(b"x" * 1000)
        writing = asyncio.create_task(upload.write(bytes(256 << 20)))  # still in its thread when cancelled
        await asyncio.sleep(0.01)
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        await upload.discard()
        assert uploads(tmp_path / "policies") == []
        with pytest.raises(ValueError):
            await upload.write(b"late")
        await upload.discard()  # twice is fine
    finally:
        await store.close()


async def test_an_upload_cancelled_while_its_file_is_made_leaves_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is made in a thread, which runs on when its caller is cancelled (a client that cancels as its
    upload starts): nobody holds that upload to discard it, so making it discards it. CI found the file left."""
    store = await Store.open(tmp_path / "farm.db")
    made = threading.Event()
    making = PolicyFiles._upload

    def slowly(self: PolicyFiles) -> PolicyUpload:
        upload = making(self)
        made.set()
        time.sleep(0.3)  # the caller is cancelled meanwhile
        return upload

    try:
        monkeypatch.setattr(PolicyFiles, "_upload", slowly)
        opening = asyncio.create_task(store.policy_upload())
        await asyncio.to_thread(made.wait, 10)
        assert len(uploads(tmp_path / "policies")) == 1
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert uploads(tmp_path / "policies") == []
    finally:
        monkeypatch.undo()
        await store.close()


async def test_opening_sweeps_only_what_nobody_holds(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    folder = tmp_path / "policies"
    try:
        live = await store.policy_upload()  # an upload in progress, its file locked
        await live.write(b"in progress")
        stale = folder / ".upload-1-dead"  # what a crashed farmd left: nobody holds it, nobody writes it
        stale.write_bytes(b"half a policy")
        os.utime(stale, (time.time() - 60, time.time() - 60))
        fresh = folder / ".upload-2-new"  # just created, not locked yet
        fresh.write_bytes(b"")
        other = await Store.open(tmp_path / "farm.db")  # another opener of the same data
        await other.close()
        assert not stale.exists() and fresh.exists() and len(uploads(folder)) == 2
        content = b"in progress"
        assert (await store.add_policy(hashlib.sha256(content).hexdigest(), live, None)).version == 1
        assert uploads(folder) == [fresh.name]
    finally:
        await store.close()


@pytest.mark.sqlite_only
async def test_a_blob_an_older_farmd_stored_is_read_a_slice_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "farm.db"
    blob = os.urandom(100_003)
    digest = hashlib.sha256(blob).hexdigest()
    con = sqlite3.connect(path)
    for version, script in enumerate(MIGRATIONS[:2], start=1):
        con.executescript(f"BEGIN; {script}; PRAGMA user_version={version}; COMMIT;")
    con.execute("INSERT INTO policies(version, sha256, size, blob, uri, created_at) VALUES (1, ?, ?, ?, NULL, 0)",
                (digest, len(blob), blob))
    con.commit()
    con.close()
    store = await Store.open(path)
    try:
        chunks = [c async for c in store.policy_content(digest, 30_000)]
        assert [len(c) for c in chunks] == [30_000, 30_000, 30_000, 10_003] and b"".join(chunks) == blob
        assert (await store.add_policy(digest, blob, None)).version == 1
        assert not (tmp_path / "policies" / digest).exists(), "kept once, in its blob"
    finally:
        await store.close()


@pytest.mark.sqlite_only
async def test_the_database_and_its_journal_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with umask(0o022):  # what a shell usually gives: files 0644 unless their creator says otherwise
        store = await Store.open(data / "farm.db")
        try:
            await store.enqueue([("py-func", 1, 1, "reference", 2)])
            await store.add_policy(hashlib.sha256(b"w").hexdigest(), b"w", None)
            names = sorted(os.listdir(data))
            for name in names:
                assert mode(data / name) & 0o077 == 0, f"{name} is {mode(data / name):o}"
            assert mode(data) == 0o700
            assert {"farm.db", "farm.db-wal", "farm.db-shm"} <= set(names), names
        finally:
            await store.close()
