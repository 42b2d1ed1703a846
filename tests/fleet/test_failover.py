"""Two coordinators on one PostgreSQL database serve one farm, one at a time. The active one is killed (-9) while a
node works a run and a trainer streams it: the other takes over within 15 s, the node and the trainer move to it
by themselves (each was given both addresses), every rollout is stored exactly once, and nothing a trainer acked
is sent to it again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient

from farmd.verifier.secret import KEY_FILE
from tests.conftest import FARMD, RunningFarm, farmctl
from tests.fleet.conftest import free_port
from tests.pg import bindir

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

ROLLOUTS = 120
"""Each a box on the node's two slots: 19 s for 240 on a quiet machine, over 110 s under a loaded CI's other tests."""


def _count(url: str, sql: str) -> int:
    return int(subprocess.run([str(bindir() / "psql"), url, "-At", "-c", sql], check=True, capture_output=True,
                              text=True, timeout=60).stdout.strip())


def _runfile_pid(data: Path) -> int:
    try:
        return int(json.loads((data / "farmd.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.timeout(360)  # its own deadlines (the run going, the takeover, the rest of the run) say what failed first
def test_a_killed_coordinators_farm_goes_on_under_the_other(postgres: Any, worker_node: Any,  # type: ignore[no-untyped-def]
                                                             tmp_path: Path) -> None:
    url = postgres.new_database()
    port_a, port_b = free_port(), free_port()
    both = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"
    first = RunningFarm(tmp_path / "a", "--store", url, "--workers", "0", listen=f"127.0.0.1:{port_a}")
    # The second coordinator of the same farm, on a data directory of its own with no key in it: the farm's key is
    # the database's, which it takes when it becomes the active one.
    (tmp_path / "b").mkdir(mode=0o700)
    log_b = open(tmp_path / "b.log", "ab")  # noqa: SIM115 (closed below)
    second = subprocess.Popen([FARMD, "serve", "--store", url, "--workers", "0", "--listen", f"127.0.0.1:{port_b}",
                               "--data", str(tmp_path / "b")], stdout=log_b, stderr=subprocess.STDOUT)
    try:
        time.sleep(2)
        assert second.poll() is None and _runfile_pid(tmp_path / "b") == 0, "the second waits: one serves at a time"
        # Listed once it waits on the lock: a loaded machine may take longer than the sleep above to start it.
        deadline = time.monotonic() + 60
        while not (status := json.loads(farmctl("--addr", both, "status", "--json").stdout))["standbys"]:
            assert second.poll() is None and time.monotonic() < deadline, "the standby never began to wait"
            time.sleep(0.2)
        assert status["shared_store"] and [s["address"] for s in status["standbys"]] == [f"127.0.0.1:{port_b}"], \
            "the active one's operators see the standby"
        assert f"standby coordinators: 1 (127.0.0.1:{port_b} waiting " in farmctl("--addr", both, "status").stdout.decode()
        node = worker_node(both, "n1", workers=2)
        run = json.loads(farmctl("--addr", both, "run", "--env", "rg:chain_sum", "--agent", "reference",
                                 "--rollouts", str(ROLLOUTS), "--json").stdout)
        assert run, "queued through the one that answers"

        acked: set[int] = set()
        again: list[int] = []
        errors: list[BaseException] = []

        def trainer() -> None:
            try:
                with FarmClient(both) as client:
                    for batch in client.batches("trainer", batch_size=8, reconnect_s=60):
                        ids = [t.id for t in batch.trajectories]
                        again.extend(i for i in ids if i in acked)
                        client.ack(batch, retry_s=60)
                        acked.update(ids)
                        if len(acked) >= ROLLOUTS:
                            return
            except BaseException as exc:  # reported by the test, not lost with the thread
                errors.append(exc)

        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while _count(url, "SELECT COUNT(*) FROM trajectories") < ROLLOUTS // 6:
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.1)
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        killed_at = time.monotonic()
        before = _count(url, "SELECT COUNT(*) FROM trajectories")
        assert before < ROLLOUTS, "the run ended before the kill: nothing was taken over"
        while _count(url, "SELECT COUNT(*) FROM trajectories") == before:
            assert time.monotonic() - killed_at < 15, "no rollout was stored within 15 s of the kill"
            time.sleep(0.1)
        assert _runfile_pid(tmp_path / "b") == second.pid, "the second coordinator serves now"
        assert (tmp_path / "b" / KEY_FILE).read_bytes() == (tmp_path / "a" / KEY_FILE).read_bytes()

        deadline = time.monotonic() + 180
        while _count(url, "SELECT COUNT(*) FROM trajectories") < ROLLOUTS:
            assert time.monotonic() < deadline, ("the run did not finish under the second coordinator",
                                                 (tmp_path / "b.log").read_text()[-3000:])
            time.sleep(0.2)
        thread.join(120)
        assert not thread.is_alive() and not errors, (len(acked), errors)
        assert _count(url, "SELECT COUNT(*) FROM trajectories") == ROLLOUTS
        assert _count(url, "SELECT COUNT(DISTINCT id) FROM trajectories") == ROLLOUTS
        # Every job of the run done (a node's canary jobs are kept for it, and never stored as trajectories).
        assert _count(url, "SELECT COUNT(*) FROM jobs WHERE state != 'done' AND for_node IS NULL") == 0
        assert len(acked) == ROLLOUTS and not again, f"{len(again)} acked trajectories came again"
        assert node.proc.poll() is None
    finally:
        first.stop()
        if second.poll() is None:
            second.send_signal(signal.SIGTERM)
            try:
                second.wait(30)
            except subprocess.TimeoutExpired:
                second.kill()
                second.wait()
        log_b.close()


@pytest.mark.timeout(120)
def test_a_coordinator_whose_lock_stops_answering_stops_serving(postgres: Any, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Cut off from the server, the active coordinator gives the farm up by itself (within ``ACTIVE_CHECK_*``, before
    the server's keepalive lets a standby take the lock): two active at once would lease from two memories of one
    queue. The server's process for the lock's session is stopped, as a cut network would leave it."""
    from farmd.store.postgres import ACTIVE_CHECK_EVERY_S, ACTIVE_CHECK_TIMEOUT_S, ACTIVE_LOCK

    url = postgres.new_database()
    farm = RunningFarm(tmp_path / "a", "--store", url, "--workers", "0")
    backend = _count(url, "SELECT pid FROM pg_stat_activity WHERE application_name = 'farmd active' "
                          "AND datname = current_database()")
    assert _count(url, "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                       f"AND objid = {ACTIVE_LOCK} AND pid = {backend}") == 1, "the active lock is that session's"
    os.kill(backend, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        deadline = stopped + 60
        while "did not answer within" not in farm.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, farm.log.read_text()[-3000:]
            time.sleep(0.1)
        noticed = time.monotonic() - stopped
        code = farm.proc.wait(60)
    finally:
        os.kill(backend, signal.SIGCONT)
        farm.stop()
    assert noticed >= ACTIVE_CHECK_TIMEOUT_S, "not before its check timed out"
    assert code != 0, "a supervisor starts it again (as a standby now), as after any failure"
    log = farm.log.read_text()
    assert "lost the connection that makes this the active coordinator" in log
    print(f"noticed after {noticed:.1f} s (checks every {ACTIVE_CHECK_EVERY_S:g} s, {ACTIVE_CHECK_TIMEOUT_S:g} s each)")
