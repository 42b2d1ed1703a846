"""A rescore with a newer verifier version reaches every reader, and ``farmctl withdrawn --since`` finds it.

A data dir holds four attempts at chain_sum verified by an older verifier (version "0") that got two of them wrong:
a right answer failed, a wrong one passed. farmd runs on it, an export is made, and ``farmctl rescore`` verifies
them again under the current verifier. From then on the listing, ``show``, every export view and format (from farmd
and from ``--data``), the console's calls, ``farm_client``'s stream and ``FarmDataset``'s tensors, and the pass
rates all read the rescore's verdicts; the first verdicts stay in the score history; and ``farmctl withdrawn``
lists each exported row whose verdict changed since the export, saying which rewards differ.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from farm_client import FarmClient

from farmd.envs import get
from farmd.records import ChatMessage, PosedTask, Trajectory, Turn
from farmd.store import Store
from tests.conftest import farmctl

pytestmark = [pytest.mark.sandbox]

ENV = "rg:chain_sum"
OLD = "0"
VIEWS = [(fmt, view) for fmt in ("jsonl", "parquet") for view in ("record", "flat")]


def attempt(job: Any, final: str, reward: float) -> Trajectory:
    """A model's attempt with its tokens and logprobs, as an older verifier judged it."""
    return Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed, difficulty=job.difficulty,
        agent=job.agent, policy_version=1, reward=reward, passed=reward > 0, status="ok", reasons=["old verifier"],
        flags=[], verifier_version=OLD, final=final, task=PosedTask("submission", "Sum the chain."),
        messages=[ChatMessage("user", "Sum the chain."), ChatMessage("assistant", final)],
        turns=[Turn(message_index=1, prompt_messages=1, completion=final, prompt_token_ids=[1, 2, 3],
                    token_ids=[4, 5], logprobs=[-0.5, -0.25], has_logprobs=True)])


def seed_data(data: Path) -> dict[int, tuple[float, float]]:
    """Two groups of two; by id, (the old verifier's reward, the current verifier's)."""
    env = get(ENV)

    async def write() -> dict[int, tuple[float, float]]:
        store = await Store.open(data / "farm.db")
        try:
            await store.enqueue([(ENV, 3, 1, "openai:m@fake", 2), (ENV, 4, 1, "openai:m@fake", 2)])
            jobs = sorted(await store.lease("seed", 4, 60, lambda _agent: 1), key=lambda j: j.id)
            right = {j.seed: env.reference(env.generate(j.seed, j.difficulty)).final for j in jobs}
            made = {jobs[0].id: (right[3], 0.0, 1.0),   # right, failed by the old verifier
                    jobs[1].id: (right[3], 1.0, 1.0),   # right, and passed
                    jobs[2].id: ("-12345", 1.0, 0.0),   # wrong, passed by the old verifier
                    jobs[3].id: ("-12345", 0.0, 0.0)}   # wrong, and failed
            records = [attempt(j, made[j.id][0], made[j.id][1]) for j in jobs]
            assert await store.complete([("seed", r) for r in records]) == [j.id for j in jobs]
            return {i: (old, new) for i, (_, old, new) in made.items()}
        finally:
            await store.close()

    data.mkdir(parents=True)
    return asyncio.run(write())


def rows_of(path: Path) -> dict[int, dict[str, Any]]:
    rows = pq.read_table(path).to_pylist() if path.suffix == ".parquet" else \
        [json.loads(line) for line in path.read_text().splitlines()]
    return {r["id"]: r for r in rows}


def test_a_rescore_reaches_every_reader_and_withdrawn_since_lists_it(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "farm"
    rewards = seed_data(data)
    old = {i: o for i, (o, _) in rewards.items()}
    new = {i: n for i, (_, n) in rewards.items()}
    moved = sorted(i for i in rewards if old[i] != new[i])
    farm = running_farm("--workers", "1", "--http", "127.0.0.1:0", data_dir=data)
    wide = {**os.environ, "COLUMNS": "300"}

    before = tmp_path / "before.jsonl"
    summary = json.loads(farm.farmctl("export", "--out", str(before), "--json").stdout)
    assert summary["exported"] == 4 and {i: r["reward"] for i, r in rows_of(before).items()} == old

    done = json.loads(farm.farmctl("rescore", "--env", ENV, "--json").stdout)
    assert (done["scored"], done["errors"]) == (4, 0) and done["verifier_version"] != OLD

    listed = json.loads(farm.farmctl("trajectories", "list", "--json").stdout)
    assert {r["id"]: r["reward"] for r in listed} == new
    assert all(r["verifier_version"] == done["verifier_version"] and r["verdict_version"] > 0 for r in listed)
    narrowed = json.loads(farm.farmctl("trajectories", "list", "--min-reward", "0.5", "--json").stdout)
    assert sorted(r["id"] for r in narrowed) == sorted(i for i in new if new[i] == 1.0)

    shown = json.loads(farm.farmctl("trajectories", "show", str(moved[0]), "--json").stdout)
    assert (shown["reward"], shown["verifier_version"]) == (new[moved[0]], done["verifier_version"])
    assert [(s["verifier_version"], s["reward"]) for s in shown["scores"]] == [
        (OLD, old[moved[0]]), (done["verifier_version"], new[moved[0]])], "the first verdict stays in the history"
    human = farm.farmctl("trajectories", "show", str(moved[0]), env=wide).stdout.decode()
    assert f"verifier {done['verifier_version']}" in human and "every verdict it was given" in human

    for fmt, view in VIEWS:
        out = tmp_path / "after" / f"{view}.{fmt}"
        farm.farmctl("export", "--format", fmt, "--view", view, "--out", str(out))
        rows = rows_of(out)
        assert {i: r["reward"] for i, r in rows.items()} == new, (fmt, view)
        assert {i: r["passed"] for i, r in rows.items()} == {i: n > 0 for i, n in new.items()}, (fmt, view)

    report = json.loads(farm.farmctl("withdrawn", "--since", f"{before}.manifest.json", "--json").stdout)
    assert (report["exported"], report["withdrawn"], report["rescored"], report["changed"]) == (4, 0, 4, 2)
    entries = {e["id"]: e for e in report["trajectories"]}
    assert sorted(i for i, e in entries.items() if e["changed"]) == moved
    for i, e in entries.items():
        assert (e["was"]["reward"], e["was"]["verifier_version"]) == (old[i], OLD)
        assert (e["now"]["reward"], e["now"]["verifier_version"]) == (new[i], done["verifier_version"])
        assert not e["withdrawn"]
    human = farm.farmctl("withdrawn", "--since", f"{before}.manifest.json", env=wide).stdout.decode()
    assert "0 were withdrawn and 4 rescored" in human

    console = json.loads((farm.data_dir / "farmd.json").read_text())["console"]
    page = httpx.post(f"http://{console}/api/v1/FarmService/ListTrajectories", json={"page_size": 10}).json()
    assert {int(t["id"]): t["reward"] for t in page["trajectories"]} == new
    one = httpx.post(f"http://{console}/api/v1/FarmService/GetTrajectory", json={"id": str(moved[0])}).json()
    assert one["trajectory"]["reward"] == new[moved[0]] and len(one["trajectory"]["scores"]) == 2
    rates = httpx.post(f"http://{console}/api/v1/FarmService/GetStatus", json={}).json()["pass_rates"]
    assert [(r["env"], int(r["trajectories"]), int(r["passed"])) for r in rates] == [(ENV, 4, 2)]

    torch = pytest.importorskip("torch")
    from farm_client.tensors import FarmDataset

    with FarmClient(farm.addr) as client:
        batch = next(iter(client.batches("raw", 4, whole_groups=True)))
        assert {t.id: t.reward for t in batch.trajectories} == new
        tensors = next(iter(FarmDataset(client, "tensors", batch_size=4)))
        got = dict(zip(tensors.trajectory_ids.tolist(), tensors.rewards.tolist(), strict=True))
        assert got == new, "a trainer's tensors hold the rescore's rewards"
        # Group-relative advantages of the current rewards: under the old verdicts each group split one pass and
        # one fail (advantages of about 1); the rescore finds each group's two attempts alike.
        assert torch.equal(tensors.advantages, torch.zeros(4))
        changes = list(client.verdict_changes(summary["verdict_mark"]))
        assert sorted(c.trajectory_id for c in changes) == sorted(rewards)

    assert farm.stop() == 0
    served = tmp_path / "after" / "record.jsonl"
    direct = tmp_path / "direct.jsonl"
    farmctl("export", "--out", str(direct), "--data", str(data))
    assert direct.read_text() == served.read_text(), "the data dir holds what farmd served"
    offline = json.loads(farmctl("withdrawn", "--since", f"{before}.manifest.json", "--data", str(data),
                                 "--json").stdout)
    assert offline == report


def test_withdrawn_refuses_what_is_not_a_manifest(tmp_path: Path) -> None:
    data = tmp_path / "farm"
    seed_data(data)
    for name, text in (("empty.json", ""), ("list.json", "[]"), ("other.json", '{"farm_export_manifest": 9}'),
                       ("rows.json", '{"farm_export_manifest": 1, "verdict_mark": 0, "trajectories": [[1]]}'),
                       ("mark.json", '{"farm_export_manifest": 1, "verdict_mark": -1, "trajectories": []}')):
        path = tmp_path / name
        path.write_text(text)
        refused = farmctl("withdrawn", "--since", str(path), "--data", str(data), "--json", check=False)
        assert refused.returncode != 0, name
        error = json.loads(refused.stdout)["error"]
        assert error["code"] == "USAGE_ERROR" and "not an export's manifest" in error["message"], (name, error)
    missing = farmctl("withdrawn", "--since", str(tmp_path / "nowhere.json"), "--data", str(data), check=False)
    assert missing.returncode != 0 and b"not an export's manifest" in missing.stderr
    # A manifest of nothing changed since: an empty answer, not an error.
    fresh = tmp_path / "fresh.jsonl"
    farmctl("export", "--out", str(fresh), "--data", str(data))
    assert json.loads(farmctl("withdrawn", "--since", f"{fresh}.manifest.json", "--data", str(data),
                              "--json").stdout)["trajectories"] == []
