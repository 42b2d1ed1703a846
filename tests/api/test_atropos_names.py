"""On farmd's Atropos API what a credential registers is its own: the trainer registration (batches, resets),
each environment id (pushes, disconnects, status) and each environment name (the farm environment its groups
are stored as). Real HTTP calls under several credentials against an in-process farmd, a restart on the same
data, an operator's reassignment, and a reset that lets the registration and the ids go."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
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
ID, NAME, TRAINER = "Atropos environment id", "Atropos environment name", "Atropos trainer registration"


class Farm:
    """An in-process farmd with the Atropos API, and a client per credential."""

    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self.process = InProcessFarm(Config(data_dir=tmp_path / "farm", listen="127.0.0.1:0", workers=0,
                                            atropos_listen="127.0.0.1:0", credentials=CREDENTIALS, **config))
        self.process.start()
        addr = json.loads((tmp_path / "farm" / "farmd.json").read_text())["atropos"]
        self.api = {name: Atropos(addr, f"{name}-token") for name in ROLES}

    def __getattr__(self, name: str) -> Atropos:
        return self.api[name]


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Callable[..., Farm]]:
    """``farm(**config)``: a farm on ``tmp_path``'s data (again: a restart, the one before stopped first)."""
    running: list[Farm] = []

    def start(**config: Any) -> Farm:
        if running:
            running.pop().process.stop()
        running.append(Farm(tmp_path, **config))
        return running[-1]

    yield start
    for made in running:
        made.process.stop()


def refused(response: httpx.Response, holder: str, kind: str, name: str) -> None:
    """403 in FastAPI's ``detail`` shape (what atroposlib's server sends a refused call), naming who holds it."""
    assert response.status_code == 403, (response.status_code, response.text)
    detail = response.json()["detail"]
    assert isinstance(detail, str) and f"{kind} {name!r} belongs to credential {holder!r}" in detail, detail


def started(f: Farm) -> None:
    """tess registered and took a first (empty) batch: environments may register."""
    assert f.tess.post("/register", REGISTRATION).status_code == 200
    assert f.tess.get("/batch").json() == {"batch": None}


def test_an_environment_id_is_its_registrants_to_push_disconnect_and_read(farm: Callable[..., Farm]) -> None:
    f = farm()
    started(f)
    assert f.envy.post("/register-env", ENV).json()["env_id"] == 0
    assert f.evan.post("/register-env", {**ENV, "desired_name": "code"}).json()["env_id"] == 1
    refused(f.evan.post("/scored_data", group(2, 100, env_id=0)), "envy", ID, "0")
    refused(f.evan.post("/scored_data_list", [group(2, 110, env_id=1), group(2, 120, env_id=0)]), "envy", ID, "0")
    refused(f.evan.post("/disconnect-env", {"env_id": 0}), "envy", ID, "0")
    refused(f.evan.get("/status-env", {"env_id": 0}), "envy", ID, "0")
    refused(f.ops.post("/scored_data", group(2, 130, env_id=0)), "envy", ID, "0")  # an operator acts under none
    unregistered = f.evan.post("/scored_data", group(2, 140, env_id=7))
    assert unregistered.status_code == 404 and "no environment 7" in unregistered.json()["detail"], \
        "an id nobody registered cannot be taken ahead of its registrant"
    assert f.tess.get("/status").json()["queue_size"] == 0, "nothing of a refused request is kept"
    assert f.envy.get("/status-env", {"env_id": 0}).json()["self_queue_size"] == 0
    assert f.envy.post("/scored_data", group(2, 200, env_id=0)).json() == {"status": "received"}
    assert f.evan.post("/scored_data", group(2, 300, env_id=1)).json() == {"status": "received"}
    assert f.evan.post("/scored_data", group(2, 400)).json() == {"status": "received"}, "no id: nobody's"
    assert f.envy.post("/disconnect-env", {"env_id": 0}).json() == {"status": "success"}
    assert f.envy.get("/status-env", {"env_id": 0}).json()["self_queue_size"] == 1


def test_an_environment_name_is_its_first_registrants_in_every_spelling(farm: Callable[..., Farm]) -> None:
    f = farm()
    started(f)
    assert f.envy.post("/register-env", ENV).json()["env_id"] == 0
    assert f.envy.post("/register-env", {**ENV, "desired_name": "math/"}).json()["env_id"] == 1, \
        "another instance of its own environment, or another of its names"
    # Its groups are farm environment atropos:math, which a farm trainer subscribes to: another credential's
    # registration under any name stored as the same would slip its groups into that stream.
    for taken, stored in (("math", "atropos:math"), ("math ", "atropos:math_"), ("math?", "atropos:math_")):
        refused(f.evan.post("/register-env", {**ENV, "desired_name": taken}), "envy", NAME, stored)
    assert f.evan.post("/register-env", {**ENV, "desired_name": "code"}).json()["env_id"] == 2


def test_the_trainer_registration_is_its_registrants_to_batch_and_reset(farm: Callable[..., Farm]) -> None:
    f = farm()
    started(f)
    assert f.envy.post("/scored_data", group(8)).json() == {"status": "received"}
    refused(f.tom.post("/register", REGISTRATION), "tess", TRAINER, "trainer")
    refused(f.tom.get("/batch"), "tess", TRAINER, "trainer")
    refused(f.tom.get("/reset_data"), "tess", TRAINER, "trainer")
    refused(f.ops.get("/batch"), "tess", TRAINER, "trainer")
    assert f.tess.get("/status").json()["queue_size"] == 1, "another trainer took nothing and dropped nothing"
    assert f.tess.post("/register", REGISTRATION).status_code == 200, "another process of the same trainer"
    assert len(f.tess.get("/batch").json()["batch"]) == 1


def test_names_outlive_a_restart_change_hands_by_an_operator_and_a_reset_frees_ids(farm: Callable[..., Farm]
                                                                                  ) -> None:
    f = farm()
    started(f)
    assert f.envy.post("/register-env", ENV).json()["env_id"] == 0
    assert f.evan.post("/register-env", {**ENV, "desired_name": "code"}).json()["env_id"] == 1
    f = farm()  # a restart on the same data: every name is still its maker's
    refused(f.evan.post("/scored_data", group(2, 500, env_id=0)), "envy", ID, "0")
    refused(f.tom.get("/batch"), "tess", TRAINER, "trainer")
    refused(f.evan.post("/register-env", ENV), "envy", NAME, "atropos:math")

    with grpc.insecure_channel(f.process.addr) as channel:  # an operator gives an id to another credential
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        reply = stub.ReassignName(farm_pb2.ReassignNameRequest(kind="atropos-env", name="0", credential="evan"),
                                  metadata=(("authorization", "Bearer ops-token"),), timeout=10)
        assert (reply.name.credential, reply.previous) == ("evan", "envy")
    assert f.evan.post("/scored_data", group(2, 600, env_id=0)).json() == {"status": "received"}
    refused(f.envy.post("/scored_data", group(2, 700, env_id=0)), "evan", ID, "0")

    # The trainer's reset forgets its registration and every id with the queue, as Atropos forgets them: each
    # is its next maker's. A name stays its first registrant's (its trajectories stay in the store).
    assert f.tess.get("/reset_data").status_code == 200
    assert f.tom.post("/register", REGISTRATION).status_code == 200
    refused(f.tess.get("/batch"), "tom", TRAINER, "trainer")
    assert f.tom.get("/batch").json() == {"batch": None}
    refused(f.evan.post("/register-env", ENV), "envy", NAME, "atropos:math")
    assert f.evan.post("/register-env", {**ENV, "desired_name": "code"}).json()["env_id"] == 0
    refused(f.envy.post("/scored_data", group(2, 800, env_id=0)), "evan", ID, "0")
    assert f.envy.post("/scored_data", group(2, 900, env_id=1)).status_code == 404


def test_the_atropos_feeds_consumer_is_farmds_own(farm: Callable[..., Farm]) -> None:
    f = farm(atropos=AtroposConfig(envs=("arith",), agent="torch:tiny"))
    with FarmClient(f.process.addr, token="tess-token") as tess:
        why = refusal(lambda: tess.ack("atropos", 0))
        assert why[:2] == held("consumer", "atropos", "(farmd)", "tess")[:2]
        assert "consumer 'atropos' belongs to farmd itself" in why[2]
