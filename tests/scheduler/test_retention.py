"""Policy content kept only while something can use it, against a real store and real files: the newest of each
line, an operator's pins, versions jobs are queued or leased for; never one a lease chose before its content was
read. Every version's hash and metadata stay, and one whose content went says when and why."""

from __future__ import annotations

import asyncio
import time

import pytest

from farmd.errors import FailedPrecondition, NotFound, PolicyRemoved
from farmd.records import Job, Trajectory
from farmd.scheduler import PolicyChunk, Scheduler
from farmd.store import Store

LEVELS = {"rg:chain_sum": 5}


def scored(job: Job) -> Trajectory:
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=job.policy_version, reward=1.0,
                      passed=True, status="ok", reasons=[], flags=[], verifier_version="1", steps=[], final="x",
                      node="n1")


async def _chunks(data: bytes, name: str):  # type: ignore[no-untyped-def]
    yield PolicyChunk(sha256="", uri="", data=data, name=name)


async def held(store: Store) -> dict[str, int]:
    """Each version's content the store holds, by hash, with its size: files, or the database's chunks."""
    return await store._policies.files.content_held()


async def files(store: Store) -> set[str]:
    return set(await held(store))


async def publish(s: Scheduler, data: bytes, line: str) -> tuple[int, str]:
    policy = await s.policies.publish(_chunks(data, line))
    return policy.version, policy.sha256


async def test_a_loop_of_publishes_keeps_the_newest_of_each_line_and_every_version_s_hash(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(policy_keep_newest=2)
    published: dict[str, list[tuple[int, str]]] = {"tiny": [], "other": []}
    for i in range(12):
        line = "tiny" if i % 3 else "other"
        published[line].append(await publish(s, f"{line}-{i}".encode() * 1000, line))
        await s.retention.sweep()
        kept = {sha for versions in published.values() for _, sha in versions[-2:]}
        assert await files(store) == kept, f"after publish {i}"
    listing = {p.version: p for p in await s.policies.listing(0, 100)}
    assert sorted(listing) == list(range(1, 13)), "every version's row stays"
    for line, versions in published.items():
        for version, sha in versions:
            state = listing[version]
            assert (state.sha256, state.name) == (sha, line) and state.size in (len(line) * 1000 + 2000,
                                                                                 len(line) * 1000 + 3000)
            assert state.has_content == ((version, sha) in versions[-2:])
            assert (state.removed_at is None) == state.has_content
    old_version, old_sha = published["tiny"][0]
    with pytest.raises(PolicyRemoved) as removed:
        await s.policies.find(old_sha)
    said = str(removed.value)
    assert f"policy version {old_version}" in said and old_sha in said and "'tiny'" in said, said
    assert "not among the newest 2 versions" in said and "no job was queued or leased" in said, said
    with pytest.raises(PolicyRemoved):
        await s.policies.content(old_sha)
    with pytest.raises(NotFound):
        await s.policies.find("0" * 64)

    usage = (await s.retention.disk()).usage
    assert (usage.kept, usage.removed, usage.pinned) == (4, 8, 0)
    assert usage.policy_files == 4 and usage.policy_bytes == sum((await held(store)).values())
    assert usage.store_bytes > 0


async def test_publishing_removed_content_again_brings_it_back_as_the_current_version(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(policy_keep_newest=1)
    first = await publish(s, b"checkpoint-a", "tiny")
    second = await publish(s, b"checkpoint-b", "tiny")
    await s.retention.sweep()
    assert await files(store) == {second[1]}
    again = await publish(s, b"checkpoint-a", "tiny")  # a trainer resumed from its checkpoint
    assert again == first and s.policies.version_for("torch:tiny") == first[0]
    assert await s.policies.content(first[1]) == b"checkpoint-a"
    await s.retention.sweep()
    assert await files(store) == {first[1]}, "the resumed version is current: version 2 goes, version 1 stays"
    state = await store.retention.state(first[0])
    assert state is not None and state.removed_at is None and state.removed_why == "" and state.has_content


async def test_a_pinned_version_survives_until_it_is_unpinned(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(policy_keep_newest=1)
    pinned = await publish(s, b"keep-me", "tiny")
    assert (await s.policies.pin(pinned[0], True)).pinned_at is not None
    gone = await publish(s, b"lose-me", "tiny")
    for i in range(3):
        await publish(s, f"later-{i}".encode(), "tiny")
    await s.retention.sweep()
    assert pinned[1] in await files(store) and gone[1] not in await files(store)
    assert await s.policies.content(pinned[1]) == b"keep-me"
    with pytest.raises(FailedPrecondition) as refused:
        await s.policies.pin(gone[0], True)
    assert refused.value.reason == "POLICY_REMOVED" and "nothing is left to pin" in str(refused.value)
    with pytest.raises(NotFound):
        await s.policies.pin(999, True)
    assert (await s.policies.pin(pinned[0], False)).pinned_at is None
    await s.retention.sweep()
    assert pinned[1] not in await files(store)
    with pytest.raises(PolicyRemoved):
        await s.policies.find(pinned[1])


async def test_a_leased_version_survives_until_its_jobs_end(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(policy_keep_newest=1, group_size=2)
    leased_version, leased_sha = await publish(s, b"v-leased", "tiny")
    await s.submit("rg:chain_sum", "torch:tiny", 4)
    jobs = await s.lease("n1:1:a", 4)
    assert {j.policy_version for j in jobs} == {leased_version} and len(jobs) == 4
    for i in range(4):
        await publish(s, f"v-{i}".encode(), "tiny")
    await s.retention.sweep()
    assert await files(store) == {leased_sha, (await store.latest_policy("tiny")).sha256}  # type: ignore[union-attr]
    assert await s.policies.content(leased_sha) == b"v-leased", "a node may still fetch what it leased"
    await s.complete("n1:1:a", [scored(j) for j in jobs[:3]])
    await s.retention.sweep()
    assert leased_sha in await files(store), "one job is still leased"
    await s.complete("n1:1:a", [scored(jobs[3])])
    await s.retention.sweep()
    assert leased_sha not in await files(store)
    trajectories = await store.trajectories(limit=10)
    assert {t.policy_version for t in trajectories} == {leased_version}, "its trajectories keep their version"


async def test_a_version_chosen_for_a_lease_is_never_removed_before_its_content_is_read(farm) -> None:  # type: ignore[no-untyped-def]
    """Publishes, sweeps and leases at once, keeping only each line's current version: every version a lease
    chose can still be read by its holder, however the three interleave (a lease chooses the current version
    inside its write transaction; a sweep keeps versions jobs are leased for, read inside its own, and holds
    publishes off between choosing what to keep and removing it)."""
    store, open_ = farm
    s = await open_(policy_keep_newest=1, group_size=1)
    await publish(s, b"w-0", "tiny")
    await s.submit("rg:chain_sum", "torch:tiny", 600)
    done = asyncio.Event()
    read: list[int] = []
    sweeps = 0

    async def publisher() -> None:
        for i in range(1, 150):
            await publish(s, f"w-{i}".encode(), "tiny")
            await asyncio.sleep(0)
        done.set()

    swept = asyncio.Condition()

    async def sweeper() -> None:
        nonlocal sweeps
        while not done.is_set():
            await s.retention.sweep()
            async with swept:
                sweeps += 1
                swept.notify_all()
            await asyncio.sleep(0)
        async with swept:
            swept.notify_all()

    async def holder(k: int) -> None:
        owner = f"n{k}:1:a"
        while not done.is_set():
            jobs = await s.lease(owner, 2)
            after = sweeps + 2  # the node asks for the content some time after its lease: a whole sweep later
            async with swept:
                await swept.wait_for(lambda after=after: sweeps >= after or done.is_set())  # type: ignore[misc]
            for job in jobs:
                sha = await s.policies.sha256_of(job.policy_version)
                assert await s.policies.content(sha) == f"w-{job.policy_version - 1}".encode()
                read.append(job.policy_version)
            await s.complete(owner, [scored(j) for j in jobs])

    await asyncio.wait_for(asyncio.gather(publisher(), sweeper(), *(holder(k) for k in range(3))), 120)
    assert len(set(read)) > 20, f"leases ran only {len(set(read))} versions: no race was exercised"
    assert s.retention.removed > 100
    await s.retention.sweep()
    assert await files(store) == {(await store.latest_policy("tiny")).sha256}  # type: ignore[union-attr]


async def test_a_sweep_that_stopped_half_way_removes_the_files_it_left(farm) -> None:  # type: ignore[no-untyped-def]
    store, open_ = farm
    s = await open_(policy_keep_newest=1)
    old = await publish(s, b"old", "tiny")
    new = await publish(s, b"new", "tiny")
    marked = await store.retention.remove_unused({new[0]}, "a test")  # the rows marked, the files not yet deleted
    assert [r.version for r in marked] == [old[0]] and await files(store) == {old[1], new[1]}
    with pytest.raises(PolicyRemoved):
        await s.policies.content(old[1])  # marked is gone: never read as empty content
    await s.retention.sweep()
    assert await files(store) == {new[1]}


async def test_the_disk_figures_say_how_fast_the_store_and_the_policies_grow(farm) -> None:  # type: ignore[no-untyped-def]
    _store, open_ = farm
    s = await open_(policy_keep_newest=100)
    first = await s.retention.disk()
    assert first.store_growth_per_h is None and first.policy_growth_per_h is None and first.keep_newest == 100
    await publish(s, bytes(300_000), "tiny")
    await s.submit("rg:chain_sum", "reference", 200)
    started = time.monotonic()
    await asyncio.sleep(1.2)
    later = await s.retention.disk()
    span = later.window_s
    assert 1.0 <= span <= time.monotonic() - started + 0.5
    assert later.policy_growth_per_h == pytest.approx(300_000 * 3600 / span, rel=0.01)
    assert later.store_growth_per_h is not None and later.store_growth_per_h > 0
    assert later.usage.policy_bytes - first.usage.policy_bytes == 300_000
