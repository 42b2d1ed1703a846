"""farmd's Atropos API on a real port, in process: the calls Atropos's environments and trainers make, the
batches they get, what is refused, who may call what, and a queue that survives a restart."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from farm_client import FarmClient
from farm_client.sequences import token_rows

from farmd.config import Config, Credential
from tests.api.conftest import InProcessFarm

REGISTRATION = {"wandb_group": "g", "wandb_project": "p", "batch_size": 8, "max_token_len": 512,
                "checkpoint_dir": "/tmp/ckpt", "save_checkpoint_interval": 10, "starting_step": 0, "num_steps": 100}


def group(n: int, first: int = 0, env_id: int | None = None, **extra: Any) -> dict[str, Any]:
    """``n`` sequences of 3 tokens, token ids from ``first`` (so each group can be told apart)."""
    tokens = [[first + i, first + i + 1, first + i + 2] for i in range(n)]
    out: dict[str, Any] = {"tokens": tokens, "masks": [[-100, t[1], t[2]] for t in tokens],
                           "scores": [float(i % 2) for i in range(n)], **extra}
    if env_id is not None:
        out["env_id"] = env_id
    return out


class Atropos:
    """An Atropos client's calls, by path."""

    def __init__(self, addr: str, token: str | None = None) -> None:
        self.url = f"http://{addr}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str, body: Any = None) -> httpx.Response:
        return httpx.request("GET", self.url + path, json=body, headers=self.headers)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        if "content" in kwargs:
            return httpx.post(self.url + path, headers={**self.headers, **kwargs.pop("headers", {})}, **kwargs)
        return httpx.post(self.url + path, json=body, headers=self.headers, **kwargs)


@pytest.fixture
def atropos_farm(tmp_path: Path) -> Iterator[Callable[..., tuple[InProcessFarm, Atropos]]]:
    farms: list[InProcessFarm] = []

    def start(data: str = "farm", token: str | None = None, **config: Any) -> tuple[InProcessFarm, Atropos]:
        farm = InProcessFarm(Config(data_dir=tmp_path / data, listen="127.0.0.1:0", workers=0,
                                    atropos_listen="127.0.0.1:0", **config))
        farms.append(farm)
        farm.start()
        runfile = json.loads((tmp_path / data / "farmd.json").read_text())
        return farm, Atropos(runfile["atropos"], token)

    yield start
    for farm in farms:
        farm.stop()


def test_a_trainer_and_an_environment_meet_as_in_atropos(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    _farm, api = atropos_farm()
    assert api.get("/").json() == {"message": "AtroposLib API"}
    assert api.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert api.get("/batch").json()["status"] == "error", "no trainer registered yet"
    assert isinstance(api.post("/register", REGISTRATION).json()["uuid"], int)
    assert api.get("/info").json() == {"batch_size": 8, "max_token_len": 512}
    assert api.get("/wandb_info").json() == {"group": "g", "project": "p"}
    env = {"max_token_length": 512, "desired_name": "math", "weight": 1.0, "group_size": 4}
    assert api.post("/register-env", env).json() == {"status": "wait for trainer to start"}
    assert api.get("/batch").json() == {"batch": None}, "the trainer has started; nothing is queued"
    registered = api.post("/register-env", env).json()
    assert registered == {"status": "success", "env_id": 0, "wandb_name": "math_0", "checkpoint_dir": "/tmp/ckpt",
                          "starting_step": 0, "checkpoint_interval": 10, "num_steps": 100}

    assert api.post("/scored_data", group(4, 100, env_id=0)).json() == {"status": "received"}
    assert api.post("/scored_data", group(2, 200, env_id=0)).json() == {"status": "buffered", "buffer_size": 2}
    assert api.post("/scored_data", group(2, 300, env_id=0)).json() == {"status": "buffered", "buffer_size": 0}
    assert api.get("/status").json() == {"current_step": 0, "queue_size": 3}
    status_env = api.get("/status-env", {"env_id": 0}).json()
    assert status_env == {"current_step": 0, "queue_size": 2, "unallocated_fraction": 1.0, "self_queue_size": 2,
                          "max_group_size": 4, "env_weight": 1.0}

    batch = api.get("/batch").json()["batch"]
    assert [g["tokens"][0][0] for g in batch] == [100, 200, 300], "the two halves made one group of four"
    assert batch[0]["masks"][0] == [-100, 101, 102] and batch[0]["advantages"] is None and batch[0]["env_id"] == 0
    assert api.get("/status").json() == {"current_step": 1, "queue_size": 0}
    latest = api.get("/latest_example").json()
    assert latest["tokens"][0][0] == 300
    assert api.post("/disconnect-env", {"env_id": 0}).json() == {"status": "success"}
    assert api.get("/reset_data").text == "Reset successful"
    assert api.get("/status").json() == {"current_step": 0, "queue_size": 0}


def test_batches_are_cut_all_at_once_and_handed_out_last_first(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    _farm, api = atropos_farm()
    api.post("/register", {**REGISTRATION, "batch_size": 4})
    listed = [group(2, 100), group(4, 200), group(2, 300), group(4, 400)]
    reply = api.post("/scored_data_list", listed).json()
    assert reply == {"status": "received", "groups_processed": 4}
    first = api.get("/batch").json()["batch"]
    assert api.get("/status").json()["current_step"] == 3, "every batch the queue makes is cut at once"
    second, third = api.get("/batch").json()["batch"], api.get("/batch").json()["batch"]
    cut = [[g["tokens"][0][0] for g in b] for b in (first, second, third)]
    assert cut == [[400], [100, 300], [200]], "packs of the largest size, served last cut first"
    assert api.get("/batch").json() == {"batch": None}


def test_gzip_both_ways_and_bad_groups_are_refused_whole(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    _farm, api = atropos_farm()
    api.post("/register", {**REGISTRATION, "batch_size": 2})
    big = group(2, 500, messages=[[{"role": "user", "content": "x" * 2000}], [{"role": "user", "content": "y"}]])
    sent = api.post("/scored_data", content=gzip.compress(json.dumps(big).encode()),
                    headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert sent.json() == {"status": "received"}
    got = httpx.get(api.url + "/batch", headers={"Accept-Encoding": "gzip"})
    assert got.headers.get("content-encoding") == "gzip" and got.json()["batch"][0]["messages"] == big["messages"]

    def refused(body: Any, status: int, words: str) -> None:
        reply = api.post("/scored_data", content=body, headers={"Content-Type": "application/json"}) \
            if isinstance(body, bytes) else api.post("/scored_data", body)
        assert reply.status_code == status, reply.text
        assert words in json.dumps(reply.json()), reply.json()

    refused({"tokens": [[1, 2]], "masks": [[1]], "scores": [1.0]}, 422, "1 entries for a sequence of 2 tokens")
    refused({"tokens": [[1]], "masks": [[1]], "scores": [1.0, 0.0]}, 422, "2 scores for 1 sequences")
    refused({"tokens": [[1]], "masks": [[1]], "scores": ["NaN"]}, 422, "must be a number")
    refused(b'{"tokens": [[1]], "masks": [[1]], "scores": [1.0], "advantages": [[Infinity]]}', 422, "must be finite")
    refused({"tokens": [[1]], "masks": [[1]]}, 422, "field required")
    refused({"tokens": [[1]], "masks": [[1]], "scores": [1.0], "messages": [[{"role": "user"}]]}, 422,
            "Message must have 'role' and 'content' fields")
    many = [group(1, 1), {"tokens": [[1]], "masks": [[1, 2]], "scores": [0.0]}]
    partial = api.post("/scored_data_list", many)
    assert partial.status_code == 422 and (partial.json()["refused"], partial.json()["groups_processed"]) == ([1], 1)
    assert partial.json()["detail"][0]["loc"] == ["body", 1, "masks", 0], "the refused group's place, and why"
    bad_gzip = api.post("/scored_data", content=b"\x1f\x8bnot gzip", headers={"Content-Encoding": "gzip"})
    assert bad_gzip.status_code == 400 and bad_gzip.text == "Invalid gzip payload"
    bomb = gzip.compress(b"[" + b" " * (260 << 20) + b"]", compresslevel=1)
    assert api.post("/scored_data", content=bomb, headers={"Content-Encoding": "gzip"}).status_code == 413
    assert api.get("/status").json()["queue_size"] == 1, "nothing of a refused group was kept, the group beside it was"


def test_a_restart_keeps_the_queue_the_buffers_and_the_step(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    farm, api = atropos_farm("kept")
    api.post("/register", {**REGISTRATION, "batch_size": 4})
    api.get("/batch")
    api.post("/register-env", {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 4})
    api.post("/scored_data_list", [group(4, 100, env_id=0), group(4, 200, env_id=0), group(4, 300, env_id=0),
                                   group(2, 400, env_id=0)])
    first = api.get("/batch").json()["batch"]
    assert [g["tokens"][0][0] for g in first] == [300]
    farm.stop()

    _farm, api = atropos_farm("kept")
    assert api.get("/status").json() == {"current_step": 3, "queue_size": 0}
    assert api.get("/info").json() == {"batch_size": 4, "max_token_len": 512}
    left = [api.get("/batch").json()["batch"] for _ in range(2)]
    assert [[g["tokens"][0][0] for g in b] for b in left] == [[200], [100]], "batches cut before are still there"
    assert api.post("/scored_data", group(2, 500, env_id=0)).json() == {"status": "buffered", "buffer_size": 0}
    assert [g["tokens"][0][0] for g in api.get("/batch").json()["batch"]] == [400, 500], "and the buffer"


def test_credentials_decide_who_pushes_and_who_takes(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    tokens = {"tess": ("trainer-token", "trainer"), "envy": ("env-token", "environment")}
    credentials = tuple(Credential(name, frozenset({role}), hashlib.sha256(token.encode()).hexdigest())
                        for name, (token, role) in tokens.items())
    _farm, trainer = atropos_farm(credentials=credentials, token="trainer-token")
    env = Atropos(trainer.url.removeprefix("http://"), "env-token")
    nobody = Atropos(trainer.url.removeprefix("http://"))
    assert nobody.get("/status").status_code == 401
    assert trainer.post("/register", REGISTRATION).status_code == 200
    assert env.post("/register", REGISTRATION).status_code == 403
    assert env.post("/scored_data", group(8)).json() == {"status": "received"}
    denied = trainer.post("/scored_data", group(8))
    assert denied.status_code == 403 and "it needs environment or operator" in denied.json()["detail"]
    assert env.get("/batch").status_code == 403
    assert len(trainer.get("/batch").json()["batch"]) == 1


def test_pushed_groups_are_farm_trajectories_a_farm_trainer_can_stream(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    farm, api = atropos_farm("pushed")
    api.post("/register", {**REGISTRATION, "batch_size": 4})
    api.get("/batch")
    api.post("/register-env", {"max_token_length": 64, "desired_name": "gsm8k/v2 <b>", "weight": 1.0, "group_size": 2})
    # Two turns in one sequence: trained runs at 2-3 and 6-7, the tool's reply (4-5) fed back.
    tokens = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 9, 5, 6, 9, 8]]
    masks = [[-100, -100, 3, 4, -100, -100, 7, 8], [-100, -100, 9, 9, -100, -100, 9, 8]]
    logprobs = [[1.0, 1.0, -0.5, -0.25, 1.0, 1.0, -1.5, -0.125], [1.0, 1.0, -2.0, -2.0, 1.0, 1.0, -2.0, -0.5]]
    messages = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": [{"type": "text", "text": "5"}]}]]
    pushed = {"tokens": tokens, "masks": masks, "scores": [1.0, -1.0], "inference_logprobs": logprobs,
              "advantages": [[0.5] * 8, [-0.5] * 8], "messages": messages, "env_id": 0}
    assert api.post("/scored_data", pushed).json() == {"status": "received"}
    assert api.post("/scored_data", {"tokens": [[1]], "masks": [[1, 2]], "scores": [1.0]}).status_code == 422
    assert api.post("/scored_data", group(2, 40)).json() == {"status": "received"}, "a group naming no environment"

    with FarmClient(farm.addr) as client:
        listed = client.trajectories(limit=10, full=True)
        assert [(t.env, t.agent, t.reward, t.passed) for t in listed] == [
            ("atropos:gsm8k_v2__b_", "atropos", 1.0, True), ("atropos:gsm8k_v2__b_", "atropos", -1.0, False),
            ("atropos", "atropos", 0.0, False), ("atropos", "atropos", 1.0, True)]
        assert all(t.flags == ["external_score"] and t.verifier_version == "atropos-env" for t in listed)
        first = listed[0]
        rows = token_rows(first)
        assert [(r.input_ids, r.loss_mask) for r in rows] == [(tokens[0], [0, 0, 1, 1, 0, 0, 1, 1])]
        assert rows[0].logprobs == [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, -1.5, -0.125]
        assert [m.content for m in first.messages] == ["2+2?", "4"] and first.task.prompt == "2+2?"
        assert json.loads(listed[1].messages[1].content) == [{"type": "text", "text": "5"}]
        details = first.verdict_details["atropos"]
        assert details["advantages"] == [0.5] * 8 and details["index"] == 0 and "masks" not in details, \
            "advantages have no field of their own; the masks are the turns'"
        assert first.seed == listed[1].seed != listed[2].seed, "the Atropos group, for both of its sequences"
        assert listed[0].group_id == listed[1].group_id != listed[2].group_id
        # A farm trainer subscribed to Atropos's pushes gets them as whole groups, like its own rollouts.
        batch = next(client.batches("from-atropos", batch_size=2, whole_groups=True, agent="atropos",
                                    envs=["atropos:gsm8k_v2__b_"]))
        assert [t.id for t in batch.trajectories] == [listed[0].id, listed[1].id]
    farm.stop()

    farm, api = atropos_farm("pushed")
    with FarmClient(farm.addr) as client:
        assert len(client.trajectories(limit=10)) == 4, "kept across a restart"
    served = api.get("/batch").json()["batch"]
    assert sorted(g["tokens"] for g in served) == sorted([tokens, [[40, 41, 42], [41, 42, 43]]]), \
        "the queue serves them as pushed"
    assert next(g for g in served if g["tokens"] == tokens)["messages"] == messages


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


# Groups of two that do not hold numbers in their domain: each refused with its reason, its place named.
OUT_OF_DOMAIN: list[tuple[dict[str, Any], str]] = [
    ({"scores": [1e308, 1e308]}, "a score is at most"),
    ({"tokens": [[1, -1, 3], [1, 2, 3]]}, "is -1, outside 0..2147483647"),
    ({"tokens": [[1, 2, 3], [1, 2, 2 ** 31]]}, "is 2147483648"),
    ({"tokens": [[1, 2, 3], [1, 2, 2 ** 40]]}, "is 1099511627776"),
    ({"inference_logprobs": [[1.0, -0.5, 0.5], [1.0, -0.5, -0.5]]}, "a sampled token's logprob is at most 0"),
    ({"generation_params": _deep(150)}, "nested more than 14 deep"),
    ({"generation_params": {"seed": 2 ** 63}}, "integer past int64"),
    ({"overrides": [{"t": 1}, {"t": _deep(40)}]}, "nested more than 14 deep"),
    ({"messages": [[{"role": "user", "content": _deep(60)}], [{"role": "user", "content": "x"}]]},
     "nested more than 14 deep"),
    ({"distill_token_ids": [[[1], [2], [-3]], [[1], [2], [3]]]}, "is -3"),
]


def test_numbers_out_of_their_domain_are_refused_per_group_and_the_groups_beside_them_kept(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    farm, api = atropos_farm()
    api.post("/register", {**REGISTRATION, "batch_size": 64})
    bad = [{**group(2, 10 * i), **change} for i, (change, _) in enumerate(OUT_OF_DOMAIN)]
    # Atropos's own conventions stay valid: scores past [0, 1] (its tests push 2.0; its environments -1.0), and
    # 1.0 as the logprob of a position that was not sampled.
    good = [group(2, 500, scores=[2.0, -1.0]), group(2, 600, inference_logprobs=[[1.0, -0.5, -0.25]] * 2),
            group(2, 700, generation_params=_deep(14), overrides=[_deep(13), {}])]  # as deep as a group may be
    pushed = [good[0], *bad, *good[1:]]
    reply = api.post("/scored_data_list", pushed)
    assert reply.status_code == 422, reply.text
    body = reply.json()
    assert body["refused"] == list(range(1, len(bad) + 1)) and body["groups_processed"] == 3
    for detail, (_, why) in zip(body["detail"], OUT_OF_DOMAIN, strict=True):
        assert why in detail["msg"], (detail, why)
    assert [d["loc"][:2] for d in body["detail"]] == [["body", i] for i in range(1, len(bad) + 1)]
    assert api.get("/status").json()["queue_size"] == 3, "the groups beside the refused ones were kept"
    for change, why in OUT_OF_DOMAIN:  # alone, as /scored_data: refused the same way
        alone = api.post("/scored_data", {**group(2, 900), **change})
        assert alone.status_code == 422 and why in alone.text, alone.text

    # What farm made of the kept groups streams, whole, with finite advantages.
    with FarmClient(farm.addr) as client:
        listed = client.trajectories(limit=100, full=True)
        assert sorted(t.reward for t in listed) == [-1.0, 0.0, 0.0, 1.0, 1.0, 2.0]
        assert all(t.flags == ["external_score"] for t in listed), "each reads whole, none unreadable"
        batch = next(client.batches("pushed", batch_size=8, whole_groups=True, tensors=True))
        assert len(batch.trajectories) == 6 and bool(batch.advantages.isfinite().all())


def test_bodies_being_sent_count_against_their_credential_and_no_other(atropos_farm) -> None:  # type: ignore[no-untyped-def]
    """Bodies are read whole before they are checked: one credential's requests in flight together hold at most
    its budget (by what they declare, before a byte is read); past it a request is refused with 429, and another
    credential pushes all the same."""
    import socket

    tokens = {"envy": "env-token", "enva": "other-env-token"}
    credentials = tuple(Credential(name, frozenset({"environment"}), hashlib.sha256(token.encode()).hexdigest())
                        for name, token in tokens.items())
    _farm, envy = atropos_farm(credentials=credentials, token="env-token", credential_pending_bytes=40 << 20)
    host, port = envy.url.removeprefix("http://").rsplit(":", 1)
    held = []
    try:
        for _ in range(2):  # two pushes declaring 16 MiB each, their bodies still on the way
            conn = socket.create_connection((host, int(port)))
            conn.sendall(b"POST /scored_data HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer env-token\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 16777216\r\n\r\n" + b" " * 65536)
            held.append(conn)
        time.sleep(0.5)
        refused = envy.post("/scored_data", content=b" " * (9 << 20), headers={"Content-Type": "application/json"})
        assert refused.status_code == 429, refused.text
        assert "credential 'envy' holds 33554432 bytes" in refused.json()["detail"]
        other = Atropos(envy.url.removeprefix("http://"), "other-env-token")
        assert other.post("/scored_data", group(4)).json() == {"status": "received"}
    finally:
        for conn in held:
            conn.close()
    time.sleep(0.5)
    assert envy.post("/scored_data", group(4)).json() == {"status": "received"}, "given back when they ended"
