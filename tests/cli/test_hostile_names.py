"""A real farmd holding names and records chosen by clients and attempts: farmctl shows them escaped.

A consumer named ``[/farm]...`` once made every later ``farmctl status`` crash; an agent spec,
a flag or a node name with terminal escapes reached the operator's terminal raw.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from farm_client import FarmClient

from farmd.records import Step, Trajectory
from farmd.store import Store
from tests.cli.hostile import HOSTILE, SHOWN, assert_shown_safely

WIDE = {**os.environ, "COLUMNS": "1000"}  # no table wraps a cell, so the escaped text is found whole


async def _store_a_hostile_trajectory(data_dir: Path) -> None:
    """What an older farm, another writer, or a hole elsewhere could have left in the store."""
    store = await Store.open(data_dir / "farm.db")
    try:
        (group,) = await store.enqueue([("py-func", 1, 1, HOSTILE, 1)])
        (job,) = await store.lease("seed", 1, 30, lambda _agent: 0)
        await store.complete([("seed", Trajectory(
            id=job.id, group_id=group, env="py-func", env_version="1", seed=1, difficulty=1, agent=HOSTILE,
            policy_version=0, reward=0.0, passed=False, status="ok", reasons=[HOSTILE], flags=[HOSTILE],
            verifier_version="1", steps=[Step(action=HOSTILE, observation=HOSTILE)], final=HOSTILE,
            node=HOSTILE))])
    finally:
        await store.close()


def test_status_and_trajectories_show_hostile_names_escaped(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "farm-data"
    data.mkdir()
    asyncio.run(_store_a_hostile_trajectory(data))
    farm = running_farm("--workers", "0", data_dir=data)
    with FarmClient(farm.addr) as client:  # a trainer under a hostile name reads the one trajectory
        batch = next(iter(client.batches(HOSTILE, batch_size=8)))
        assert [t.agent for t in batch.trajectories] == [HOSTILE]
        assert client.ack(batch) == 1

    status = farm.farmctl("status", env=WIDE)  # exits 0: a name is never read as markup
    assert_shown_safely(status.stdout)
    assert "consumers (the stream is at 1)" in status.stdout.decode()
    consumers = json.loads(farm.farmctl("status", "--json").stdout)["consumers"]
    assert [c["name"] for c in consumers] == [HOSTILE], "--json stays exact"

    listed = farm.farmctl("trajectories", "list", env=WIDE)
    assert_shown_safely(listed.stdout)
    # Flags are a closed set on the wire: one that is not in it never leaves the store.
    assert listed.stdout.decode().count(SHOWN) == 2  # agent, node
    (row,) = json.loads(farm.farmctl("trajectories", "list", "--json").stdout)
    assert (row["agent"], row["flags"], row["node"]) == (HOSTILE, [], HOSTILE), "--json stays exact"
    shown = json.loads(farm.farmctl("trajectories", "show", "--json", str(row["id"])).stdout)
    assert shown["final"] == HOSTILE and shown["reasons"] == [HOSTILE]
