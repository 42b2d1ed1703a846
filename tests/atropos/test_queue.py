"""The Atropos queue against extremes a trainer or an environment may declare, in a real farmd: a deep queue cut
into batches of a few sequences, an environment's group size in the billions. Each is handled in time linear
in what is really queued, off the event loop, whose longest stall is measured while it happens."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.api.test_atropos import REGISTRATION
from tests.probe import LoopProbe

STALL_S = 0.5
"""The longest a health check may wait on farmd's loop meanwhile: a few ms here unloaded; 09d81bf held it for
tens of seconds and more in both cases. Generous for a loaded two-core machine, far below what fails."""


def _groups(n: int, size: int, env_id: int | None, first: int = 0) -> list[dict[str, Any]]:
    out = []
    for g in range(n):
        tokens = [[first + g, 1, 2] for _ in range(size)]
        out.append({"tokens": tokens, "masks": [[-100, 1, 2]] * size, "scores": [0.5] * size,
                    **({"env_id": env_id} if env_id is not None else {})})
    return out


def _atropos(farm: Any) -> str:
    return "http://" + json.loads((farm.data_dir / "farmd.json").read_text())["atropos"]


def test_a_deep_queue_cut_into_batches_of_one_group_holds_nothing(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--atropos", "127.0.0.1:0")
    url = _atropos(farm)
    with httpx.Client(timeout=120) as http:
        http.post(url + "/register", json={**REGISTRATION, "batch_size": 2}).raise_for_status()
        assert http.get(url + "/batch").json() == {"batch": None}
        env = {"max_token_length": 64, "desired_name": "deep", "weight": 1.0, "group_size": 2,
               "min_batch_allocation": 0.5}
        assert http.post(url + "/register-env", json=env).json()["env_id"] == 0
        for push in range(4):  # 16,384 groups of 2: 8,192 batches of one group each, cut at once
            groups = _groups(4096, 2, push % 2, first=push * 4096)
            http.post(url + "/scored_data_list", json=groups).raise_for_status()
        assert http.get(url + "/status").json()["queue_size"] == 4 * 4096
        with LoopProbe(farm.addr) as probe:
            batch = http.get(url + "/batch", timeout=60).json()["batch"]
        assert len(batch) == 1 and len(batch[0]["tokens"]) == 2
        assert probe.asked > 3 and probe.worst_s < STALL_S, f"farmd's loop was held {probe.worst_s:.2f} s cutting"
        assert http.get(url + "/status").json()["current_step"] == 8192, "every batch the queue allows, at once"


def test_a_group_size_in_the_billions_costs_what_the_buffer_holds(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--atropos", "127.0.0.1:0")
    url = _atropos(farm)
    with httpx.Client(timeout=120) as http:
        http.post(url + "/register", json=REGISTRATION).raise_for_status()
        http.get(url + "/batch").raise_for_status()
        env = {"max_token_length": 2 ** 62, "desired_name": "huge", "weight": 1.0, "group_size": 10 ** 9}
        assert http.post(url + "/register-env", json=env).json()["env_id"] == 0
        # Asked every millisecond: the sixteen pushes, each only buffered, can be over in a few tens of them.
        with LoopProbe(farm.addr, every_s=0.001) as probe:
            for push in range(16):
                reply = http.post(url + "/scored_data_list", json=_groups(8, 3, 0, first=push * 8))
                assert reply.json()["buffered"] == 8, reply.text
        assert probe.asked > 3 and probe.worst_s < STALL_S, f"farmd's loop was held {probe.worst_s:.2f} s buffering"
        status = http.request("GET", url + "/status-env", json={"env_id": 0}).json()
        assert status["self_queue_size"] == 0


def test_a_buffer_that_never_adds_up_is_bounded(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--atropos", "127.0.0.1:0")
    url = _atropos(farm)
    with httpx.Client(timeout=120) as http:
        http.post(url + "/register", json=REGISTRATION).raise_for_status()
        http.get(url + "/batch").raise_for_status()
        env = {"max_token_length": 64, "desired_name": "odd", "weight": 1.0, "group_size": 5}
        assert http.post(url + "/register-env", json=env).json()["env_id"] == 0
        with LoopProbe(farm.addr) as probe:
            answers = [http.post(url + "/scored_data_list", json=_groups(256, 2, 0, first=i * 256)) for i in range(5)]
        assert [a.status_code for a in answers] == [200, 200, 200, 200, 400], [a.text[:200] for a in answers]
        assert "buffer holds 1024 groups" in answers[-1].json()["detail"]
        assert probe.worst_s < STALL_S, f"farmd's loop was held {probe.worst_s:.2f} s searching a buffer"


def test_registered_environments_are_bounded(running_farm) -> None:  # type: ignore[no-untyped-def]
    from farmd.atropos.queue import MAX_ENVS

    farm = running_farm("--workers", "0", "--atropos", "127.0.0.1:0")
    url = _atropos(farm)
    with httpx.Client(timeout=120) as http:
        http.post(url + "/register", json=REGISTRATION).raise_for_status()
        http.get(url + "/batch").raise_for_status()
        env = {"max_token_length": 64, "desired_name": "many", "weight": 1.0, "group_size": 2}
        with LoopProbe(farm.addr) as probe:
            ids = [http.post(url + "/register-env", json=env).json()["env_id"] for _ in range(MAX_ENVS)]
            refused = http.post(url + "/register-env", json=env)
        assert ids == list(range(MAX_ENVS)) and refused.status_code == 400, refused.text
        assert f"{MAX_ENVS} environments are registered" in refused.json()["detail"]
        assert probe.worst_s < STALL_S, f"farmd's loop was held {probe.worst_s:.2f} s registering"
        http.get(url + "/reset_data").raise_for_status()
        assert http.post(url + "/register-env", json=env).json()["status"] == "wait for trainer to start"
