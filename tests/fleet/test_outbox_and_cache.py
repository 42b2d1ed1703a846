"""What a node keeps on its own disk: results until the coordinator has them, policies by content hash."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from farmd.errors import InfraFailure, NotFound
from farmd.fleet.outbox import Buffered, Outbox
from farmd.fleet.policy_cache import PolicyCache
from farmd.fleet.remote import MESSAGE_BYTES, PART_BYTES, _messages


async def test_the_outbox_keeps_results_across_a_restart_until_they_are_removed(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox")
    await box.open()
    await box.put([Buffered(7, "n1:1:aa", b"seven"), Buffered(9, "n1:1:aa", b"\x00nine\n\xff")])
    (tmp_path / "outbox" / ".tmp-11").write_bytes(b"cut short")  # a write a crash interrupted
    again = Outbox(tmp_path / "outbox")
    await again.open()
    assert again.ids() == [7, 9]
    assert await again.read([9, 7, 8]) == [Buffered(9, "n1:1:aa", b"\x00nine\n\xff"), Buffered(7, "n1:1:aa", b"seven")]
    assert not (tmp_path / "outbox" / ".tmp-11").exists()
    await again.remove([7])
    assert again.ids() == [9] and len(again) == 1
    assert oct((tmp_path / "outbox" / "9.result").stat().st_mode & 0o777) == "0o600"


def test_a_large_record_travels_in_pieces_and_messages_stay_small() -> None:
    big = Buffered(1, "n:1:a", os.urandom(PART_BYTES * 2 + 10))
    small = [Buffered(i, "n:1:a", b"x" * 1000) for i in range(2, 50)]
    messages = list(_messages([big, *small]))
    assert all(sum(len(p.data) for p in parts) <= MESSAGE_BYTES for parts, _ in messages)
    pieces = [p for parts, _ in messages for p in parts if p.job_id == 1]
    assert len(pieces) == 3 and [p.last for p in pieces] == [False, False, True]
    assert b"".join(p.data for p in pieces) == big.data
    assert sorted(i for _, ids in messages for i in ids) == list(range(1, 50)), "each record ends once"


async def test_policies_are_fetched_once_checked_and_the_least_recently_used_evicted(tmp_path: Path) -> None:
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (b"a" * 400, b"b" * 400, b"c" * 400)}
    fetched: list[str] = []

    async def fetch(sha: str) -> bytes:
        fetched.append(sha)
        return blobs.get(sha, b"not what was asked for")

    cache = PolicyCache(tmp_path / "policies", max_bytes=900, fetch=fetch)
    await cache.open()
    a, b, c = blobs
    cache.learn(3, a)
    assert await cache.sha256_of(3) == a
    with pytest.raises(NotFound):
        await cache.sha256_of(4)
    assert [await cache.content(a) for _ in range(3)] == [blobs[a]] * 3
    assert fetched == [a], "fetched once, then read from disk"
    await cache.content(b)
    os.utime(tmp_path / "policies" / a)  # a was used after b
    os.utime(tmp_path / "policies" / b, (1, 1))
    await cache.content(c)  # 1200 bytes > 900: the least recently used (b) goes
    assert sorted(cache.cached()) == sorted([a, c])
    with pytest.raises(InfraFailure, match="hashing to"):
        await cache.content("0" * 64)
    assert ("0" * 64) not in cache.cached(), "content that is not what its hash says is never kept"
    (tmp_path / "policies" / a).write_bytes(b"torn")
    assert await cache.content(a) == blobs[a] and fetched[-1] == a, "a damaged file is fetched again"
