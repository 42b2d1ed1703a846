"""farmd serve: a real daemon on a real socket, reached by farmctl, grpc health and reflection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.conftest import FARMD, RunningFarm

pytestmark = pytest.mark.sandbox


def test_status_health_and_reflection(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "1")
    status = json.loads(farm.farmctl("status", "--json").stdout)
    assert status["isolation_ok"] is True and status["workers"] == 1
    assert {c["name"] for c in status["isolation"]} >= {"bwrap", "seccomp", "cgroups", "user namespaces"}

    with grpc.insecure_channel(farm.addr) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "farm.v1.FarmService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in replies[0].list_services_response.service}
        assert {"farm.v1.FarmService", "grpc.health.v1.Health"} <= names

    human = farm.farmctl("status").stdout.decode()
    assert "isolation: yes" in human


def test_token_is_required_when_set(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--token", "s3cret")
    denied = farm.farmctl("status", "--json", check=False)
    error = json.loads(denied.stdout)["error"]  # with --json a failure is JSON too
    assert denied.returncode != 0 and error["code"] == "UNAUTHENTICATED" and "token" in error["message"]
    wrong = farm.farmctl("--token", "nope", "status", check=False)
    assert wrong.returncode != 0 and b"UNAUTHENTICATED" in wrong.stderr
    ok = farm.farmctl("--token", "s3cret", "status", "--json")
    assert json.loads(ok.stdout)["workers"] == 0
    env = {**os.environ, "FARM_TOKEN": "s3cret"}
    assert json.loads(farm.farmctl("status", "--json", env=env).stdout)["workers"] == 0
    with grpc.insecure_channel(farm.addr) as channel:  # health stays open for load balancers
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
        with pytest.raises(grpc.RpcError) as err:
            farm_pb2_grpc.FarmServiceStub(channel).GetStatus(farm_pb2.GetStatusRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_stop(running_farm, sig: int) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "1")
    assert farm.stop(sig) == 0
    assert not (farm.data_dir / "farmd.json").exists()
    assert "farmd stopped" in farm.log.read_text()


def test_bad_flags_and_busy_port(running_farm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = subprocess.run([FARMD, "serve", "--workers", "-1"], capture_output=True, timeout=30)
    assert bad.returncode == 2
    farm = running_farm("--workers", "0")
    busy = subprocess.run([FARMD, "serve", "--listen", farm.addr, "--data", str(tmp_path / "other"),
                           "--workers", "0"], capture_output=True, timeout=60)
    assert busy.returncode != 0 and b"cannot listen" in busy.stderr


def test_unreachable_farm_is_a_clear_error() -> None:
    from tests.conftest import farmctl

    res = farmctl("--addr", "127.0.0.1:1", "status", check=False, timeout=60)
    assert res.returncode == 1 and b"127.0.0.1:1" in res.stderr and b"UNAVAILABLE" in res.stderr


def test_sigterm_mid_run_hands_unfinished_rollouts_back(running_farm) -> None:  # type: ignore[no-untyped-def]
    import time

    from farm_client import FarmClient

    from farmd.store import Store

    farm = running_farm("--workers", "2")
    with FarmClient(farm.addr) as client:
        run = client.run("py-func", "reference", 40, group_size=4)
        deadline = time.monotonic() + 60
        while client.progress([run["id"]])["done"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert farm.stop(signal.SIGTERM) == 0

    async def counts() -> dict[str, int]:
        store = await Store.open(farm.data_dir / "farm.db")
        try:
            return await store.job_counts()
        finally:
            await store.close()

    left = asyncio.run(counts())
    assert left.get("leased", 0) == 0 and left.get("failed", 0) == 0, left
    assert left.get("done", 0) + left.get("queued", 0) == 40 and left.get("queued", 0) > 0, left
    again = running_farm("--workers", "2", data_dir=farm.data_dir)
    with FarmClient(again.addr) as client:
        deadline = time.monotonic() + 120
        while (p := client.progress([run["id"]]))["done"] < 40:
            assert time.monotonic() < deadline, p
            time.sleep(0.1)
        assert p == {"jobs": 40, "done": 40, "failed": 0, "cancelled": 0, "passed": 40}


def test_the_data_directory_is_private_to_farmd(running_farm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import stat
    import time

    from farm_client import FarmClient

    def loose(root: Path) -> list[str]:
        """Everything under ``root`` (itself included) that a group or other user may touch."""
        paths = [root, *root.rglob("*")]
        return [f"{p.relative_to(root)} {stat.S_IMODE(p.lstat().st_mode):o}" for p in paths
                if stat.S_IMODE(p.lstat().st_mode) & 0o077]

    data = tmp_path / "data"
    farm = running_farm("--workers", "1", data_dir=data)
    with FarmClient(farm.addr) as client:
        run = client.run("rg:chain_sum", "reference", 4, group_size=4)
        deadline = time.monotonic() + 60
        while client.progress([run["id"]])["done"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        client.publish_policy(b"weights")
        assert loose(data) == []
        names = {p.name for p in data.iterdir()}
        assert {"farm.db", "farm.db-wal", "farm.db-shm", "verifier.key", "farmd.json", "policies"} <= names, names
    assert farm.stop() == 0
    assert loose(data) == []

    # A data directory made looser (by hand, a copy, an older farmd) is tightened when farmd starts.
    data.chmod(0o755)
    (data / "farm.db").chmod(0o644)
    (data / "policies").chmod(0o755)
    (data / "notes.txt").write_text("kept, but private")
    (data / "notes.txt").chmod(0o664)
    again = running_farm("--workers", "0", data_dir=data)
    assert loose(data) == []
    assert again.log.read_text().count("was readable by others") >= 4
    with FarmClient(again.addr) as client:
        assert client.get_policy()[1] == b"weights"


def test_stop_logs_what_was_done(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "1")
    done = json.loads(farm.farmctl("run", "--env", "rg:chain_sum", "--agent", "reference", "--rollouts", "3",
                                   "--wait", "--json").stdout)
    assert done["done"] == 3
    assert farm.stop(signal.SIGTERM) == 0
    assert "farmd stopped: 3 complete, 0 failed, 0 retried, 0 in flight" in farm.log.read_text()


async def test_a_permanent_endpoint_refusal_fails_the_job_at_once(running_farm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A 400 is not retried by the scheduler (whatever ``max_attempts``), and is never a score."""
    from tests.agents.fake_endpoint import Reply, fake_endpoint

    async with fake_endpoint(lambda request: Reply.error(400, "this model does not take tools")) as ep:
        cfg = tmp_path / "farm.toml"
        cfg.write_text(f'[scheduler]\nmax_attempts = 3\nretry_backoff_s = 0.0\n\n[endpoints.strict]\nurl = "{ep.url}"\n')

        def scenario() -> tuple[dict[str, int], str]:
            farm = running_farm("--workers", "1", "--config", str(cfg))
            res = farm.farmctl("run", "--env", "rg:chain_sum", "--agent", "openai:fake@strict", "--rollouts", "2",
                               "--wait", "--json", check=False)
            farm.stop(signal.SIGTERM)
            return json.loads(res.stdout), farm.log.read_text()

        run, log = await asyncio.to_thread(scenario)
        leases = ep.calls
    assert run["failed"] == 2 and run["done"] == 0, run
    # The client asks once more without optional fields, then gives up; the scheduler adds no lease.
    assert leases <= 2 * 2, leases
    assert "failed at once: trying again cannot help" in log and "this model does not take tools" in log
    assert "0 complete, 2 failed, 0 retried" in log


@contextlib.asynccontextmanager
async def _a_rollout_that_hangs(running_farm, tmp_path: Path) -> AsyncIterator[tuple[RunningFarm, Path]]:  # type: ignore[no-untyped-def]
    """A farm of one worker whose one rollout waits on a model that never answers, its request arrived; and the
    farm's config file, naming that model."""
    from tests.agents.fake_endpoint import Reply, fake_endpoint

    async with fake_endpoint(lambda request: Reply.hang()) as ep:
        cfg = tmp_path / "farm.toml"
        cfg.write_text(f'[endpoints.slow]\nurl = "{ep.url}"\nrequest_timeout_s = 120\n')
        farm = await asyncio.to_thread(running_farm, "--workers", "1", "--config", str(cfg))
        await asyncio.to_thread(farm.farmctl, "run", "--env", "rg:chain_sum", "--agent", "openai:fake@slow",
                                "--rollouts", "1")
        await asyncio.wait_for(ep.arrived.wait(), 60)
        yield farm, cfg


async def test_a_second_signal_exits_at_once(running_farm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The first signal starts a graceful stop that would wait for a rollout its model never answers; the
    second cuts it short."""
    import time

    async with _a_rollout_that_hangs(running_farm, tmp_path) as (farm, _):
        farm.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert farm.proc.poll() is None, "the graceful stop waits for the rollout in flight"
        started = time.monotonic()
        code = await asyncio.to_thread(farm.stop, signal.SIGTERM, 10)
        took = time.monotonic() - started
    assert code == 130 and took < 3, (code, took)
    assert "second signal: exiting now" in farm.log.read_text()


def test_a_second_farmd_on_a_data_directory_in_use_is_refused_and_touches_nothing(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    runfile = (farm.data_dir / "farmd.json").read_bytes()
    for role in (["--listen", "127.0.0.1:0"], ["--join", farm.addr, "--node-name", "second"]):
        second = subprocess.run([FARMD, "serve", *role, "--data", str(farm.data_dir)], capture_output=True, timeout=60)
        assert second.returncode == 2, second
        assert f"another farmd (pid {farm.proc.pid}) serves from {farm.data_dir}" in second.stderr.decode(), second
        assert (farm.data_dir / "farmd.json").read_bytes() == runfile, "the first's run file is left as it was"
    assert json.loads(farm.farmctl("status", "--json").stdout)["nodes"] == [], "no node joined from its directory"
    # The kernel lets go of the lock with the process, however it ends: the directory serves again at once.
    farm.stop(sig=signal.SIGKILL)
    again = running_farm("--workers", "0", data_dir=farm.data_dir)
    assert again.farmctl("status").returncode == 0


async def test_a_coordinator_taking_over_gives_back_what_the_last_ones_own_worker_held(running_farm,  # type: ignore[no-untyped-def]
                                                                                     tmp_path) -> None:
    """The last coordinator ran rollouts itself and was killed with one in flight. The one that takes over runs
    none, as a standby on another host would find it (its worker's host name is not the dead one's, so no worker's
    ``recover`` finds that lease): the lease goes back when it starts, not when it runs out."""
    async with _a_rollout_that_hangs(running_farm, tmp_path) as (farm, cfg):
        await asyncio.to_thread(farm.stop, signal.SIGKILL)
        again = await asyncio.to_thread(running_farm, "--workers", "0", "--config", str(cfg), data_dir=farm.data_dir)
        status = json.loads((await asyncio.to_thread(again.farmctl, "status", "--json")).stdout)
    assert (status["queue"]["leased"], status["queue"]["queued"]) == (0, 1), status["queue"]
    assert "took over: 1 rollouts the last coordinator's own worker had leased went back" in again.log.read_text()
