"""A real ``farmd serve --store postgresql://...``: a run is queued, rolled out by the farm's own workers and stored
on the PostgreSQL server, and a trainer's stream takes every trajectory once, acks, and after a restart of the
farm on the same database is sent nothing it acked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


def _psql(postgres: Any, url: str, sql: str) -> str:
    from tests.pg import bindir

    return subprocess.run([str(bindir() / "psql"), url, "-At", "-c", sql], check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def test_a_farm_on_postgresql_runs_a_run_and_feeds_a_trainer(running_farm, postgres, store_backend: str,  # type: ignore[no-untyped-def]
                                                          tmp_path: Path) -> None:
    if store_backend != "postgresql":
        pytest.skip("the SQLite farm is every other end-to-end test")
    url = postgres.new_database()
    farm = running_farm("--store", url, "--workers", "2")
    done = json.loads(farm.farmctl("run", "--env", "rg:chain_sum", "--agent", "reference", "--rollouts", "6",
                                   "--wait", "--json").stdout)
    assert done["done"] == 6
    # Stored on the server, not in a file under the data directory.
    assert _psql(postgres, url, "SELECT COUNT(*) FROM trajectories") == "6"
    assert not (farm.data_dir / "farm.db").exists()

    seen: list[int] = []
    with FarmClient(farm.addr) as client:
        for batch in client.batches("pg-trainer", batch_size=3):
            seen += [t.id for t in batch.trajectories]
            client.ack(batch)
            if len(seen) >= 6:
                break
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 6
    assert _psql(postgres, url, "SELECT acked_seq FROM consumers WHERE name = 'pg-trainer'") == "6"

    # The same farm again on the same database: what was acked is not sent again; a new run's rollouts are.
    assert farm.stop() == 0
    again = running_farm("--store", url, "--workers", "2", data_dir=farm.data_dir)
    json.loads(again.farmctl("run", "--env", "rg:chain_sum", "--agent", "reference", "--rollouts", "2",
                             "--wait", "--json").stdout)
    with FarmClient(again.addr) as client:
        batch = next(iter(client.batches("pg-trainer", batch_size=8)))
        assert {t.id for t in batch.trajectories}.isdisjoint(seen) and len(batch.trajectories) == 2
