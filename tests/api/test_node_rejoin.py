"""A node that joins again says which jobs it holds; leases of its that it never received (their reply lost with the
connection, or with a coordinator that died) go back to the queue before its welcome, not when they run out. The
node is a bare gRPC client on a real farmd, so a lost reply is one it chooses not to have read."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import grpc
import pytest
from farm.v1 import farm_pb2, node_pb2
from farm_client import FarmClient
from farm_client.convert import duration

from farmd.records import MAX_HELD_JOBS
from tests.api.test_node_results import NAME, OWNER, BareNode
from tests.conftest import RunningFarm


def _hello(held: Iterable[int] | None) -> node_pb2.NodeHello:
    hello = node_pb2.NodeHello(name=NAME, owner=OWNER, capacity=64, version="0",
                               isolation=[farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="bubblewrap")])
    if held is not None:
        hello.held.SetInParent()
        hello.held.job_ids.extend(held)
    return hello


def _join(addr: str, held: Iterable[int] | None) -> BareNode:
    """A new connection under the same owner, once the coordinator has seen the last one go."""
    deadline = time.monotonic() + 30
    while True:
        node = BareNode(addr)
        try:
            assert node.ask(hello=_hello(held)).welcome.name == NAME
            return node
        except grpc.RpcError as exc:
            node.close()
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _lease(node: BareNode, groups: set[int]) -> list[node_pb2.LeasedJob]:
    """The run's jobs a lease gives (of its ``groups``: the coordinator's canaries for the node, which look like
    any job, left out)."""
    reply = node.ask(lease=node_pb2.LeaseRequest(n=64, wait=duration(0.5)))
    return sorted((j for j in reply.leased.jobs if j.group_id in groups), key=lambda j: j.id)


def test_a_node_joining_again_gets_back_at_once_the_leases_it_never_received(
        running_farm: Callable[..., RunningFarm]) -> None:
    farm = running_farm("--workers", "0")
    with FarmClient(farm.addr) as client:
        groups = set(client.run("arith", "reference", rollouts=4, group_size=1)["group_ids"])
    first = _join(farm.addr, None)
    try:
        jobs = _lease(first, groups)
    finally:
        first.close()
    assert len(jobs) == 4 and all(j.attempts == 1 for j in jobs)

    # It holds the first; the replies that leased the other three never reached it.
    again = _join(farm.addr, [jobs[0].id])
    try:
        back = _lease(again, groups)
    finally:
        again.close()
    assert [j.id for j in back] == [j.id for j in jobs[1:]]
    assert all(j.attempts == 1 for j in back), "a lease the node never received is no attempt"
    assert "3 rollouts leased to it in replies it never received went back to the queue" in farm.log.read_text()

    # A hello that names nothing it holds (a first one, or a node from before ``held``) gives nothing back: the
    # four stay leased until they run out, as before.
    old = _join(farm.addr, None)
    try:
        assert _lease(old, groups) == []
    finally:
        old.close()


def test_a_hello_naming_more_jobs_than_a_node_can_hold_is_refused(
        running_farm: Callable[..., RunningFarm]) -> None:
    farm = running_farm("--workers", "0")
    node = BareNode(farm.addr)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            node.ask(hello=_hello(range(1, MAX_HELD_JOBS + 2)))
    finally:
        node.close()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_HELD_JOBS} jobs held" in str(refused.value.details())
