"""No stored record can jam a reader. Rows are written straight into a real SQLite store, as an attacker who got
past an older validator (or a hand with the database file) would leave them: a body that does not decode, a
number past int64 in a column or a body, JSON nested too deep, a negative token id, NaN. Then a real farmd
serves that store over gRPC: every listing, lookup, stream (whole groups too), rescore and ``farmctl export``
(both views, both formats, from farmd and from ``--data``) goes past each one, serving it as a stub flagged
``unreadable`` (an error verdict: no score), and logs it; the records beside them come whole."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from farm_client import FarmClient
from farm_client.tensors import collate

from farmd.records import PosedTask, Trajectory, Turn
from farmd.store import Store
from farmd.store.codec import pack_body
from tests.conftest import farmctl

GOOD_GROUPS = (0, 11)
"""Groups whose both members stay as stored; every other group's second member is made bad."""


def honest(job: Any, reward: float) -> Trajectory:
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=0, reward=reward, passed=reward > 0,
                      status="ok", reasons=["judged"], flags=[], verifier_version="1", final="3",
                      task=PosedTask(prompt="1+2=", metadata={"level": 1}),
                      turns=[Turn(message_index=1, prompt_messages=1, completion="3", prompt_token_ids=[1, 2, 3],
                                  token_ids=[4, 5], logprobs=[-0.5, -0.25], has_logprobs=True)],
                      finished_at=1_700_000_000.0)


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def body_with(t: Trajectory, **changes: Any) -> bytes:
    return pack_body(replace(t, **changes))


def turn_with(**changes: Any) -> list[Turn]:
    return [replace(Turn(message_index=1, prompt_messages=1, completion="3", prompt_token_ids=[1, 2, 3],
                         token_ids=[4, 5], logprobs=[-0.5, -0.25], has_logprobs=True), **changes)]


# (what the bad row holds, an UPDATE of its row); ``t`` is the honest record the row held.
BAD: list[tuple[str, Any]] = [
    ("a negative token id", lambda t: ("body=?", body_with(t, turns=turn_with(token_ids=[-1, 5])))),
    ("a token id past uint32", lambda t: ("body=?", body_with(t, turns=turn_with(token_ids=[1 << 40, 5])))),
    ("JSON nested 150 deep", lambda t: ("body=?", body_with(t, verdict_details=deep(150)))),
    ("a number past int64 in the body", lambda t: ("body=?", body_with(
        t, task=PosedTask(prompt="1+2=", metadata={"n": 10 ** 400})))),
    ("a NaN logprob", lambda t: ("body=?", body_with(t, turns=turn_with(logprobs=[math.nan, -0.25])))),
    ("a body that does not decode", lambda t: ("body=?", b"\x78\x9cnot a body")),
    ("a NaN reward, as text (SQLite will not hold a NaN as a number)", lambda t: ("reward='NaN'", None)),
    ("an infinite reward", lambda t: ("reward=1e999", None)),
    ("a seed past int64 in its column", lambda t: ("seed=18446744073709551616", None)),
    ("JSON nested 5000 deep", lambda t: ("body=?", zlib.compress(
        b'{"v":3,"verdict_details":' + b"[" * 5000 + b"]" * 5000 + b"}"))),
]


def seed(data: Path) -> tuple[dict[int, Trajectory], dict[int, str]]:
    """Twelve groups of two, stored as a farm stores them; then one member of each of ten groups made bad by
    hand. Returns the honest records by id and what each bad row holds, by id."""

    async def write() -> dict[int, Trajectory]:
        store = await Store.open(data / "farm.db")
        try:
            await store.enqueue([("arith", s, 1, "torch:tiny", 2) for s in range(12)])
            jobs = sorted(await store.lease("seed", 100, 60, 0), key=lambda j: j.id)
            records = [honest(job, float(i % 2)) for i, job in enumerate(jobs)]
            assert await store.complete([("seed", r) for r in records]) == [j.id for j in jobs]
            return {r.id: r for r in records}
        finally:
            await store.close()

    data.mkdir(parents=True, exist_ok=True)
    records = asyncio.run(write())
    groups = sorted({t.group_id for t in records.values()})
    bad: dict[int, str] = {}
    with sqlite3.connect(data / "farm.db") as db:
        victims = [max(t.id for t in records.values() if t.group_id == g)
                   for i, g in enumerate(groups) if i not in GOOD_GROUPS]
        for victim, (what, change) in zip(victims, BAD, strict=True):
            assignment, value = change(records[victim])
            db.execute(f"UPDATE trajectories SET {assignment} WHERE id=?", (*(() if value is None else (value,)), victim))
            bad[victim] = what
    return records, bad


def assert_served(got: list[Trajectory] | list[Any], records: dict[int, Trajectory], bad: dict[int, str],
                  *, summaries: bool = False) -> None:
    """Every stored id, in order; each bad row a stub that says so, each other record as stored."""
    assert [t.id for t in got] == sorted(records)
    for t in got:
        if t.id in bad and (not summaries or "reward" in bad[t.id] or "column" in bad[t.id]):
            assert (t.status, t.flags, t.reward, t.passed, t.turns) == ("error", ["unreadable"], 0.0, False, []), \
                bad[t.id]
            assert t.reasons[0].startswith("this stored record cannot be read"), t.reasons
            assert (t.group_id, t.env) == (records[t.id].group_id, "arith"), "its place and names are kept"
        elif t.id not in bad:
            want = records[t.id]
            assert (t.status, t.reward, t.flags, t.seed) == (want.status, want.reward, want.flags, want.seed)
            if not summaries:
                assert t.turns[0].token_ids == [4, 5] and t.turns[0].logprobs == [-0.5, -0.25]


@pytest.mark.slow
def test_every_reader_goes_past_a_bad_stored_record(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "farm"
    records, bad = seed(data)
    farm = running_farm("--workers", "0", "--http", "127.0.0.1:0", data_dir=data)
    with FarmClient(farm.addr) as client:
        assert_served(client.trajectories(limit=100, full=True), records, bad)
        (rates,) = client.status()["pass_rates"]
        assert rates["trajectories"] == len(records) and 0 <= rates["mean_reward"] <= 1, rates
        assert_served(client.trajectories(limit=100), records, bad, summaries=True)
        assert_served([client.trajectory(tid) for tid in sorted(records)], records, bad)
        pages = [t for page in client.trajectory_pages(page_size=5, full=True) for t in page]
        assert_served(pages, records, bad)

        (plain,) = [b for _, b in zip(range(1), client.batches("plain", batch_size=100), strict=False)]
        assert_served(sorted(plain.trajectories, key=lambda t: t.id), records, bad)
        # Whole groups: every group comes, the bad members as error verdicts, which no advantage counts.
        (groups,) = [b for _, b in zip(range(1), client.batches("groups", batch_size=100, whole_groups=True),
                                       strict=False)]
        assert_served(sorted(groups.trajectories, key=lambda t: t.id), records, bad)
        tensors = collate(groups.trajectories, skip_untokenized=True)
        assert len(tensors) == len(records) - len(bad)
        assert bool(tensors.advantages.isfinite().all()) and bool(tensors.logprobs.isfinite().all())
        assert set(tensors.skipped) == set(bad)

    # The console's calls go through the same servicers, as JSON.
    console = json.loads((data / "farmd.json").read_text())["console"]
    for method, body in (("ListTrajectories", {"full": True, "page_size": 100}), ("GetTrajectory", {"id": min(bad)}),
                         ("GetStatus", {}), ("GetHistory", {}), ("GetLearningCurve", {})):
        reply = httpx.post(f"http://{console}/api/v1/FarmService/{method}", json=body)
        assert reply.status_code == 200, (method, reply.text[:500])
    listed = httpx.post(f"http://{console}/api/v1/FarmService/ListTrajectories", json={"full": True}).json()
    assert sum(t.get("flags") == ["FLAG_UNREADABLE"] for t in listed["trajectories"]) == len(bad)
    for command in (("status",), ("trajectories", "list"), ("trajectories", "show", str(min(bad)))):
        assert farm.farmctl(*command).returncode == 0

    served = {}
    for fmt in ("jsonl", "parquet"):
        for view in ("record", "flat"):
            out = tmp_path / f"served-{view}.{fmt}"
            summary = json.loads(farm.farmctl("export", "--format", fmt, "--view", view, "--out", str(out),
                                              "--json").stdout)
            assert summary["exported"] == len(records), summary
            served[(fmt, view)] = out
    rows = [json.loads(line) for line in served[("jsonl", "record")].read_text().splitlines()]
    assert {r["id"] for r in rows if r["flags"] == ["unreadable"]} == set(bad)
    flat = [json.loads(line) for line in served[("jsonl", "flat")].read_text().splitlines()]
    assert all(r["reward"] is None for r in flat if r["id"] in bad), "an unreadable record is no score"
    assert pq.read_table(served[("parquet", "record")]).num_rows == len(records)
    assert farm.stop() == 0
    assert "cannot be read" in farm.log.read_text()

    for fmt in ("jsonl", "parquet"):
        for view in ("record", "flat"):
            out = tmp_path / f"direct-{view}.{fmt}"
            done = farmctl("export", "--format", fmt, "--view", view, "--out", str(out), "--data", str(data), "--json")
            assert json.loads(done.stdout)["exported"] == len(records)
            if fmt == "jsonl":
                assert out.read_text() == served[(fmt, view)].read_text(), "the data dir holds what farmd serves"
            else:
                assert pq.read_table(out).equals(pq.read_table(served[(fmt, view)]))


@pytest.mark.sandbox  # a worker: a host that cannot isolate starts none
def test_a_rescore_passes_over_a_bad_stored_record_and_scores_the_rest(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "farm"
    records, bad = seed(data)
    farm = running_farm(data_dir=data)  # a worker: rescoring verifies on it
    done = json.loads(farm.farmctl("rescore", "--env", "arith", "--json").stdout)
    assert (done["scored"], done["errors"]) == (len(records) - len(bad), len(bad)), done
    with FarmClient(farm.addr) as client:
        for tid in sorted(records):
            assert bool(client.trajectory(tid).scores) == (tid not in bad), tid
