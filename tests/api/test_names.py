"""A consumer's cursor and a node's name belong to the credential that made them, against a real farmd: real
gRPC calls (and the console's HTTP ones) under several credentials, a restart on the same data, an operator's
reassignment through farmctl, and a farm without credentials that binds nothing."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc, node_pb2, node_pb2_grpc
from farm_client import FarmClient
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from farmd.config import Config, Credential
from farmd.scheduler.config import SchedulerConfig
from tests.api.conftest import InProcessFarm
from tests.api.test_atropos import Atropos, group
from tests.conftest import farmctl
from tests.tlsutil import make_pki

ROLES = {"alice": ("trainer",), "bob": ("trainer",), "ops": ("operator", "trainer"), "envy": ("environment",),
         "nodes-a": ("node",), "nodes-b": ("node",)}
"""Two trainers, an operator that also trains (as farm_trainer's credential is advised to), an Atropos
environment (it makes trajectories to stream), and two node credentials."""


def token(name: str) -> str:
    return f"{name}-token-0123456789"


CREDENTIALS = tuple(Credential(name, frozenset(roles), hashlib.sha256(token(name).encode()).hexdigest())
                    for name, roles in ROLES.items())


def auth(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token(name)}"),)


def refusal(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, str]:
    """The code, ErrorInfo reason and message a call is refused with."""
    with pytest.raises(grpc.RpcError) as raised:
        call()
    status = rpc_status.from_call(raised.value)
    assert status is not None, "a refusal comes with google.rpc details"
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    message = raised.value.details() or ""
    if info.reason == "NAME_HELD":  # what the refusal says after whose the name is: how to get one
        message, how, _ = message.partition(": a name is its maker's")
        assert how, message
    return raised.value.code(), info.reason, message


def held(kind: str, name: str, holder: str, caller: str) -> tuple[grpc.StatusCode, str, str]:
    return (grpc.StatusCode.PERMISSION_DENIED, "NAME_HELD",
            f"{kind} {name!r} belongs to credential {holder!r}, not to credential {caller!r}")


class Farms:
    """In-process farms by data dir: started, stopped, started again on the same data."""

    def __init__(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self._running: list[InProcessFarm] = []

    def start(self, data: str = "farm", *, credentials: tuple[Credential, ...] = CREDENTIALS, **config: Any
              ) -> InProcessFarm:
        farm = InProcessFarm(Config(data_dir=self._tmp / data, listen="127.0.0.1:0", workers=0,
                                    credentials=credentials, **config))
        self._running.append(farm)
        farm.start()
        return farm

    def stop(self, farm: InProcessFarm) -> None:
        self._running.remove(farm)
        farm.stop()

    def stop_all(self) -> None:
        for farm in self._running:
            farm.stop()


@pytest.fixture
def farms(tmp_path: Path) -> Iterator[Farms]:
    made = Farms(tmp_path)
    yield made
    made.stop_all()


def atropos_addr(farm: InProcessFarm) -> str:
    return str(json.loads((farm.config.data_dir / "farmd.json").read_text())["atropos"])


def pushed_trajectories(farm: InProcessFarm, groups: int) -> None:
    """Stored farm trajectories, made the quickest real way: an Atropos environment pushes scored groups."""
    api = Atropos(atropos_addr(farm), token("envy"))
    for i in range(groups):
        assert api.post("/scored_data", group(2, first=10 * i)).json() == {"status": "received"}


def test_a_second_trainer_can_neither_read_nor_ack_anothers_cursor(farms: Farms) -> None:
    farm = farms.start(atropos_listen="127.0.0.1:0", http_listen="127.0.0.1:0")
    pushed_trajectories(farm, 3)  # six trajectories, seq 1..6
    with FarmClient(farm.addr, token=token("alice")) as alice, FarmClient(farm.addr, token=token("bob")) as bob, \
            FarmClient(farm.addr, token=token("ops")) as ops:
        first = next(alice.batches("grpo", 2))
        alice.ack(first)
        assert alice.ack("grpo", 0) == 2, "its own cursor, acked again"
        # bob would ack alice's cursor forward (she would never get 3..6) or read her batches: both refused.
        assert refusal(lambda: bob.ack("grpo", 6)) == held("consumer", "grpo", "alice", "bob")
        assert refusal(lambda: next(bob.batches("grpo", 2))) == held("consumer", "grpo", "alice", "bob")
        # The operator's credential too: an operator may reassign a name, not act under it.
        assert refusal(lambda: ops.ack("grpo", 6)) == held("consumer", "grpo", "alice", "ops")
        # The same holds for the whole-group cursor of the name, and for a name first made by an ack.
        assert refusal(lambda: bob.ack("grpo", 0, whole_groups=True))[1] == "NAME_HELD"
        assert bob.ack("evals", 0) == 0
        assert refusal(lambda: next(alice.batches("evals", 2))) == held("consumer", "evals", "bob", "alice")
        rest = next(alice.batches("grpo", 10))
        assert [t.seq for t in rest.trajectories] == [3, 4, 5, 6], "nothing was skipped for her"
        status = {c["name"]: c for c in ops.status()["consumers"]}
        assert status["grpo"]["cursor"] == 2

    # The console's Ack is the same servicer under the caller's credential: refused the same way.
    def console_ack(who: str) -> httpx.Response:
        return httpx.post(f"http://{farm.console}/api/v1/FarmService/Ack", json={"consumer": "grpo", "up_to": 6},
                          headers={"Authorization": f"Bearer {token(who)}"})
    denied = console_ack("bob")
    assert denied.status_code == 403 and denied.json()["reason"] == "NAME_HELD", denied.text
    assert "belongs to credential 'alice'" in denied.json()["message"]
    assert console_ack("alice").json() == {"cursor": "6"}


def test_a_policy_line_is_its_first_publishers(farms: Farms) -> None:
    farm = farms.start()
    with FarmClient(farm.addr, token=token("alice")) as alice, FarmClient(farm.addr, token=token("bob")) as bob:
        mine = alice.publish_policy(b"alice's weights", name="tiny")
        # bob's weights on alice's line would be what every torch:tiny job runs, and so what her stream learns.
        assert refusal(lambda: bob.publish_policy(b"bob's weights", name="tiny")) == \
            held("policy line", "tiny", "alice", "bob")
        assert refusal(lambda: bob.publish_policy(b"alice's weights", name="tiny"))[1] == "NAME_HELD", \
            "nor make an old version of it current again"
        assert alice.get_policy(name="tiny")[0] == mine["version"]
        assert bob.publish_policy(b"bob's weights", name="small")["name"] == "small"
        assert alice.publish_policy(b"alice's next", name="tiny")["version"] > mine["version"]
        assert bob.get_policy(name="tiny")[1] == b"alice's next", "reading a line is anyone's with the role"


def test_names_survive_a_restart_and_change_hands_only_by_an_operator(farms: Farms) -> None:
    farm = farms.start()
    with FarmClient(farm.addr, token=token("alice")) as alice:
        alice.ack("grpo", 0)
    data = farm.config.data_dir
    farms.stop(farm)
    farm = farms.start(data.name)
    with FarmClient(farm.addr, token=token("bob")) as bob:
        assert refusal(lambda: bob.ack("grpo", 0)) == held("consumer", "grpo", "alice", "bob"), \
            "a restart hands no name to whoever speaks first"

    def ctl(who: str, *args: str, check: bool = True) -> Any:
        proc = farmctl("--addr", farm.addr, "--token", token(who), "names", *args, "--json", check=check)
        return json.loads(proc.stdout)

    shown = farmctl("--addr", farm.addr, "--token", token("ops"), "names", "list").stdout.decode()
    assert "consumer" in shown and "grpo" in shown and "alice" in shown and "its first use" in shown
    listed = ctl("ops", "list")
    assert [(n["kind"], n["name"], n["credential"], n["assigned_by"]) for n in listed] == \
        [("consumer", "grpo", "alice", "")]
    assert ctl("alice", "list", check=False)["error"]["code"] == "PERMISSION_DENIED", "an operator's call"
    assert ctl("alice", "reassign", "consumer", "grpo", "alice", check=False)["error"]["code"] == "PERMISSION_DENIED"
    given = ctl("ops", "reassign", "consumer", "grpo", "bob")
    said = farmctl("--addr", farm.addr, "--token", token("ops"), "names", "reassign", "consumer", "grpo", "bob")
    assert said.stdout.decode().strip() == "consumer grpo now belongs to credential bob (it was bob)"
    assert (given["credential"], given["previous"], given["assigned_by"]) == ("bob", "alice", "ops")
    with FarmClient(farm.addr, token=token("bob")) as bob, FarmClient(farm.addr, token=token("alice")) as alice:
        assert bob.ack("grpo", 0) == 0
        assert refusal(lambda: alice.ack("grpo", 0)) == held("consumer", "grpo", "bob", "alice")
    unknown = ctl("ops", "reassign", "consumer", "grpo", "mallory", check=False)["error"]
    assert unknown["code"] == "NOT_FOUND" and "no credential 'mallory'" in unknown["message"]
    assert ctl("ops", "reassign", "node", "not a name", "nodes-a", check=False)["error"]["code"] == "INVALID_ARGUMENT"
    # Given ahead, before anyone used it: the first node to join with it must be that credential's.
    ctl("ops", "reassign", "node", "gpu-9", "nodes-b")
    assert [n["credential"] for n in ctl("ops", "list", "--kind", "node")] == ["nodes-b"]
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        paged = stub.ListNames(farm_pb2.ListNamesRequest(page_size=1), metadata=auth("ops"), timeout=10)
        assert [n.name for n in paged.names] == ["grpo"] and paged.next_page_token
        rest = stub.ListNames(farm_pb2.ListNamesRequest(page_size=1, page_token=paged.next_page_token),
                              metadata=auth("ops"), timeout=10)
        assert [n.name for n in rest.names] == ["gpu-9"] and not rest.next_page_token
        bad = farm_pb2.ListNamesRequest(kind="cursors")
        assert refusal(lambda: stub.ListNames(bad, metadata=auth("ops"), timeout=10))[0] == \
            grpc.StatusCode.INVALID_ARGUMENT


def test_a_farm_without_credentials_binds_no_name(farms: Farms) -> None:
    farm = farms.start(credentials=())
    with FarmClient(farm.addr) as one, FarmClient(farm.addr) as other:
        assert one.ack("grpo", 0) == 0
        assert other.ack("grpo", 0) == 0, "no credential to bind a name to: as before"
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        assert list(stub.ListNames(farm_pb2.ListNamesRequest(), timeout=10).names) == []
        request = farm_pb2.ReassignNameRequest(kind="consumer", name="grpo", credential="alice")
        assert refusal(lambda: stub.ReassignName(request, timeout=10))[0] == grpc.StatusCode.FAILED_PRECONDITION


# -- node names -------------------------------------------------------------------------------------


def hello(name: str, pid: int = 1) -> node_pb2.WorkRequest:
    return node_pb2.WorkRequest(id=1, hello=node_pb2.NodeHello(
        name=name, owner=f"{name}:{pid}:ab", capacity=2, version="0",
        isolation=[farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="bubblewrap 0.11")]))


class Node:
    """A node's Work stream, spoken by hand: requests sent one at a time, each reply read."""

    def __init__(self, addr: str, credential: str, name: str, pid: int = 1,
                 tls: grpc.ChannelCredentials | None = None) -> None:
        self._channel = grpc.secure_channel(addr, tls) if tls is not None else grpc.insecure_channel(addr)
        self._outbox: list[node_pb2.WorkRequest | None] = [hello(name, pid)]
        self._sent = 1
        self._stream = node_pb2_grpc.NodeServiceStub(self._channel).Work(self._requests(), metadata=auth(credential),
                                                                          timeout=30)
        self.welcome = next(self._stream)

    def _requests(self) -> Iterator[node_pb2.WorkRequest]:
        while True:
            while not self._outbox:
                time.sleep(0.01)
            request = self._outbox.pop(0)
            if request is None:
                return
            yield request

    def ask(self, **kind: Any) -> node_pb2.WorkResponse:
        self._sent += 1
        self._outbox.append(node_pb2.WorkRequest(id=self._sent, **kind))
        return next(self._stream)

    def close(self) -> None:
        self._outbox.append(None)
        for _ in self._stream:
            pass
        self._channel.close()


def join_refusal(addr: str, credential: str, name: str, tls: grpc.ChannelCredentials | None = None
                 ) -> tuple[grpc.StatusCode, str, str]:
    def join() -> None:
        Node(addr, credential, name, pid=2, tls=tls)
    return refusal(join)


def test_a_node_name_is_its_credentials_connected_disconnected_lost_or_restarted(farms: Farms) -> None:
    farm = farms.start(scheduler=SchedulerConfig(node_lost_s=1.5))
    with FarmClient(farm.addr, token=token("ops")) as ops:
        ops.run("rg:chain_sum", "reference", 2)
        node = Node(farm.addr, "nodes-a", "gpu-1")
        assert node.welcome.welcome.name == "gpu-1"
        leased = node.ask(lease=node_pb2.LeaseRequest(n=2)).leased.jobs
        assert len(leased) == 2
        # Connected: the other credential is told whose the name is, not that it is taken for now.
        assert join_refusal(farm.addr, "nodes-b", "gpu-1") == held("node name", "gpu-1", "nodes-a", "nodes-b")
        node.close()
        # Disconnected, its leases still its own: a hello under its name, which would requeue them by
        # ``recover``, is refused before it is a node at all.
        assert join_refusal(farm.addr, "nodes-b", "gpu-1")[1] == "NAME_HELD"
        assert ops.status()["queue"]["leased"] == 2, "the holder's leases stay where they are"
        deadline = time.monotonic() + 15
        while [n["state"] for n in ops.status()["nodes"]] != ["lost"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [n["state"] for n in ops.status()["nodes"]] == ["lost"]
        assert join_refusal(farm.addr, "nodes-b", "gpu-1")[1] == "NAME_HELD", "lost too"
        # The holder itself comes back under its name, and other names are free to the other credential.
        back = Node(farm.addr, "nodes-a", "gpu-1", pid=3)
        assert back.ask(recover=node_pb2.RecoverRequest()).HasField("count")
        back.close()
        Node(farm.addr, "nodes-b", "gpu-2").close()
    data = farm.config.data_dir
    farms.stop(farm)
    farm = farms.start(data.name)
    assert join_refusal(farm.addr, "nodes-b", "gpu-1") == held("node name", "gpu-1", "nodes-a", "nodes-b")
    assert join_refusal(farm.addr, "nodes-a", "gpu-2") == held("node name", "gpu-2", "nodes-b", "nodes-a")


def test_with_a_ca_the_certificates_name_is_checked_first_and_the_credential_after(farms: Farms,
                                                                                     tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    farm = farms.start(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_ca=pki.ca)
    tls = grpc.ssl_channel_credentials(pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes())
    addr = farm.addr.replace("127.0.0.1", "localhost")
    why = join_refusal(addr, "nodes-a", "node-2", tls)
    assert why[:2] == (grpc.StatusCode.PERMISSION_DENIED, "NODE_NAME_NOT_CERTIFIED"), "the certificate's name, as before"
    Node(addr, "nodes-a", "node-1", tls=tls).close()
    # The same certificate under another node credential: the name is the first credential's.
    assert join_refusal(addr, "nodes-b", "node-1", tls) == held("node name", "node-1", "nodes-a", "nodes-b")
