"""Disk that does not grow without bound, through a real farmd: its background sweep keeps a policy version's
content while something can use it (the newest of its line, an operator's pin, a node's lease) and removes the
rest; every version's hash and metadata stay, GetPolicy of a removed one says when and why, and ``farmctl status``
says what the store and the policies take on disk and how fast that grows."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm.v1 import node_pb2
from farm_client import FarmClient
from farm_client.convert import duration
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.api.test_node_results import OWNER, BareNode, hello, record
from tests.conftest import RunningFarm

SWEEP_S = 0.1


def start(running_farm: Callable[..., RunningFarm], tmp_path: Path, keep_newest: int) -> RunningFarm:
    config = tmp_path / f"keep-{keep_newest}.toml"
    config.write_text(f"[scheduler]\npolicy_keep_newest = {keep_newest}\npolicy_sweep_s = {SWEEP_S}\n")
    return running_farm("--workers", "0", "--config", str(config))


def held(farm: RunningFarm) -> set[str]:
    folder = farm.data_dir / "policies"
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")} if folder.exists() else set()


def settles(farm: RunningFarm, expected: set[str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while held(farm) != expected:
        assert time.monotonic() < deadline, f"the farm holds {sorted(held(farm))}, not {sorted(expected)}"
        time.sleep(0.02)


def removal(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    status = rpc_status.from_call(raised.value)
    assert status is not None, "a refusal comes with google.rpc details"
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return raised.value.code(), info.reason, raised.value.details() or ""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_loop_of_publishes_keeps_the_newest_and_the_pinned_and_status_shows_the_disk(
        running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = start(running_farm, tmp_path, keep_newest=2)
    tiny = [f"tiny weights {i} ".encode() * 5000 for i in range(8)]
    other = [f"other weights {i} ".encode() * 3000 for i in range(3)]
    with FarmClient(farm.addr) as client:
        first = client.publish_policy(tiny[0], name="tiny")
        pinned = json.loads(farm.farmctl("policy", "pin", str(first["version"]), "--json").stdout)
        assert pinned["pinned"] and pinned["kept"] and pinned["sha256"] == sha(tiny[0])
        versions = [first["version"]]
        for i in range(1, 8):
            versions.append(client.publish_policy(tiny[i], name="tiny")["version"])
            if i < 4:
                client.publish_policy(other[i - 1], name="other")
        settles(farm, {sha(tiny[0]), sha(tiny[6]), sha(tiny[7]), sha(other[1]), sha(other[2])})

        assert client.get_policy(sha(tiny[0]))[1] == tiny[0], "the pinned version is served whole"
        assert client.get_policy(name="tiny")[1] == tiny[7] and client.get_policy(name="other")[1] == other[2]
        code, reason, said = removal(lambda: client.get_policy(sha(tiny[3])))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "POLICY_REMOVED")
        assert f"policy version {versions[3]} (line 'tiny', sha256 {sha(tiny[3])}) was removed at" in said, said
        assert "not among the newest 2 versions" in said and "publishing the same content again" in said, said

        listed = json.loads(farm.farmctl("policy", "list", "--json").stdout)
        assert len(listed) == 11, "every version's hash and metadata stay"
        by_sha = {p["sha256"]: p for p in listed}
        assert set(by_sha) == {sha(d) for d in tiny + other}
        for data in tiny[1:6] + other[:1]:
            p = by_sha[sha(data)]
            assert p["removed"] and not p["kept"] and p["size"] == len(data) and p["removed_at"] > 0
            assert "policy_keep_newest" in p["removed_reason"]
        assert by_sha[sha(tiny[0])]["pinned"] and not by_sha[sha(tiny[0])]["removed"]
        shown = farm.farmctl("policy", "list")
        assert shown.returncode == 0 and b"removed" in shown.stdout and b"kept (pinned)" in shown.stdout

        refused = farm.farmctl("policy", "pin", str(versions[3]), "--json", check=False)
        assert refused.returncode != 0
        error = json.loads(refused.stdout)["error"]
        assert error["code"] == "FAILED_PRECONDITION" and "was removed" in error["message"], error

        status = client.status()
        disk = status["disk"]
        files = held(farm)
        assert disk["policy_files"] == len(files) == 5
        assert disk["policy_bytes"] == sum((farm.data_dir / "policies" / f).stat().st_size for f in files)
        assert (disk["policies_kept"], disk["policies_removed"], disk["policies_pinned"]) == (5, 6, 1)
        assert disk["policy_bytes_removed"] == sum(len(d) for d in tiny[1:6] + other[:1])
        assert disk["store_bytes"] >= (farm.data_dir / "farm.db").stat().st_size > 0
        assert disk["policy_keep_newest"] == 2

        # Unpinned, it goes once nothing else uses it; published again, it is back and current.
        unpinned = json.loads(farm.farmctl("policy", "unpin", str(first["version"]), "--json").stdout)
        assert not unpinned["pinned"]
        settles(farm, {sha(tiny[6]), sha(tiny[7]), sha(other[1]), sha(other[2])})
        assert removal(lambda: client.get_policy(sha(tiny[0])))[1] == "POLICY_REMOVED"
        assert client.publish_policy(tiny[0], name="tiny")["version"] == first["version"]
        settles(farm, {sha(tiny[0]), sha(tiny[7]), sha(other[1]), sha(other[2])})
        assert client.get_policy(name="tiny") == (first["version"], tiny[0], "")

        time.sleep(1.2)  # growth is a rate over the samples the sweep takes: more than a second of them
        disk = client.status()["disk"]
        assert disk["store_growth_bytes_per_hour"] is not None and disk["policy_growth_bytes_per_hour"] is not None
        assert 1.0 <= disk["growth_window_s"] <= 600
    text = farm.farmctl("status").stdout.decode()
    assert "disk: store " in text and "policies " in text and "/hour" in text, text
    assert "standby coordinators" not in text, "a SQLite farm's store is its own: nobody can stand by"


def test_a_version_a_node_leased_survives_until_its_jobs_end(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = start(running_farm, tmp_path, keep_newest=1)
    leased, later = b"the leased weights" * 1000, [f"later {i}".encode() * 1000 for i in range(3)]
    with FarmClient(farm.addr) as client:
        version = client.publish_policy(leased, name="tiny")["version"]
        client.run("arith", "torch:tiny", rollouts=2, group_size=2)
        node = BareNode(farm.addr)
        try:
            hello(node)
            jobs = sorted(node.ask(lease=node_pb2.LeaseRequest(n=64, wait=duration(1.0))).leased.jobs, key=lambda j: j.id)
            assert len(jobs) == 2 and {j.policy_version for j in jobs} == {version}
            assert {j.policy_sha256 for j in jobs} == {sha(leased)}
            for data in later:
                client.publish_policy(data, name="tiny")
            settles(farm, {sha(leased), sha(later[-1])})  # the versions between went; the leased one stays
            time.sleep(10 * SWEEP_S)
            assert held(farm) == {sha(leased), sha(later[-1])}
            assert client.get_policy(sha(leased))[1] == leased, "the node may still fetch what it leased"

            reply = node.ask(results=node_pb2.ResultsRequest(parts=[
                node_pb2.ResultPart(job_id=jobs[0].id, owner=OWNER, data=record(jobs[0]), last=True)])).results
            assert list(reply.stored) == [jobs[0].id]
            time.sleep(10 * SWEEP_S)
            assert sha(leased) in held(farm), "its other job is still leased"
            reply = node.ask(results=node_pb2.ResultsRequest(parts=[
                node_pb2.ResultPart(job_id=jobs[1].id, owner=OWNER, data=record(jobs[1]), last=True)])).results
            assert list(reply.stored) == [jobs[1].id]
        finally:
            node.close()
        settles(farm, {sha(later[-1])})
        code, reason, said = removal(lambda: client.get_policy(sha(leased)))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "POLICY_REMOVED") and "was removed" in said
        stored = client.trajectories(limit=10)
        assert sorted(t.id for t in stored) == [j.id for j in jobs]
        assert {t.policy_version for t in stored} == {version}, "its trajectories keep the version they ran"

