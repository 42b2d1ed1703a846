"""Roles and named credentials against a real farmd: who may call what, what a refusal says, and
that no token (nor its hash) ever shows in farmd's log or farmctl's output."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc, intake_pb2, node_pb2
from farm_client import FarmClient
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from farmd.api.auth import METHOD_ROLES, RoleInterceptor, roles_for_method
from farmd.config import Credential

OPS, TRAIN, NODE, LEGACY = "ops-token-1", "train-token-2", "node-token-3", "legacy-token-4"
TOKENS = (OPS, TRAIN, NODE, LEGACY)
FARM = "/farm.v1.FarmService/"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def roles_toml(tmp_path: Path) -> Path:
    """operators and trainers by hash, nodes by a token file."""
    node_file = tmp_path / "nodes.token"
    node_file.write_text(NODE + "\n")
    node_file.chmod(0o600)
    config = tmp_path / "farm.toml"
    config.write_text(f"""
[[credentials]]
name = "operators"
roles = ["operator"]
token_sha256 = "{sha(OPS)}"

[[credentials]]
name = "trainers"
roles = ["trainer"]
token_sha256 = "{sha(TRAIN).upper()}"

[[credentials]]
name = "nodes"
roles = ["node"]
token_file = "{node_file}"
""")
    return config


def code(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, str]:
    """The code, ErrorInfo reason and message of a refusal (read as any grpc client reads them)."""
    with pytest.raises(grpc.RpcError) as raised:
        call()
    status = rpc_status.from_call(raised.value)
    assert status is not None, "a refusal comes with google.rpc details"
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return raised.value.code(), info.reason, raised.value.details() or ""


def test_the_table_names_every_method_farm_serves() -> None:
    served = {f"/{s.full_name}/{m.name}" for proto in (farm_pb2.DESCRIPTOR, node_pb2.DESCRIPTOR, intake_pb2.DESCRIPTOR)
              for s in proto.services_by_name.values() for m in s.methods}
    assert served == set(METHOD_ROLES), "give every RPC its roles in farmd/api/auth.py"
    assert roles_for_method(f"{FARM}CreateRun") == {"operator"}
    assert roles_for_method(f"{FARM}GetPolicy") == {"operator", "trainer", "node"}
    assert roles_for_method("/farm.v1.NodeService/Work") == {"node"}
    assert roles_for_method("/farm.v1.IntakeService/ReviewSubmission") == {"operator", "reviewer"}
    assert roles_for_method("/farm.v1.IntakeService/Submit") == {"operator", "contributor"}
    assert roles_for_method("/grpc.health.v1.Health/Check") is None
    assert roles_for_method(f"{FARM}NoSuchMethod") is None, "not farm's: UNIMPLEMENTED, for those let in"


def test_a_credential_shows_no_hash_and_the_interceptor_finds_callers() -> None:
    nodes = Credential.from_token("nodes", frozenset({"node"}), NODE)
    assert sha(NODE) not in repr(nodes) and NODE not in repr(nodes) and "nodes" in repr(nodes)
    interceptor = RoleInterceptor([nodes])
    assert interceptor.caller(auth(NODE)) == nodes
    assert interceptor.caller((("authorization", f"bearer {NODE}"),)) == nodes
    assert interceptor.caller(auth("other")) is None and interceptor.caller(()) is None


def test_roles_decide_who_may_call_what(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--config", str(roles_toml(tmp_path)), "--log-level", "debug")
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        status = farm_pb2.GetStatusRequest()
        for metadata in [(), auth("wrong"), (("authorization", OPS),)]:  # the last: no Bearer scheme
            why = refused(lambda m=metadata: stub.GetStatus(status, metadata=m, timeout=10))
            assert why[:2] == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
            assert "--token-file" in why[2] and "FARM_TOKEN" in why[2]

        run = farm_pb2.CreateRunRequest(env="rg:chain_sum", agent="reference", rollouts=2)
        assert refused(lambda: stub.CreateRun(run, metadata=auth(TRAIN), timeout=10)) == (
            grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED",
            "credential 'trainers' (trainer) may not call CreateRun: it needs operator")
        for denied in ("CancelRun", "Rescore"):
            assert code(lambda d=denied: channel.unary_unary(FARM + d)(b"", metadata=auth(TRAIN), timeout=10)) \
                == grpc.StatusCode.PERMISSION_DENIED
        assert stub.GetStatus(status, metadata=auth(TRAIN), timeout=10).workers == 0
        stream = farm_pb2.StreamTrajectoriesRequest(consumer="t", batch_size=1)
        # Open and waiting for trajectories that never come: past authentication.
        assert code(lambda: list(stub.StreamTrajectories(stream, metadata=auth(TRAIN), timeout=1))) == \
            grpc.StatusCode.DEADLINE_EXCEEDED

        listing = farm_pb2.ListTrajectoriesRequest()
        why = refused(lambda: stub.ListTrajectories(listing, metadata=auth(NODE), timeout=10))
        assert why == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED",
                       "credential 'nodes' (node) may not call ListTrajectories: it needs operator or trainer")
        publish = iter([farm_pb2.PublishPolicyRequest(data=b"x")])
        assert refused(lambda: stub.PublishPolicy(publish, metadata=auth(NODE), timeout=10))[0] == \
            grpc.StatusCode.PERMISSION_DENIED
        policy = farm_pb2.GetPolicyRequest(sha256="0" * 64)
        assert code(lambda: list(stub.GetPolicy(policy, metadata=auth(NODE), timeout=10))) == grpc.StatusCode.NOT_FOUND

        work = channel.stream_stream("/farm.v1.NodeService/Work")
        for token, name in ((TRAIN, "trainers"), (OPS, "operators")):
            why = refused(lambda t=token: list(work(iter([b""]), metadata=auth(t), timeout=10)))
            assert why[0] == grpc.StatusCode.PERMISSION_DENIED and f"credential {name!r}" in why[2], why
            assert "it needs node" in why[2]

        created = stub.CreateRun(run, metadata=auth(OPS), timeout=10).run
        assert created.jobs == 2
        assert stub.CancelRun(farm_pb2.CancelRunRequest(run_id=created.id), metadata=auth(OPS),
                              timeout=10).run.state == farm_pb2.RUN_STATE_CANCELLED

        nothing = channel.unary_unary(FARM + "NoSuchMethod")
        assert refused(lambda: nothing(b"", metadata=auth(NODE), timeout=10))[:2] == (
            grpc.StatusCode.UNIMPLEMENTED, "UNIMPLEMENTED")
        assert refused(lambda: nothing(b"", timeout=10))[0] == grpc.StatusCode.UNAUTHENTICATED

    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    token_file = tmp_path / "ops.token"
    token_file.write_text(OPS + "\n")
    shown = farm.farmctl("--token-file", str(token_file), "status", "--json", env=env)
    assert json.loads(shown.stdout)["workers"] == 0
    shown_env = farm.farmctl("status", "--json", env={**env, "FARM_TOKEN_FILE": str(token_file)})
    assert json.loads(shown_env.stdout)["workers"] == 0
    denied = farm.farmctl("--token", TRAIN, "run", "--env", "rg:chain_sum", "--agent", "reference",
                          "--rollouts", "1", "--json", check=False, env=env)
    assert json.loads(denied.stdout)["error"]["code"] == "PERMISSION_DENIED"
    farm.stop()
    log = farm.log.read_text()
    assert "credential 'trainers' (trainer) may not call CreateRun" in log, "a refusal is logged by name"
    for secret in (*TOKENS, *(sha(t) for t in TOKENS), *(sha(t).upper() for t in TOKENS)):
        for where, text in (("farmd's log", log), ("farmctl status", (shown.stdout + shown.stderr).decode())):
            assert secret not in text, f"a token or its hash is in {where}"


def test_the_legacy_token_holds_every_role(running_farm, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    farm = running_farm("--workers", "0", "--token", LEGACY)
    for name in ("FARM_TOKEN_FILE", "FARM_TLS_CA", "FARM_TLS_CERT", "FARM_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FARM_TOKEN", LEGACY)
    with FarmClient(farm.addr) as client:  # the token from FARM_TOKEN
        assert client.status()["workers"] == 0
        run = client.run("rg:chain_sum", "reference", 2)
        assert client.cancel_run(run["id"])["state"] == "cancelled"
        assert client.trajectories() == []
        assert client.publish_policy(b"weights", name="tiny")["version"] == 1
        assert client.get_policy(name="tiny")[1] == b"weights"
    monkeypatch.delenv("FARM_TOKEN")
    token_file = tmp_path / "legacy.token"
    token_file.write_text(LEGACY + "\n")
    monkeypatch.setenv("FARM_TOKEN_FILE", str(token_file))
    with FarmClient(farm.addr) as client:
        assert client.status()["workers"] == 0
    with FarmClient(farm.addr, token="") as client, pytest.raises(grpc.RpcError) as raised:
        client.status()  # an empty token is no token, whatever the environment holds
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(farm.addr) as channel:  # a node may join on it too: past the role check
        work = channel.stream_stream("/farm.v1.NodeService/Work")
        assert code(lambda: list(work(iter([]), metadata=auth(LEGACY), timeout=5))) not in (
            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    farm.stop()
    assert LEGACY not in farm.log.read_text() and sha(LEGACY) not in farm.log.read_text()
