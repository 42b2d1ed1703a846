"""Who may join a fleet: a node's credential, its certificate, its name and its host's isolation are all
checked before it gets a single lease, and a refused node says why and exits."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import grpc
import pytest
from farm.v1 import farm_pb2, node_pb2, node_pb2_grpc
from farm_client import FarmClient
from grpc_status import rpc_status

from tests.tlsutil import make_pki

pytestmark = [pytest.mark.sandbox]

NODE, TRAINER, OPERATOR = "node-token-0123456789", "trainer-token-0123456789", "operator-token-0123456789"


def credentials_toml(tmp_path: Path) -> str:
    stanzas = [f'[[credentials]]\nname = "{name}"\nroles = ["{name}"]\n'
               f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
               for name, token in (("node", NODE), ("trainer", TRAINER), ("operator", OPERATOR))]
    path = tmp_path / "farm.toml"
    path.write_text("\n".join(stanzas))
    return str(path)


def token_file(tmp_path: Path, token: str) -> str:
    path = tmp_path / f"{token[:8]}.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


def test_only_a_node_credential_joins_and_the_others_are_told_why(tmp_path: Path, running_farm,  # type: ignore[no-untyped-def]
                                                                  worker_node) -> None:
    farm = running_farm("--workers", "0", "--config", credentials_toml(tmp_path))
    nobody = worker_node(farm.addr, "nobody", wait=False)
    wrong = worker_node(farm.addr, "wrong", "--token-file", token_file(tmp_path, "not-a-token-of-this-farm"),
                        wait=False)
    trainer = worker_node(farm.addr, "trainer", "--token-file", token_file(tmp_path, TRAINER), wait=False)
    for node, why in ((nobody, "(UNAUTHENTICATED)"), (wrong, "(UNAUTHENTICATED)"), (trainer, "(PERMISSION_DENIED)")):
        assert node.exited() == 5, "refused for good: a supervisor must not restart it"
        assert f"refused this node {why}" in node.text(), node.text()[-2000:]
    assert "'trainer' (trainer) may not call Work" in trainer.text()
    joined = worker_node(farm.addr, "joined", "--token-file", token_file(tmp_path, NODE))
    with FarmClient(farm.addr, token=OPERATOR) as client:
        assert [n["name"] for n in client.status()["nodes"]] == ["joined"]
    for text in (farm.log.read_text(), joined.text(), nobody.text(), wrong.text(), trainer.text()):
        assert NODE not in text and TRAINER not in text, "a credential in a log"
    # A node's credential is a node's only: no trajectories, no publishing.
    with FarmClient(farm.addr, token=NODE) as client, pytest.raises(grpc.RpcError) as denied:
        client.trajectories("py-func")
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_second_node_with_a_taken_name_gets_no_work(tmp_path: Path, running_farm, worker_node) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    worker_node(farm.addr, "twin")
    other = worker_node(farm.addr, "twin", wait=False)
    deadline = time.monotonic() + 20
    while "connected already" not in other.text() and time.monotonic() < deadline:
        time.sleep(0.1)
    # Tried again for a while (it may be its own earlier connection the coordinator has not seen end), then
    # refused for good (NAME_TAKEN_S); meanwhile it is not a node of the farm.
    assert "--node-name" in other.text() and "trying again" in other.text()
    with FarmClient(farm.addr) as client:
        assert [(n["name"], n["address"] != "") for n in client.status()["nodes"]] == [("twin", True)]
    assert other.proc.poll() is None


def _hello_reply(addr: str, isolation: list[farm_pb2.IsolationCheck]) -> grpc.aio.AioRpcError | None:
    with grpc.insecure_channel(addr) as channel:
        stub = node_pb2_grpc.NodeServiceStub(channel)
        hello = node_pb2.WorkRequest(id=1, hello=node_pb2.NodeHello(
            name="leaky", owner="leaky:1:ab", capacity=2, version="0", isolation=isolation))
        try:
            replies = stub.Work(iter([hello]), timeout=10)
            for _ in replies:
                pass
        except grpc.RpcError as exc:
            return exc  # type: ignore[return-value]
    return None


def test_a_node_whose_host_cannot_isolate_is_refused_with_its_report(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    refused = _hello_reply(farm.addr, [
        farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="bubblewrap 0.11"),
        farm_pb2.IsolationCheck(name="seccomp", ok=False, detail="no seccomp filter support", fix="a kernel with it")])
    assert refused is not None and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    status = rpc_status.from_call(refused)  # type: ignore[arg-type]
    assert status is not None and "NODE_CANNOT_ISOLATE" in str(status.details)
    assert "seccomp: no seccomp filter support" in refused.details() and "a kernel with it" in refused.details()
    silent = _hello_reply(farm.addr, [])
    assert silent is not None and silent.code() == grpc.StatusCode.FAILED_PRECONDITION, "no report, no work"
    with FarmClient(farm.addr) as client:
        assert client.status()["nodes"] == []


def test_with_a_ca_a_node_joins_with_the_certificate_it_signed(tmp_path: Path, running_farm,  # type: ignore[no-untyped-def]
                                                               worker_node) -> None:
    pki = make_pki(tmp_path / "pki")
    farm = running_farm("--workers", "0", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                        "--tls-ca", str(pki.ca))
    tls = ("--tls-ca", str(pki.ca))
    mine = ("--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key))
    impostor = worker_node(farm.addr, "node-2", *tls, *mine, wait=False)
    assert impostor.exited() == 5, impostor.text()[-2000:]
    assert "certificate names it 'node-1', not 'node-2'" in impostor.text()
    signed = worker_node(farm.addr, "node-1", *tls, *mine)
    stranger = worker_node(farm.addr, "stranger", *tls, "--tls-cert", str(pki.other_client_cert), "--tls-key",
                           str(pki.other_client_key), wait=False)
    # A handshake the coordinator refuses looks like a network fault: the node keeps trying.
    stranger.wait_for("trying again")
    assert stranger.proc.poll() is None
    with FarmClient(farm.addr, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key) as client:
        assert [n["name"] for n in client.status()["nodes"]] == ["node-1"]
        run = client.run("py-func", "reference", 4, group_size=4)
        deadline = time.monotonic() + 60
        while client.get_run(run["id"])["state"] == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.get_run(run["id"])["passed"] == 4
    assert signed.proc.poll() is None


class _OldCoordinator(node_pb2_grpc.NodeServiceServicer):
    """A coordinator whose welcome has no lease time: what a farmd from before the welcome's Durations sends."""

    def Work(self, request_iterator, context):  # type: ignore[no-untyped-def]
        first = next(request_iterator)
        yield node_pb2.WorkResponse(reply_to=first.id, welcome=node_pb2.Welcome(
            name=first.hello.name, version="0.0.9", verifier_key=b"k" * 32))
        for _ in request_iterator:  # whatever it asks afterwards goes unanswered
            pass


def test_a_node_refuses_a_welcome_without_a_lease_time(worker_node) -> None:  # type: ignore[no-untyped-def]
    """A zero lease would run its heartbeats without pause: the node says what is wrong and exits instead."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    node_pb2_grpc.add_NodeServiceServicer_to_server(_OldCoordinator(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        node = worker_node(f"127.0.0.1:{port}", "current", wait=False)
        assert node.exited() == 5, node.text()[-2000:]
        assert "says no lease time: it is older than this node" in node.text(), node.text()[-2000:]
    finally:
        server.stop(0)
