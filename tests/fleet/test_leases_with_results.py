"""A joined node's worker asks for jobs with its results (``ResultsRequest.lease``): a busy node sends one message
per batch of results, not a results message and a lease request. The node here is the real one's parts, in this
process (its link, outbox, remote leases and worker), against a real coordinator; every rollout lands once."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from farm.v1 import farm_pb2, node_pb2
from farm_client import FarmClient

from farmd.envs import VerifyContext
from farmd.fleet.link import Link
from farmd.fleet.outbox import Outbox
from farmd.fleet.policy_cache import PolicyCache
from farmd.fleet.remote import RemoteLeases
from farmd.rollout.worker import Worker
from farmd.verifier import VerifierKey

NAME = "piggy"
OWNER = f"{NAME}:1:cd"
SLOTS = 4
ROLLOUTS = 32


async def no_policy(sha: str) -> bytes:
    raise AssertionError(f"no job here runs a policy ({sha})")


async def test_a_node_s_worker_leases_with_its_results_and_every_rollout_lands_once(  # type: ignore[no-untyped-def]
        running_farm, tmp_path: Path) -> None:
    farm = running_farm("--workers", "0")
    with FarmClient(farm.addr) as client:
        client.run("arith", "reference", rollouts=ROLLOUTS, group_size=2)
    outbox = Outbox(tmp_path / "outbox")
    await outbox.open()
    remote: RemoteLeases | None = None

    async def connected(welcome: node_pb2.Welcome, first: bool) -> None:
        assert remote is not None
        await remote.on_connect(welcome, first)

    link = Link(farm.addr, lambda: node_pb2.NodeHello(
        name=NAME, owner=OWNER, capacity=SLOTS, version="0",
        isolation=[farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="arith judges on the host")]),
        on_connect=connected)
    remote = RemoteLeases(link, outbox, PolicyCache(tmp_path / "policies", 1 << 20, no_policy))
    running = asyncio.get_running_loop().create_task(link.run())
    worker: Worker | None = None
    try:
        await asyncio.wait_for(link.welcomed.wait(), 30)
        assert link.welcome is not None
        # arith's verifier runs on the host: no box is needed for this node's rollouts.
        ctx = VerifyContext(sandbox=None, key=VerifierKey(link.welcome.verifier_key))  # type: ignore[arg-type]
        worker = Worker(remote, ctx, slots=SLOTS, lease_s=30.0, node=NAME, owner=OWNER)
        await worker.start()

        def stored() -> Counter[int]:
            with FarmClient(farm.addr) as client:
                return Counter(t.id for t in client.trajectories(limit=200))

        for _ in range(300):
            if sum((await asyncio.to_thread(stored)).values()) >= ROLLOUTS:
                break
            await asyncio.sleep(0.1)
    finally:
        if worker is not None:
            await worker.stop(5.0)
        await link.close()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    landed = await asyncio.to_thread(stored)
    assert len(landed) == ROLLOUTS and set(landed.values()) == {1}, landed
    # Its first lease was a lease of its own; after that, its results asked for the slots they freed.
    assert remote.counters["leased_with_results"] >= ROLLOUTS - 2 * SLOTS, remote.counters
    assert remote.counters["stored"] >= ROLLOUTS  # and any canary jobs it was sent, told stored like any result
