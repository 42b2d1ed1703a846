"""A trajectory's body: what goes in comes back, through each way a body has been written."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import zlib
from pathlib import Path

import pytest

from farmd.domain import FLOAT32_MAX
from farmd.records import ChatMessage, PosedTask, SamplingParams, Trajectory, Turn, Usage, to_plain
from farmd.store import Store, codec
from farmd.store.codec import Recent, traj_row


def f32(x: float) -> float:
    """A logprob as servers send them: a float32 widened to a double."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def record(job_id: int, group_id: int, turns: list[Turn]) -> Trajectory:
    return Trajectory(id=job_id, group_id=group_id, env="py-func", env_version="1", seed=1, difficulty=2,
                      agent="chat:m", policy_version=0, reward=1.0, passed=True, status="ok", reasons=[], flags=[],
                      verifier_version="1", final="def transform(x): return x", node="n1",
                      task=PosedTask(prompt="Write transform(x).", examples=[{"input": [1], "output": 1}]),
                      messages=[ChatMessage("system", "s"), ChatMessage("user", "Write transform(x)."),
                                ChatMessage("assistant", "first"), ChatMessage("user", "again"),
                                ChatMessage("assistant", "second, edited")],
                      turns=turns, sampling=SamplingParams(model="m", temperature=1.0, stop=["</s>"]),
                      usage=Usage(prompt_tokens=9, completion_tokens=4, total_tokens=13, requests=2))


TURNS = [
    # The ends of each domain (farmd.domain): the largest int32 token id, the smallest float32 logprob.
    Turn(message_index=2, prompt_messages=2, completion="first", prompt_token_ids=[0, 151_935, 2 ** 31 - 1],
         token_ids=[7, 8, 9], logprobs=[f32(-0.0001234), -1e-300, -FLOAT32_MAX], has_logprobs=True,
         finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=3)),
    # Its message was edited after the reply (so the text is kept apart); no logprobs came back.
    Turn(message_index=4, prompt_messages=4, completion="second", prompt_token_ids=list(range(1000)),
         token_ids=[5], finish_reason="length"),
    # No message of its own (a turn whose reply was not kept in the conversation).
    Turn(message_index=9, completion="orphan", token_ids=[3, 2 ** 20], logprobs=[-0.5, -0.25], has_logprobs=True),
]


async def test_turns_come_back_as_they_went_in(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "farm.db")
    try:
        await store.enqueue([("py-func", 1, 2, "chat:m", 2)])
        jobs = await store.lease("w", 2, 30, 0)
        sent = [record(jobs[0].id, jobs[0].group_id, TURNS), record(jobs[1].id, jobs[1].group_id, [])]
        expected = [to_plain(t) for t in sent]
        assert await store.complete([("w", t) for t in sent]) == [j.id for j in jobs]
        for want, job in zip(expected, jobs, strict=True):
            got = await store.trajectory(job.id)
            assert got is not None
            for name in ("task", "messages", "turns", "sampling", "usage", "final"):
                assert to_plain(getattr(got, name)) == want[name], name
        streamed = await store.group_trajectories([jobs[0].group_id])
        assert [to_plain(t.turns) for t in streamed] == [want["turns"] for want in expected]
    finally:
        await store.close()


async def test_a_body_of_json_only_is_still_read(tmp_path: Path) -> None:
    """Version 2 kept token ids and logprobs in the JSON."""
    db = tmp_path / "farm.db"
    store = await Store.open(db)
    try:
        await store.enqueue([("py-func", 1, 2, "chat:m", 1)])
        (job,) = await store.lease("w", 1, 30, 0)
        sent = record(job.id, job.group_id, TURNS[:2])
        await store.complete([("w", sent)])
        body = {"v": 2, **{k: v for k, v in to_plain(sent).items()
                           if k in ("task", "messages", "turns", "sampling", "usage", "final")}}
        body["turns"][0]["completion"] = None  # its assistant message's text, as version 2 kept it
        async with store.db.write() as conn:  # whichever the database
            await conn.execute("UPDATE trajectories SET body=? WHERE id=?",
                               (zlib.compress(json.dumps(body).encode(), 1), job.id))
        got = await store.trajectory(job.id)
        assert got is not None and to_plain(got.turns) == to_plain(sent.turns)
    finally:
        await store.close()


async def test_a_cut_body_is_an_unreadable_stub_not_a_shorter_record(tmp_path: Path) -> None:
    db = tmp_path / "farm.db"
    store = await Store.open(db)
    try:
        await store.enqueue([("py-func", 1, 2, "chat:m", 1)])
        (job,) = await store.lease("w", 1, 30, 0)
        await store.complete([("w", record(job.id, job.group_id, TURNS[:1]))])
        async with store.db.write() as conn:  # whichever the database
            (body,) = await conn.fetchone("SELECT body FROM trajectories WHERE id=?", (job.id,))
            await conn.execute("UPDATE trajectories SET body=? WHERE id=?", (body[:-4], job.id))
        got = await store.trajectory(job.id)
        assert got is not None and (got.id, got.status, got.flags, got.turns) == (job.id, "error", ["unreadable"], [])
        assert "runs past its end" in got.reasons[0]
    finally:
        await store.close()


async def test_a_record_out_of_its_domain_is_not_stored_and_the_others_are(tmp_path: Path) -> None:
    """Every entry checks its records first; the store checks once more, per record, so a record no reader could
    serve is never written (its job stays leased and runs again) and the batch beside it is."""
    store = await Store.open(tmp_path / "farm.db")
    try:
        await store.enqueue([("py-func", 1, 2, "chat:m", 3)])
        jobs = sorted(await store.lease("w", 3, 30, 0), key=lambda j: j.id)
        sent = [record(jobs[0].id, jobs[0].group_id, TURNS),
                record(jobs[1].id, jobs[1].group_id, [Turn(token_ids=[-1, 2 ** 40])]),
                record(jobs[2].id, jobs[2].group_id, [])]
        sent[2].reward = float("nan")
        assert await store.complete([("w", t) for t in sent]) == [jobs[0].id]
        assert await store.trajectory(jobs[1].id) is None and await store.trajectory(jobs[2].id) is None
        assert await store.add_scores([(jobs[0].id, "2", 1.5, True, "ok", [], []),
                                       (jobs[0].id, "3", 1.0, True, "ok", [], [])]) == 1
        kept = await store.trajectory(jobs[0].id)
        # The first verdict (version "1") stays in the history; the one kept in its domain is current.
        assert kept is not None and [s.verifier_version for s in kept.scores] == ["1", "3"]
        assert kept.verifier_version == "3" and kept.verdict_version == kept.scores[-1].verdict_version > 0
    finally:
        await store.close()


async def test_what_was_just_stored_streams_back_as_its_row_reads(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Records just stored are served from memory (``Recent``), not unpacked again: what a stream gets of them is
    exactly what a reader that never saw them stored gets from their rows, and a verdict given since is served."""
    db = tmp_path / "farm.db"
    store = await Store.open(db)
    fresh: Store | None = None
    try:
        await store.enqueue([("py-func", 1, 2, "chat:m", 3)])
        jobs = await store.lease("w", 3, 30, 0)
        sent = [record(jobs[0].id, jobs[0].group_id, TURNS), record(jobs[1].id, jobs[1].group_id, []),
                dataclasses.replace(record(jobs[2].id, jobs[2].group_id, TURNS[1:]), verdict_version=7,
                                    reasons=["a reason"], flags=["flag"], passed=False, reward=0.25)]
        await store.complete([("w", t) for t in sent])
        (group,) = {j.group_id for j in jobs}
        fresh = await Store.open(db)  # holds nothing in memory: reads every row
        unpacked: list[int] = []
        real = codec.read_trajectory
        monkeypatch.setattr(codec, "read_trajectory", lambda row: unpacked.append(row[0]) or real(row))
        for reader in (lambda s: s.group_trajectories([group]), lambda s: s.trajectories(limit=10, streamed=True)):
            served, read = await reader(store), await reader(fresh)
            assert [to_plain(t) for t in served] == [to_plain(t) for t in read]
            assert [t.id for t in served] == [j.id for j in jobs]
        assert sorted(unpacked) == sorted([j.id for j in jobs] * 2)  # the fresh reader's only
        assert await store.add_scores([(jobs[0].id, "2", 0.5, False, "ok", ["judged again"], [])]) == 1
        (later,) = [t for t in await store.group_trajectories([group]) if t.id == jobs[0].id]
        assert (later.reward, later.passed, later.verifier_version) == (0.5, False, "2")
        assert to_plain(later) == to_plain((await fresh.group_trajectories([group]))[0])
    finally:
        await store.close()
        if fresh is not None:
            await fresh.close()


async def test_the_tokens_view_is_the_record_without_what_a_loss_never_reads(tmp_path: Path) -> None:
    """A trainer's stream (``tokens_only``): the turns' token ids and logprobs and the verdict, alike whether the
    record was just stored (kept in memory, which a tokens read must leave whole) or is read from its row."""
    db = tmp_path / "farm.db"
    store = await Store.open(db)
    fresh: Store | None = None
    try:
        await store.enqueue([("py-func", 1, 2, "chat:m", 2)])
        jobs = await store.lease("w", 2, 30, 0)
        await store.complete([("w", record(j.id, j.group_id, TURNS if i == 0 else TURNS[2:]))
                              for i, j in enumerate(jobs)])
        (group,) = {j.group_id for j in jobs}
        whole = await store.group_trajectories([group])
        fresh = await Store.open(db)  # holds nothing in memory: reads every row
        for reader in (store, fresh):
            tokens = await reader.group_trajectories([group], "tokens")
            assert [t.id for t in tokens] == [t.id for t in whole]
            for got, want in zip(tokens, whole, strict=True):
                assert (got.task, got.messages, got.steps, got.final, got.verdict_details, got.scores) == \
                    (PosedTask(), [], [], "", {}, [])
                left = {"task", "messages", "steps", "final", "verdict_details", "scores"}
                assert {k: v for k, v in to_plain(got).items() if k not in left} == \
                    {k: v for k, v in to_plain(want).items() if k not in left}
            listed = await reader.trajectories(limit=10, view="tokens")
            assert [to_plain(t) for t in listed] == [to_plain(t) for t in tokens]
        assert whole[0].turns[0].token_ids == [7, 8, 9] and whole[0].scores
        again = await store.group_trajectories([group])
        assert [to_plain(t) for t in again] == [to_plain(t) for t in whole], "a tokens read leaves the kept whole"
    finally:
        await store.close()
        if fresh is not None:
            await fresh.close()


def test_recent_records_are_bounded_by_count_and_by_body_bytes() -> None:
    recent = Recent(keep=3, body_bytes=1000)
    rows = []
    for i in range(1, 6):
        t = record(i, 1, [])
        rows.append(traj_row(t, b"x" * 100))
        recent.remember([rows[-1]], [t])
    assert recent.kept() == [3, 4, 5]
    recent.remember([traj_row(record(6, 1, []), b"y" * 950)], [record(6, 1, [])])
    assert recent.kept() == [6]


EDGE_FLOATS = [0.1, -2.5e-7, 1e-05, 1e16, 1.7976931348623157e308, 5e-324, -0.0, 123456789.12345679, 1 / 3, -1e-300]


def test_a_checked_body_reads_back_as_the_one_json_writes() -> None:
    """A record whose numbers are in their domain and finite is written by orjson (``finite``), several times
    faster; it reads back as the standard library's body does, float for float and character for character."""
    sent = record(7, 3, TURNS)
    sent.verdict_details = {"floats": EDGE_FLOATS, "ints": [2 ** 63 - 1, -2 ** 63, 0], "text": "é\u2028\U0001f600 \x00\t\"\\",
                            "nested": {"a": [[{"b": None, "c": True}]]}}
    sent.messages[1].content = "quote \", backslash \\, separators \u2028\u2029, and \U0001f600"
    fast, slow = codec.pack_body(sent, finite=True), codec.pack_body(sent)
    assert fast != slow, "two writers"
    got, want = (codec.read_trajectory(traj_row(sent, body)) for body in (fast, slow))
    assert got == want and got.flags == sent.flags
    assert [repr(x) for x in got.verdict_details["floats"]] == [repr(x) for x in EDGE_FLOATS]
    assert to_plain(got.messages) == to_plain(sent.messages) and to_plain(got.turns) == to_plain(sent.turns)
    assert zlib.decompressobj().decompress(fast).startswith(b'{"v":3'), "a zlib stream, as every body was"


def test_what_orjson_would_not_write_exactly_is_written_by_json() -> None:
    """A key that is not text, a lone surrogate, a NaN: orjson refuses the first two (then ``json`` writes the
    record) and would write a NaN as null, so a record whose details hold one (the domain allows it there) is
    written by ``json``, and reads back with its NaN, not a null no one wrote."""
    sent = record(7, 3, TURNS[:1])
    sent.verdict_details = {3: "a key that is not text", "s": "\ud800"}  # type: ignore[dict-item]
    got = codec.read_trajectory(traj_row(sent, codec.pack_body(sent, finite=True)))
    assert got.verdict_details == {"3": "a key that is not text", "s": "\ufffd"}
    sent.verdict_details = {"x": float("nan"), "y": [1.0, float("-inf")]}
    bodies, refused = codec.checked_bodies({7: sent})
    assert not refused, "details may hold them (farmd.domain)"
    got = codec.read_trajectory(traj_row(sent, bodies[7]))
    assert math.isnan(got.verdict_details["x"]) and got.verdict_details["y"] == [1.0, -math.inf], "not nulls"


def test_deflate_writes_what_any_zlib_reads() -> None:
    data = json.dumps({"rows": [[i * 0.001 for i in range(2000)]] * 4}).encode()
    packed = codec.deflate(data)
    assert zlib.decompress(packed) == data and len(packed) <= len(zlib.compress(data, 1)) * 1.1
