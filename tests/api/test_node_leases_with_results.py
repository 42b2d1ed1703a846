"""A node may ask for jobs with its results (``ResultsRequest.lease``): the reply stores them first, then leases for
the slots that frees, never more than the node's free capacity and never waiting for work. A node that does not
ask (an older one) is answered as before: no jobs in a results reply, and its own lease requests served."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from farm.v1 import farm_pb2, node_pb2, trajectory_pb2
from farm_client import FarmClient
from farm_client.convert import duration, to_message

from farmd.agents import make_agent
from farmd.envs import VerifyContext, get
from farmd.records import Job, JobState
from farmd.rollout.runner import run_rollout
from farmd.verifier import VerifierKey
from tests.api.test_node_results import BareNode

NAME = "honest"
OWNER = f"{NAME}:1:ab"
KEY: list[bytes] = []


def hello(node: BareNode, capacity: int) -> None:
    welcome = node.ask(hello=node_pb2.NodeHello(
        name=NAME, owner=OWNER, capacity=capacity, version="0",
        isolation=[farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="bubblewrap")])).welcome
    KEY[:] = [welcome.verifier_key]


def record(job: node_pb2.LeasedJob) -> bytes:
    """What an honest node reports for ``job`` (its checks and canaries agree): farm's own runner's record."""
    ctx = VerifyContext(sandbox=None, key=VerifierKey(KEY[0]))  # type: ignore[arg-type]  # arith judges on the host
    leased = Job(id=job.id, group_id=job.group_id, env=job.env, seed=job.seed, difficulty=job.difficulty,
                 agent=job.agent, state=JobState.LEASED, attempts=job.attempts, policy_version=job.policy_version)
    made = asyncio.run(run_rollout(leased, get(job.env), make_agent(job.agent, envs=get, ctx=ctx), ctx, NAME))
    return to_message(dataclasses.replace(made, node=""), trajectory_pb2.Trajectory()).SerializeToString()


def results(jobs: list[node_pb2.LeasedJob], **lease: int) -> node_pb2.ResultsRequest:
    parts = [node_pb2.ResultPart(job_id=j.id, owner=OWNER, data=record(j), last=True) for j in jobs]
    if not lease:
        return node_pb2.ResultsRequest(parts=parts)
    return node_pb2.ResultsRequest(parts=parts, lease=node_pb2.LeaseRequest(wait=duration(5.0), **lease))


def test_jobs_asked_with_results_come_with_the_reply_within_the_free_slots(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    with FarmClient(farm.addr) as client:
        client.run("arith", "reference", rollouts=12, group_size=2)
    node = BareNode(farm.addr)
    try:
        hello(node, capacity=4)
        held = list(node.ask(lease=node_pb2.LeaseRequest(n=64, wait=duration(1.0))).leased.jobs)
        assert len(held) == 4, "capped at its capacity"
        # Two results free two slots: asking for ten gets two, after the two are stored.
        reply = node.ask(results=results(held[:2], n=10)).results
        assert sorted(reply.stored) == sorted(j.id for j in held[:2])
        assert len(reply.leased.jobs) == 2 and not {j.id for j in reply.leased.jobs} & {j.id for j in held}
        held = held[2:] + list(reply.leased.jobs)
        # No more than it asks for, and none past its capacity when nothing is freed.
        reply = node.ask(results=results(held[:1], n=1)).results
        assert len(reply.stored) == 1 and len(reply.leased.jobs) == 1
        held = held[1:] + list(reply.leased.jobs)
        assert not node.ask(results=results([], n=8)).results.leased.jobs, "every slot is busy"
        # With nothing queued, the reply is not held up waiting for work (the ask said 5 s).
        while held:
            reply = node.ask(results=results(held[:1], n=4)).results
            held = held[1:] + list(reply.leased.jobs)
        t0 = time.monotonic()
        reply = node.ask(results=results([], n=4)).results
        assert not reply.leased.jobs and time.monotonic() - t0 < 2.5
    finally:
        node.close()
    with FarmClient(farm.addr) as client:
        assert len(client.trajectories(limit=100)) == 12, "every job ran once: none leased twice"


def test_a_node_that_asks_nothing_with_its_results_leases_as_before(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    with FarmClient(farm.addr) as client:
        client.run("arith", "reference", rollouts=4, group_size=2)
    node = BareNode(farm.addr)
    try:
        hello(node, capacity=2)
        first = list(node.ask(lease=node_pb2.LeaseRequest(n=2, wait=duration(1.0))).leased.jobs)
        reply = node.ask(results=results(first)).results
        assert sorted(reply.stored) == sorted(j.id for j in first) and not reply.HasField("leased")
        second = list(node.ask(lease=node_pb2.LeaseRequest(n=2, wait=duration(1.0))).leased.jobs)
        assert len(second) == 2
        assert sorted(node.ask(results=results(second)).results.stored) == sorted(j.id for j in second)
    finally:
        node.close()
