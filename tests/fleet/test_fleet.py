"""A fleet on one machine, all real processes: a coordinator that runs no rollouts (``--workers 0``) and
worker nodes that joined it, one of them in a network namespace of its own, reaching the coordinator
through a veth pair by a non-loopback address. Nodes die (kill -9), hang (SIGSTOP past their lease) and
the coordinator restarts; every requested rollout lands exactly once."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient

from tests.fleet.conftest import free_port
from tests.fleet.netns import netns_unavailable, veth_netns

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

FLEET_TOML = """
[scheduler]
lease_s = {lease_s}
node_lost_s = {lost_s}
retry_backoff_s = 0.1
max_attempts = 5
reverify_tolerance = {tolerance}
"""


def coordinator_toml(tmp_path: Path, lease_s: float = 6.0, lost_s: float = 4.0, tolerance: float = 0.25) -> str:
    path = tmp_path / "coordinator.toml"
    path.write_text(FLEET_TOML.format(lease_s=lease_s, lost_s=lost_s, tolerance=tolerance))
    return str(path)


def wait_for(predicate: Any, timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def finished(client: FarmClient, run_id: int) -> dict[str, Any] | None:
    run = client.get_run(run_id)
    return run if run["state"] != "running" else None


def landed(client: FarmClient, env: str) -> Counter[int]:
    """How many times each trajectory id is stored (every one must be once)."""
    return Counter(t.id for page in client.trajectory_pages(env) for t in page)


def nodes_of(client: FarmClient) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in client.status()["nodes"]}


def test_rollouts_spread_over_two_nodes_one_behind_a_veth_pair(tmp_path: Path, running_farm, worker_node  # type: ignore[no-untyped-def]
                                                               ) -> None:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    with veth_netns() as ns:
        farm = running_farm("--workers", "0", "--config", coordinator_toml(tmp_path), listen=f"{ns.host_ip}:0")
        assert farm.addr.startswith(ns.host_ip)
        far = worker_node(farm.addr, "far", workers=2, wrap=ns.wrap)
        near = worker_node(farm.addr, "near", workers=2)
        with FarmClient(farm.addr) as client:
            run = client.run("py-func", "reference", 32, group_size=4)
            done = wait_for(lambda: finished(client, run["id"]), 120, "the run")
            assert (done["state"], done["done"], done["passed"]) == ("succeeded", 32, 32)
            stored = landed(client, "py-func")
            assert len(stored) == 32 and set(stored.values()) == {1}
            by_node = Counter(t.node for page in client.trajectory_pages("py-func") for t in page)
            assert set(by_node) == {"far", "near"}, f"rollouts ran on {dict(by_node)}"
            nodes = nodes_of(client)
            assert {n: (nodes[n]["state"], nodes[n]["capacity"], nodes[n]["isolation_ok"]) for n in nodes} == {
                "far": ("connected", 2, True), "near": ("connected", 2, True)}
            assert nodes["far"]["address"].startswith(f"ipv4:{ns.ns_ip}:"), "the far node came through the veth"
            assert nodes["far"]["done"] + nodes["near"]["done"] == 32
            assert nodes["far"]["facts"]["cores"] == str(os.cpu_count())
        shown = farm.farmctl("status").stdout.decode()
        assert "nodes" in shown and "far" in shown and "near" in shown
        for node in (far, near):
            assert node.stop() == 0
            assert not list((node.data_dir / "outbox").iterdir()), "a node that stops has reported everything"


def test_a_node_killed_mid_run_loses_nothing_and_nothing_lands_twice(tmp_path: Path, running_farm, worker_node  # type: ignore[no-untyped-def]
                                                                     ) -> None:
    farm = running_farm("--workers", "0", "--config", coordinator_toml(tmp_path, lease_s=20, lost_s=3))
    doomed = worker_node(farm.addr, "doomed", workers=2)
    worker_node(farm.addr, "steady", workers=2)
    with FarmClient(farm.addr) as client:
        run = client.run("py-func", "reference", 40, group_size=4)
        wait_for(lambda: nodes_of(client)["doomed"]["in_flight"] and nodes_of(client)["doomed"]["done"], 60,
                 "the doomed node to be busy")
        doomed.stop(sig=signal.SIGKILL)
        # Lost after 3 s of silence, far inside its 20 s leases: its rollouts are requeued at once.
        lost = wait_for(lambda: nodes_of(client)["doomed"]["state"] == "lost", 30, "the node to be marked lost")
        assert lost
        done = wait_for(lambda: finished(client, run["id"]), 120, "the run")
        assert (done["done"], done["failed"]) == (40, 0)
        stored = landed(client, "py-func")
        assert len(stored) == 40 and set(stored.values()) == {1}


def test_a_node_stopped_past_its_lease_comes_back_and_nothing_is_stored_twice(tmp_path: Path, running_farm,  # type: ignore[no-untyped-def]
                                                                              worker_node) -> None:
    farm = running_farm("--workers", "0", "--config", coordinator_toml(tmp_path, lease_s=3, lost_s=30))
    frozen = worker_node(farm.addr, "frozen", workers=2)
    worker_node(farm.addr, "steady", workers=2)
    with FarmClient(farm.addr) as client:
        run = client.run("py-func", "reference", 40, group_size=4)
        wait_for(lambda: nodes_of(client)["frozen"]["in_flight"] == 2, 60, "the node to hold two rollouts")
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            done = wait_for(lambda: finished(client, run["id"]), 120, "the others to finish its jobs")
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        assert (done["done"], done["failed"]) == (40, 0)
        # Back, it reports what it finished while stopped: leases that went elsewhere, so none is stored.
        wait_for(lambda: not list((frozen.data_dir / "outbox").iterdir()), 30, "its results to be dealt with")
        wait_for(lambda: nodes_of(client)["frozen"]["state"] == "connected", 30, "it to be back")
        stored = landed(client, "py-func")
        assert len(stored) == 40 and set(stored.values()) == {1}
        assert client.status()["queue"]["done"] == 40


def test_results_finished_while_the_coordinator_was_down_arrive_after_it_restarts(tmp_path: Path, running_farm,  # type: ignore[no-untyped-def]
                                                                                  worker_node) -> None:
    listen = f"127.0.0.1:{free_port()}"
    # Kernels, for rollouts long enough to be in flight; the coordinator rechecks a node's first results, and a
    # kernel's speed reward, timed again on a loaded machine, once differed by more than the default tolerance
    # (1 against 0.5): this test is about results that wait out a restart, so only a pass or fail must agree.
    toml = coordinator_toml(tmp_path, lease_s=5, lost_s=30, tolerance=0.99)
    farm = running_farm("--workers", "0", "--config", toml, listen=listen)
    node = worker_node(farm.addr, "patient", workers=2)
    outbox = node.data_dir / "outbox"
    with FarmClient(farm.addr) as client:
        run = client.run("kernel", "reference", 24, group_size=4)  # a rollout of many milliseconds: some are in flight
        # Killed while the node runs two (not between a report and its next lease: then nothing is in flight).
        wait_for(lambda: (lambda n: n["done"] >= 2 and n["in_flight"] == 2)(nodes_of(client)["patient"]), 60,
                 "some rollouts to land and two more to run", every_s=0.02)
    farm.stop(sig=signal.SIGKILL)
    held = wait_for(lambda: len(list(outbox.iterdir())), 30, "the rollouts in flight to finish into the outbox")
    time.sleep(5)  # past a lease: the restarted coordinator must still take what was finished meanwhile
    lost = _lease_never_received(farm.data_dir / "farm.db", "patient", run["group_ids"])
    farm = running_farm("--workers", "0", "--config", toml, data_dir=farm.data_dir, listen=listen)
    with FarmClient(farm.addr) as client:
        try:  # within the test's own timeout, so that what both sides say is in the failure
            done = wait_for(lambda: finished(client, run["id"]), 80, "the run")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {client.get_run(run['id'])}\n--- the node's log:\n{node.text()[-6000:]}\n"
                                 f"--- the coordinator's log:\n{farm.log.read_text()[-6000:]}") from None
        assert (done["done"], done["failed"]) == (24, 0)
        stored = landed(client, "kernel")
        assert len(stored) == 24 and set(stored.values()) == {1}
    resent = re.search(r"resent (\d+) buffered results", node.text())
    assert resent and int(resent.group(1)) >= held, "what it held while the coordinator was down arrived"
    taken = re.search(r"node patient joined again: (\d+) rollouts leased to it in replies it never received",
                      farm.log.read_text())
    assert taken and int(taken.group(1)) >= 1, f"job {lost}'s lease went back when the node said what it holds"
    # Emptied of what it held; a canary the coordinator sends the node afterwards passes through it on its way.
    wait_for(lambda: not list(outbox.iterdir()), 30, "the outbox to empty")
    assert node.proc.poll() is None, "a coordinator restart is not the node's end"


def _lease_never_received(db: Path, node: str, groups: list[int]) -> int:
    """Written into a dead coordinator's SQLite file: one more of the run's queued jobs leased to ``node``'s running
    incarnation, for ten minutes, as when the coordinator commits a lease and dies before its reply leaves. Without
    the node saying what it holds when it joins again, the run would wait those ten minutes for it."""
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        (owner,) = con.execute("SELECT lease_owner FROM jobs WHERE state='leased' AND lease_owner LIKE ? LIMIT 1",
                               (f"{node}:%",)).fetchone()
        (job,) = con.execute(f"SELECT MAX(id) FROM jobs WHERE state='queued' AND group_id IN ({','.join('?' * len(groups))})",
                             groups).fetchone()
        con.execute("UPDATE jobs SET state='leased', lease_owner=?, lease_expires=?, attempts=attempts+1 WHERE id=?",
                    (owner, time.time() + 600, job))
        return int(job)
    finally:
        con.close()


def test_a_node_runs_the_exact_policy_version_it_was_leased_with_fetched_by_hash(tmp_path: Path, running_farm,  # type: ignore[no-untyped-def]
                                                                                 worker_node) -> None:
    from farm_client import tinylm

    farm = running_farm("--workers", "0", "--config", coordinator_toml(tmp_path))
    node = worker_node(farm.addr, "gpu-less", workers=2)
    with FarmClient(farm.addr) as client:
        first = client.publish_policy(tinylm.save(tinylm.TinyLM(tinylm.LMConfig()).eval()), name="tiny")
        run = client.run("arith", "torch:tiny?max_tokens=4", 8, group_size=4)
        assert wait_for(lambda: finished(client, run["id"]), 120, "the first run")["done"] == 8
        second = client.publish_policy(tinylm.save(tinylm.TinyLM(tinylm.LMConfig()).eval()), name="tiny")
        run = client.run("arith", "torch:tiny?max_tokens=4", 8, group_size=4)
        assert wait_for(lambda: finished(client, run["id"]), 120, "the second run")["done"] == 8
        versions = Counter(t.policy_version for page in client.trajectory_pages("arith") for t in page)
        assert versions == {first["version"]: 8, second["version"]: 8}
        held = wait_for(lambda: nodes_of(client)["gpu-less"]["policy_versions"], 30, "a heartbeat naming them")
        assert set(held) <= {first["version"], second["version"]}
    cached = sorted(p.name for p in (node.data_dir / "policies").iterdir())
    assert cached == sorted({first["sha256"], second["sha256"]}), "each version fetched once, kept by its hash"
