"""Hundreds of worker nodes in one process, speaking ``farm.v1.NodeService.Work`` to one coordinator: what
``bench.fleet_sim_bench`` measures the coordinator with.

    .venv/bin/python -m bench.sim_nodes --addr HOST:PORT --nodes 200 --slots 32 --rollout-s 5 --seconds 60

Each simulated node is what ``farmd serve --join`` is on the wire, and nothing else: its own channel and
``Work`` stream through the node's own ``farmd.fleet.link.Link`` (hello, welcome, requests by id), and a
worker with the real one's cadence (``farmd.rollout.worker``: a lease for its free slots whenever one frees,
held at the coordinator up to ``LEASE_WAIT_S`` when nothing is queued; finished results sent every
``_FLUSH_S``, or at once past ``_FLUSH_MAX``, one message in flight at a time; a heartbeat naming its
rollouts every ``heartbeat_s``; its leases released when it stops). A rollout is a wait instead of a model and a
box: ``rollout_s`` on average, each drawn uniformly within ``spread`` of it (a model's rollouts differ in length;
waits of one length would keep a node's slots in step, every slot freed at once and leased in one request, which no
real fleet does).

What it reports is honest: the record farmd's own runner makes for the job's agent on its task (run here
once per task and agent, then copied for every job of it with that job's identity and times). With a
scripted agent whose answer is a function of the task (``reference`` on ``arith``), every verdict is the
one the coordinator's re-verification and canaries compute, so they agree and no node is quarantined.

It prints one JSON object when it ends: what the nodes leased, reported, and were told (stored, refused,
errors), how long the coordinator took to answer leases and results, and this process's own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Awaitable
from typing import Any

import uvloop
from farm.v1 import farm_pb2, node_pb2, trajectory_pb2
from farm_client.convert import duration, seconds, to_message

from farmd.agents import make_agent
from farmd.envs import VerifyContext, get
from farmd.fleet.link import Link, LinkDown, RequestFailed
from farmd.fleet.remote import LEASE_WAIT_S
from farmd.records import Job, JobState
from farmd.rollout.runner import run_rollout
from farmd.rollout.worker import _FLUSH_MAX, _FLUSH_S, _IDLE_MAX_S, _IDLE_MIN_S
from farmd.verifier import VerifierKey

ISOLATED = [farm_pb2.IsolationCheck(name="bwrap", ok=True, detail="simulated node: runs no untrusted code")]
_LATENCIES_KEPT = 20_000


class Records:
    """Honest records, by the farm's own runner: one rollout per (environment, seed, level, agent), on this
    process's loop; every job of that task gets a copy as its own (id, group, policy version, times)."""

    def __init__(self) -> None:
        self._ctx: VerifyContext | None = None
        self._made: dict[tuple[str, int, int, str], asyncio.Future[trajectory_pb2.Trajectory]] = {}
        self.rollouts = 0

    def keyed(self, material: bytes) -> None:
        # No sandbox: the environments a simulated node runs judge on the host (``arith``); one that needs a box
        # fails here, loudly, as an infrastructure failure of the job.
        self._ctx = VerifyContext(sandbox=None, key=VerifierKey(material))  # type: ignore[arg-type]

    def template(self, job: Job) -> Awaitable[trajectory_pb2.Trajectory]:
        key = (job.env, job.seed, job.difficulty, job.agent)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = asyncio.ensure_future(self._run(job))
            if len(self._made) > 65_536:  # old tasks: a group's members come together
                for old in list(self._made)[:16_384]:
                    if self._made[old].done():
                        del self._made[old]
        return asyncio.shield(made)

    async def _run(self, job: Job) -> trajectory_pb2.Trajectory:
        assert self._ctx is not None
        env = get(job.env)
        agent = make_agent(job.agent, envs=get, ctx=self._ctx)
        record = await run_rollout(job, env, agent, self._ctx, "sim")
        self.rollouts += 1
        return to_message(dataclasses.replace(record, node=""), trajectory_pb2.Trajectory())

    async def record(self, job: Job, started: float) -> bytes:
        message = await self.template(job)
        message.id, message.group_id, message.policy_version = job.id, job.group_id, job.policy_version
        message.started_at.FromNanoseconds(int(started * 1e9))
        message.finished_at.FromNanoseconds(time.time_ns())
        return message.SerializeToString()


@dataclasses.dataclass
class Tally:
    leased: int = 0
    lease_calls: int = 0
    empty_leases: int = 0
    reported: int = 0
    result_calls: int = 0
    stored: int = 0
    handled: int = 0
    refused: int = 0
    errors: int = 0
    heartbeats: int = 0
    released: int = 0
    refusals: list[str] = dataclasses.field(default_factory=list)
    lease_s: list[float] = dataclasses.field(default_factory=list)
    """Seconds from a lease request to its reply, for replies that held jobs."""
    result_s: list[float] = dataclasses.field(default_factory=list)
    """Seconds from a results request to its reply."""
    finished: list[float] = dataclasses.field(default_factory=list)
    """When each reply told a node its results were stored (wall clock), one entry per result."""


class SimNode:
    """One node: its link, and a worker with the real one's cadence whose rollouts are waits."""

    def __init__(self, addr: str, name: str, slots: int, rollout_s: float, records: Records, tally: Tally,
                 token: str | None, spread: float = 0.5, lease_with_results: bool = True) -> None:
        self.name = name
        self._with_results = lease_with_results
        """Ask for jobs with each batch of results (``ResultsRequest.lease``), and with a lease of its own only when
        nothing is on its way; else as an older node, always with a lease of its own."""
        self._sending = False
        self.owner = f"{name}:{os.getpid()}:{random.getrandbits(32):08x}"
        self._slots = slots
        self._rollout_s = rollout_s
        self._spread = spread
        self._records = records
        self._tally = tally
        self._running: dict[int, asyncio.Task[None]] = {}
        self._done: list[tuple[int, bytes]] = []
        self._wake = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._stopping = False
        self.link = Link(addr, self._hello, on_connect=self._connected, token=token)
        self._tasks: list[asyncio.Task[None]] = []

    def _hello(self) -> node_pb2.NodeHello:
        return node_pb2.NodeHello(name=self.name, owner=self.owner, capacity=self._slots, version="sim",
                                  isolation=ISOLATED, facts={"simulated": "bench.sim_nodes"})

    async def _connected(self, welcome: node_pb2.Welcome, first: bool) -> None:
        if first:
            self._records.keyed(welcome.verifier_key)
            with contextlib.suppress(LinkDown, RequestFailed):  # as a node's first connection does
                await self.link.request(recover=node_pb2.RecoverRequest())

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.link.run(), name=f"{self.name}-link"))
        await self.link.welcomed.wait()
        assert self.link.welcome is not None
        welcome = self.link.welcome
        heartbeat_s = min(seconds(welcome.lease), 3 * seconds(welcome.heartbeat_every)) / 3
        self._tasks += [loop.create_task(self._lease_loop()), loop.create_task(self._flush_loop()),
                        loop.create_task(self._heartbeat_loop(heartbeat_s))]

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        with contextlib.suppress(LinkDown, RequestFailed):
            reply = await self.link.request(release=node_pb2.ReleaseRequest(), timeout_s=10)
            self._tally.released += reply.count.count
        for task in self._tasks[1:]:
            task.cancel()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        await self.link.close()
        self._tasks[0].cancel()
        await asyncio.gather(self._tasks[0], return_exceptions=True)

    async def _lease_loop(self) -> None:
        idle = _IDLE_MIN_S
        while not self._stopping:
            free = self._slots - len(self._running)
            if free <= 0 or (self._with_results and (self._done or self._sending)):  # they ask for it
                self._wake.clear()
                await self._wake.wait()
                continue
            jobs = await self._lease(free)
            self._start(jobs)
            if jobs:
                idle = _IDLE_MIN_S
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), idle)
            idle = min(_IDLE_MAX_S, idle * 2)

    async def _lease(self, n: int) -> list[Job]:
        if not self.link.connected.is_set():
            return []
        t0 = time.perf_counter()
        try:
            reply = await self.link.request(lease=node_pb2.LeaseRequest(n=n, wait=duration(LEASE_WAIT_S)))
        except (LinkDown, RequestFailed) as exc:
            self._error(f"lease: {exc}")
            return []
        tally = self._tally
        tally.lease_calls += 1
        jobs = self._jobs(reply.leased)
        if jobs:
            if len(tally.lease_s) < _LATENCIES_KEPT:
                tally.lease_s.append(time.perf_counter() - t0)
        else:
            tally.empty_leases += 1
        return jobs

    def _jobs(self, leased: node_pb2.LeaseReply) -> list[Job]:
        jobs = [Job(id=j.id, group_id=j.group_id, env=j.env, seed=j.seed, difficulty=j.difficulty, agent=j.agent,
                    state=JobState.LEASED, attempts=j.attempts, lease_owner=self.owner,
                    policy_version=j.policy_version, source=j.source or "request") for j in leased.jobs]
        self._tally.leased += len(jobs)
        return jobs

    def _start(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._running[job.id] = asyncio.get_running_loop().create_task(self._rollout(job))

    async def _rollout(self, job: Job) -> None:
        started = time.time()
        try:
            await asyncio.sleep(self._rollout_s * random.uniform(1 - self._spread, 1 + self._spread))
            data = await self._records.record(job, started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # as a real worker: an infrastructure failure, reported
            self._error(f"job {job.id}: {exc}")
            with contextlib.suppress(LinkDown, RequestFailed):
                await self.link.request(fail=node_pb2.FailRequest(job_id=job.id, error=str(exc)[:500], transient=False))
        else:
            self._done.append((job.id, data))
            if len(self._done) >= _FLUSH_MAX:
                self._flush_now.set()
        finally:
            self._running.pop(job.id, None)
            if not self._with_results or not self._done:
                self._wake.set()

    async def _flush_loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_now.wait(), _FLUSH_S)
            self._flush_now.clear()
            if self._done:
                batch, self._done = self._done, []
                self._sending = True
                try:
                    await self._send(batch)
                finally:
                    self._sending = False
                    self._wake.set()  # slots the reply did not fill: leased by a lease of its own

    async def _send(self, batch: list[tuple[int, bytes]]) -> None:
        parts = [node_pb2.ResultPart(job_id=job_id, owner=self.owner, data=data, last=True) for job_id, data in batch]
        request = node_pb2.ResultsRequest(parts=parts)
        free = self._slots - len(self._running)
        if self._with_results and free > 0:
            request.lease.n = free
        tally = self._tally
        t0 = time.perf_counter()
        try:
            reply = await self.link.request(results=request)
        except (LinkDown, RequestFailed) as exc:  # a real node keeps them in its outbox; here they are counted lost
            self._error(f"results: {exc}")
            return
        now = time.time()
        tally.result_calls += 1
        tally.reported += len(batch)
        if len(tally.result_s) < _LATENCIES_KEPT:
            tally.result_s.append(time.perf_counter() - t0)
        results = reply.results
        self._start(self._jobs(results.leased))
        tally.stored += len(results.stored)
        tally.handled += len(results.handled)
        tally.finished.extend([now] * len(results.stored))
        tally.refused += len(results.refused)
        for refusal in results.refused[:3]:
            if len(tally.refusals) < 20:
                tally.refusals.append(f"{self.name} job {refusal.job_id}: {refusal.reason[:300]}")

    async def _heartbeat_loop(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s * random.uniform(0.9, 1.0))
            with contextlib.suppress(LinkDown, RequestFailed):
                await self.link.request(heartbeat=node_pb2.HeartbeatRequest(job_ids=list(self._running)))
                self._tally.heartbeats += 1

    def _error(self, what: str) -> None:
        self._tally.errors += 1
        if len(self._tally.refusals) < 20:
            self._tally.refusals.append(f"{self.name}: {what[:300]}")


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98]}


async def simulate(addr: str, nodes: int, slots: int, rollout_s: float, seconds: float, *, prefix: str = "sim",
                   token: str | None = None, join_over_s: float = 2.0, spread: float = 0.5,
                   join_timeout_s: float = 60.0, lease_with_results: bool = True) -> dict[str, Any]:
    """Join ``nodes`` nodes (spread over ``join_over_s``), run them ``seconds`` from the last welcome, stop
    them (their leases released); what they did. SIGTERM or SIGINT stops them early."""
    records, tally = Records(), Tally()
    fleet = [SimNode(addr, f"{prefix}-{i:04d}", slots, rollout_s, records, tally, token, spread, lease_with_results)
             for i in range(nodes)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cpu0, t0 = _cpu_s(), time.time()

    async def start(i: int, node: SimNode) -> None:
        await asyncio.sleep(join_over_s * i / max(1, nodes))
        await node.start()

    joining = asyncio.gather(*(start(i, n) for i, n in enumerate(fleet)))
    stopped = loop.create_task(stop.wait())
    await asyncio.wait([joining, stopped], timeout=join_timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not joining.done():  # refused (a link tries again forever), or told to stop: say so, and leave
        joining.cancel()
        welcomed = sum(n.link.welcomed.is_set() for n in fleet)
        await asyncio.gather(*(n.link.close() for n in fleet), return_exceptions=True)
        raise SystemExit(f"{welcomed} of {nodes} nodes were welcomed within {join_timeout_s:g}s; the coordinator's "
                         f"log says why the others were not")
    stopped.cancel()
    joined_at = time.time()
    print(json.dumps({"event": "joined", "nodes": nodes, "at": joined_at}), flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    stopping_at = time.time()
    stopping = asyncio.gather(*(n.stop() for n in fleet))
    try:  # what the nodes did is counted already: a link slow to close must not keep it from being said
        await asyncio.wait_for(stopping, 60)
    except TimeoutError:
        print("the simulated nodes had not all stopped within 60 s", file=sys.stderr, flush=True)
    return {
        "event": "ended", "nodes": nodes, "slots": slots, "rollout_s": rollout_s, "spread": spread, "started_at": t0,
        "joined_at": joined_at, "stopping_at": stopping_at, "ended_at": time.time(), "cpu_s": _cpu_s() - cpu0,
        "template_rollouts": records.rollouts,
        **{k: v for k, v in dataclasses.asdict(tally).items() if k not in ("lease_s", "result_s", "finished")},
        "lease_reply_s": _quantiles(tally.lease_s), "results_reply_s": _quantiles(tally.result_s),
        "stored_per_s": _timeline(tally.finished, joined_at, stopping_at),
    }


def _timeline(finished: list[float], start: float, end: float) -> list[int]:
    """Results told stored in each whole second from ``start`` to ``end``."""
    counts = [0] * max(0, int(end - start))
    for at in finished:
        i = int(at - start)
        if 0 <= i < len(counts):
            counts[i] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description="simulated worker nodes against one coordinator")
    parser.add_argument("--addr", required=True)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--rollout-s", type=float, default=5.0)
    parser.add_argument("--spread", type=float, default=0.5,
                        help="each rollout takes ROLLOUT_S times a uniform draw in [1 - SPREAD, 1 + SPREAD]")
    parser.add_argument("--seconds", type=float, default=60.0, help="from the last node's welcome to the stop")
    parser.add_argument("--prefix", default="sim", help="node names are PREFIX-0000, PREFIX-0001, ...")
    parser.add_argument("--lease-apart", action="store_true",
                        help="never ask for jobs with results (as a node from before ResultsRequest.lease)")
    args = parser.parse_args()

    async def run() -> None:
        report = await simulate(args.addr, args.nodes, args.slots, args.rollout_s, args.seconds,
                                prefix=args.prefix, token=os.environ.get("FARM_TOKEN"), spread=args.spread,
                                lease_with_results=not args.lease_apart)
        print(json.dumps(report), flush=True)
        sys.stderr.flush()
        # Said, and every node released its leases: nothing is left to wait for (a channel slow to close would
        # hold the loop's shutdown, and the bench waiting on this process, for nothing).
        os._exit(0)

    uvloop.run(run())


if __name__ == "__main__":
    main()
