"""On farmd's Atropos API what a credential registers is its own: the trainer registration (batches and resets)
and each environment id (pushes, disconnects, status). Real HTTP calls under several credentials against an
in-process farmd, a restart on the same data, an operator's reassignment, and a reset that lets both go."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import grpc
import httpx
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient

from farmd.atropos.settings import AtroposConfig
from farmd.config import Config, Credential
from tests.api.conftest import InProcessFarm
from tests.api.test_atropos import REGISTRATION, Atropos, group
from tests.api.test_names import held, refusal

ROLES = {"tess": ("trainer",), "tom": ("trainer",), "ops": ("operator",), "envy": ("environment",),
         "evan": ("environment",)}
CREDENTIALS = tuple(Credential(name, frozenset(roles), hashlib.sha256(f"{name}-token".encode()).hexdigest())
                    for name, roles in ROLES.items())
ENV = {"max_token_length": 512, "desired_name": "math", "weight": 1.0, "group_size": 2}


def start(tmp_path: Path, farms: list[InProcessFarm], **config: Any) -> dict[str, Atropos]:
    farm = InProcessFarm(Config(data_dir=tmp_path / "farm", listen="127.0.0.1:0", workers=0,
                                atropos_listen="127.0.0.1:0", credentials=CREDENTIALS, **config))
    farms.append(farm)
    farm.start()
    addr = json.loads((tmp_path / "farm" / "farmd.json").read_text())["atropos"]
    return {name: Atropos(addr, f"{name}-token") for name in ROLES} | {"grpc": Atropos(farm.addr)}


def refused(response: httpx.Response, holder: str, kind: str, name: str) -> None:
    """403 in FastAPI's ``detail`` shape (what atroposlib's server sends a refused call), naming who holds it."""
    assert response.status_code == 403, (response.status_code, response.text)
    detail = response.json()["detail"]
    assert isinstance(detail, str) and f"{kind} {name!r} belongs to credential {holder!r}" in detail, detail


def test_an_environment_id_and_the_trainer_registration_are_their_makers(tmp_path: Path) -> None:
    farms: list[InProcessFarm] = []
    try:
        api = start(tmp_path, farms)
        tess, tom, ops, envy, evan = (api[n] for n in ("tess", "tom", "ops", "envy", "evan"))
        assert tess.post("/register", REGISTRATION).status_code == 200
        assert tess.get("/batch").json() == {"batch": None}, "the trainer has started: environments may register"
        assert envy.post("/register-env", ENV).json()["env_id"] == 0
        # A name is its first registrant's: its groups are farm environment atropos:NAME, which a farm trainer
        # subscribes to. Another credential registers it under no spelling that stores as the same name.
        assert envy.post("/register-env", {**ENV, "desired_name": "math/"}).json()["env_id"] == 1
        for taken in ("math", "math ", "math?"):
            refused(evan.post("/register-env", {**ENV, "desired_name": taken}), "envy", "Atropos environment name",
                    "atropos:math" if taken == "math" else "atropos:math_")
        assert evan.post("/register-env", {**ENV, "desired_name": "code"}).json()["env_id"] == 2

        # One environment's credential pushes, disconnects, reads the status of its own id only.
        refused(evan.post("/scored_data", group(2, 100, env_id=0)), "envy", "Atropos environment id", "0")
        refused(evan.post("/scored_data_list", [group(2, 110, env_id=2), group(2, 120, env_id=0)]), "envy",
                "Atropos environment id", "0")
        refused(evan.post("/disconnect-env", {"env_id": 0}), "envy", "Atropos environment id", "0")
        refused(evan.get("/status-env", {"env_id": 0}), "envy", "Atropos environment id", "0")
        refused(ops.post("/scored_data", group(2, 130, env_id=0)), "envy", "Atropos environment id", "0")
        unregistered = evan.post("/scored_data", group(2, 140, env_id=7))
        assert unregistered.status_code == 404 and "no environment 7" in unregistered.json()["detail"], \
            "an id nobody registered cannot be taken ahead of its registrant"
        assert tess.get("/status").json()["queue_size"] == 0, "nothing of a refused request is kept"
        assert envy.get("/status-env", {"env_id": 0}).json()["self_queue_size"] == 0
        assert envy.post("/scored_data", group(2, 200, env_id=0)).json() == {"status": "received"}
        assert evan.post("/scored_data", group(2, 300, env_id=2)).json() == {"status": "received"}
        assert evan.post("/scored_data", group(2, 400)).json() == {"status": "received"}, "no id: nobody's"

        # The trainer's registration is the registrant's: another trainer neither registers over it, nor takes
        # its batches, nor resets its queue.
        refused(tom.post("/register", REGISTRATION), "tess", "Atropos trainer registration", "trainer")
        refused(tom.get("/batch"), "tess", "Atropos trainer registration", "trainer")
        refused(tom.get("/reset_data"), "tess", "Atropos trainer registration", "trainer")
        refused(ops.get("/batch"), "tess", "Atropos trainer registration", "trainer")
        assert tess.get("/status").json()["queue_size"] == 3
        assert tess.post("/register", REGISTRATION).status_code == 200, "another process of the same trainer"

        farms.pop().stop()
        api = start(tmp_path, farms)  # the same data: every name is still its maker's
        tess, tom, envy, evan = (api[n] for n in ("tess", "tom", "envy", "evan"))
        refused(evan.post("/scored_data", group(2, 500, env_id=0)), "envy", "Atropos environment id", "0")
        refused(tom.get("/batch"), "tess", "Atropos trainer registration", "trainer")

        # An operator gives an id to another credential: the one way it changes hands.
        with grpc.insecure_channel(api["grpc"].url.removeprefix("http://")) as channel:
            stub = farm_pb2_grpc.FarmServiceStub(channel)
            reply = stub.ReassignName(farm_pb2.ReassignNameRequest(kind="atropos-env", name="0", credential="evan"),
                                      metadata=(("authorization", "Bearer ops-token"),), timeout=10)
            assert (reply.name.credential, reply.previous) == ("evan", "envy")
        assert evan.post("/scored_data", group(2, 600, env_id=0)).json() == {"status": "received"}
        refused(envy.post("/scored_data", group(2, 700, env_id=0)), "evan", "Atropos environment id", "0")

        # The trainer's reset forgets the registration and every id with the queue: each is its next maker's.
        batch = tess.get("/batch").json()["batch"]
        assert sorted(g["tokens"][0][0] for g in batch) == [200, 300, 400, 600]
        assert tess.get("/reset_data").status_code == 200
        assert tom.post("/register", REGISTRATION).status_code == 200
        refused(tess.get("/batch"), "tom", "Atropos trainer registration", "trainer")
        assert tom.get("/batch").json() == {"batch": None}
        refused(evan.post("/register-env", ENV), "envy", "Atropos environment name", "atropos:math")
        assert evan.post("/register-env", {**ENV, "desired_name": "code"}).json()["env_id"] == 0, \
            "an id is its next registrant's; a name stays its first's (its trajectories stay in the store)"
        refused(envy.post("/scored_data", group(2, 800, env_id=0)), "evan", "Atropos environment id", "0")
        assert envy.post("/scored_data", group(2, 900, env_id=2)).status_code == 404
    finally:
        for farm in farms:
            farm.stop()


def test_the_atropos_feeds_consumer_is_farmds_own(tmp_path: Path) -> None:
    farms: list[InProcessFarm] = []
    try:
        start(tmp_path, farms, atropos=AtroposConfig(envs=("arith",), agent="torch:tiny"))
        with FarmClient(farms[0].addr, token="tess-token") as tess:
            why = refusal(lambda: tess.ack("atropos", 0))
            assert why[:2] == held("consumer", "atropos", "(farmd)", "tess")[:2]
            assert "consumer 'atropos' belongs to farmd itself" in why[2]
    finally:
        for farm in farms:
            farm.stop()
