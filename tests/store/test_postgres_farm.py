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

    # Read from the database itself, as --data reads a SQLite farm: the same rows farmd exports, and a manifest
    # that withdrawn --store reads against the same database.
    out = tmp_path / "pg.jsonl"
    via_store = json.loads(farm.farmctl("export", "--store", url, "--out", str(out), "--json").stdout)
    assert via_store["exported"] == 6
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == sorted(seen)
    via_farmd = tmp_path / "farmd.jsonl"
    farm.farmctl("export", "--out", str(via_farmd))
    assert sorted(out.read_text().splitlines()) == sorted(via_farmd.read_text().splitlines())
    changed = json.loads(farm.farmctl("withdrawn", "--since", f"{out}.manifest.json", "--store", url,
                                      "--json").stdout)
    assert changed["exported"] == 6 and changed["withdrawn"] == 0

    # The same farm again on the same database: what was acked is not sent again; a new run's rollouts are.
    assert farm.stop() == 0
    again = running_farm("--store", url, "--workers", "2", data_dir=farm.data_dir)
    json.loads(again.farmctl("run", "--env", "rg:chain_sum", "--agent", "reference", "--rollouts", "2",
                             "--wait", "--json").stdout)
    with FarmClient(again.addr) as client:
        batch = next(iter(client.batches("pg-trainer", batch_size=8)))
        assert {t.id for t in batch.trajectories}.isdisjoint(seen) and len(batch.trajectories) == 2


def test_an_atropos_queue_on_postgresql_survives_a_restart(postgres, store_backend: str,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    """Atropos's rows (registration, groups pushed and cut into batches, the step) on the server: a farmd started
    again on the same database answers as the one before did, and serves the batch it had cut."""
    if store_backend != "postgresql":
        pytest.skip("tests/atropos/test_restart.py is this on SQLite")
    import httpx

    from tests.atropos.test_restart import fill, free_port, started, stopped
    from tests.conftest import FARMD

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [FARMD, "serve", "--store", postgres.new_database(), "--listen", "127.0.0.1:0", "--workers", "0",
           "--data", str(tmp_path / "farm"), "--atropos", f"127.0.0.1:{port}"]
    proc = started(cmd, url)
    before = fill(url)
    stopped(proc)
    proc = started(cmd, url)
    try:
        after = {path: httpx.get(url + path).json() for path in ("/status", "/info")}
        batch = httpx.get(url + "/batch").json()
    finally:
        stopped(proc)
    assert before["/status"] == {"current_step": 3, "queue_size": 0}
    assert after["/status"] == before["/status"] and after["/info"] == before["/info"]
    assert [g["tokens"][0][0] for g in batch["batch"]] == [200], "the next batch it had cut"


def test_the_farms_verifier_key_is_its_databases(running_farm, postgres, store_backend: str,  # type: ignore[no-untyped-def]
                                                 tmp_path: Path) -> None:
    """Every coordinator of a farm on PostgreSQL derives hidden inputs with one key, the database's: a data directory
    without one is given it, and one holding another key is refused before it serves (its hidden tests would not be
    the farm's, and nodes it welcomed would verify with the wrong key)."""
    if store_backend != "postgresql":
        pytest.skip("a SQLite farm's key is its data directory's")
    from farmd.verifier.secret import KEY_FILE
    from tests.conftest import FARMD

    url = postgres.new_database()
    farm = running_farm("--store", url, "--workers", "0")
    key = (farm.data_dir / KEY_FILE).read_bytes()
    assert farm.stop() == 0
    assert _psql(postgres, url, "SELECT value FROM state WHERE key = 'verifier_key'") == f'"{key.hex()}"'

    again = running_farm("--store", url, "--workers", "0", data_dir=tmp_path / "fresh")
    assert (again.data_dir / KEY_FILE).read_bytes() == key
    assert again.stop() == 0

    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / KEY_FILE).write_bytes(b"another farm's key, 32 bytes...")
    refused = subprocess.run([FARMD, "serve", "--store", url, "--listen", "127.0.0.1:0", "--workers", "0",
                              "--data", str(other)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "is not this farm's verifier key" in refused.stderr, refused.stderr[-2000:]
