"""Through the API: runs on named tasks, policies published to named lines, and a trainer's subscription."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from farm_client import FarmClient

from tests.conftest import farmctl


def test_a_run_on_named_seeds_queues_exactly_those_tasks(farm_in_process: Callable[..., str]) -> None:
    with FarmClient(farm_in_process()) as client:
        run = client.run("arith:heldout", "reference", group_size=2, difficulty=2, seeds=[5, 9, 11])
        assert (run["jobs"], len(run["group_ids"])) == (6, 3)
        for why, kwargs in [("distinct", {"seeds": [1, 1]}), ("difficulty must be 1..5", {"seeds": [1]}),
                            ("difficulty goes with seeds", {"difficulty": 2, "rollouts": 4}),
                            ("one group of 2 per seed", {"seeds": [1, 2], "difficulty": 1, "rollouts": 3})]:
            with pytest.raises(grpc.RpcError) as err:
                client.run("arith", "reference", **{"group_size": 2, **kwargs})  # type: ignore[arg-type]
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in (err.value.details() or "")


def test_policies_have_lines_and_a_torch_run_needs_its_line_published(farm_in_process: Callable[..., str]) -> None:
    with FarmClient(farm_in_process()) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.run("arith", "torch:tiny", 8)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "tiny" in (err.value.details() or "")
        first = client.publish_policy(b"tiny one", name="tiny")
        other = client.publish_policy(b"other one", name="other")
        assert (first["name"], other["name"], other["version"]) == ("tiny", "other", first["version"] + 1)
        assert client.get_policy(name="tiny") == (first["version"], b"tiny one", "")
        assert client.get_policy()[0] == other["version"], "no name: the newest of any line"
        assert client.run("arith", "torch:tiny", 8)["jobs"] == 8
        with pytest.raises(grpc.RpcError) as err:
            client.publish_policy(b"x", name="no spaces")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_subscription_to_an_unknown_environment_is_refused(farm_in_process: Callable[..., str]) -> None:
    with FarmClient(farm_in_process()) as client:
        with pytest.raises(grpc.RpcError) as err:
            next(client.batches("trainer", agent="torch:tiny", envs=["arithh"]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "arithh" in (err.value.details() or "")


def test_farmctl_runs_named_seeds(farm_in_process: Callable[..., str]) -> None:
    addr = farm_in_process()
    queued = json.loads(farmctl("--addr", addr, "run", "--env", "arith", "--agent", "reference", "--seeds", "0-9,20",
                                "--difficulty", "2", "--group-size", "1", "--json").stdout)
    assert (queued["jobs"], len(queued["group_ids"])) == (11, 11)
    bad = farmctl("--addr", addr, "run", "--env", "arith", "--agent", "reference", "--seeds", "9-3", "--json",
                  check=False)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "INVALID_ARGUMENT"
