"""A node's rollout workers: lease jobs, run them in boxes, report back in batches.

The worker talks to the scheduler only through ``Leases``: the scheduler itself on the
coordinator, or ``farmd.fleet.remote.RemoteLeases`` on a joined node, where the same calls
travel over the node's one gRPC stream. On stop it takes no new leases, lets rollouts in flight finish for a grace
period, and gives back the leases of those that did not.

A job whose agent waits on a model endpoint (``openai:MODEL@NAME``, NAME one of this node's endpoints) holds no
rollout slot: it waits on a server, it does not compute, and a server that hangs would otherwise hold every slot
and stop every other agent's work. Each endpoint has its own cap instead (``max_in_flight``), leased apart from
the rest: a server that hangs holds at most that many of this node's jobs, until its health checks take it out
and they fail as infrastructure (retried by the scheduler, never scored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from farmd.agents import Agent, ClientPool, NamedEndpoint, PolicySource, TorchRuntime, make_agent
from farmd.agents.registry import RedTeamFactory
from farmd.agents.replicas import ReplicaSet
from farmd.envs import VerifyContext, get
from farmd.envs.catalog import EnvLookup
from farmd.errors import EndpointError, is_retried
from farmd.metrics import Metrics
from farmd.records import Job, JobState, Trajectory
from farmd.rollout.runner import run_rollout

log = logging.getLogger("farmd.worker")

_IDLE_MIN_S = 0.02
_IDLE_MAX_S = 1.0
"""An idle worker asks for work at least this often. What its scheduler queues wakes it at once (``wake_up``: new
jobs, requeued ones, a retry whose backoff has passed); the poll only finds what nothing announced, and a poll
every 0.1 s, a write transaction each, was one of the timers that took cores from a trainer learning beside an
idle farm."""
_AGENTS_KEPT = 64
"""Agents are cheap to make and shared by a spec's rollouts; a caller queueing endless distinct specs
(model names) must not grow a worker without bound."""
_FLUSH_S = 0.02
_FLUSH_MAX = 64


class Leases(Protocol):
    async def lease(self, owner: str, n: int, *, endpoint: str | None = None, exclude: Sequence[str] = ()
                    ) -> list[Job]:
        """Up to ``n`` jobs: only of ``endpoint``'s agents, or of none of ``exclude``'s."""
    async def heartbeat(self, owner: str, job_ids: list[int]) -> int: ...
    async def complete(self, owner: str, trajectories: list[Trajectory]) -> list[int]: ...
    async def fail(self, owner: str, job_id: int, error: str, *, transient: bool = True) -> JobState | None:
        """An infrastructure failure of a leased job; ``transient`` False: trying again cannot help."""
    async def release(self, owner: str) -> int: ...
    async def recover(self, node: str, owner: str) -> int: ...


@runtime_checkable
class LeasesWithResults(Leases, Protocol):
    """Leases that also lease with a batch of results (a joined node's: one message for both, not two)."""

    async def complete_and_lease(self, owner: str, trajectories: list[Trajectory], n: int, *,
                                 exclude: Sequence[str] = ()) -> tuple[list[int], list[Job]]:
        """``complete``, then up to ``n`` jobs (none of ``exclude``'s endpoints), never waiting for work: (the ids
        stored, the jobs leased)."""


class Worker:
    def __init__(self, leases: Leases, ctx: VerifyContext, slots: int, lease_s: float, node: str | None = None,
                 metrics: Metrics | None = None, endpoints: tuple[NamedEndpoint, ...] = (),
                 policies: PolicySource | None = None, owner: str | None = None, envs: EnvLookup = get,
                 prepare: Callable[[str], Awaitable[None]] | None = None,
                 red_team: RedTeamFactory | None = None, replicas: dict[str, ReplicaSet] | None = None,
                 torch_threads: int = 1) -> None:
        self.leases = leases
        self.envs = envs
        """Where jobs' environments are found, by name: the node's catalog (default: the built-ins); the
        ``reference`` and ``skilled:`` agents look there too."""
        self._prepare = prepare
        """Makes a job's environment known before it is looked up (a joined node fetches an approved
        contributed version from its coordinator); its failure is the job's infrastructure failure."""
        self._red_team = red_team
        """Builds ``redteam:`` agents (``farmctl redteam``'s adversaries); None: this node refuses them."""
        self.endpoints = endpoints
        """This node's configured model endpoints, which jobs' ``openai:MODEL@NAME`` specs resolve against."""
        self.policies = policies
        """Where ``torch:NAME`` jobs' policies come from (None: this node refuses them)."""
        self._torch = TorchRuntime(policies, threads=torch_threads) if policies is not None else None
        """The torch thread and loaded policies, shared by every torch agent of this worker; closed on stop."""
        self.ctx = ctx
        self.slots = slots
        self.node = node or socket.gethostname()
        self.owner = owner or f"{self.node}:{os.getpid()}:{id(self):x}"
        """The lease owner: ``<node>:...``, so everything a node's incarnations held is found by its name."""
        self._lease_s = lease_s
        self._agents: OrderedDict[str, Agent] = OrderedDict()
        """Agents by spec, the most recently used last; at most ``_AGENTS_KEPT`` (specs come from callers)."""
        self.replicas = replicas if replicas is not None else {
            e.name: ReplicaSet(e.name, e.urls, e.health) for e in endpoints}
        """Each endpoint's servers (the daemon's, shared with its weight sync, or this worker's own)."""
        self._own_replicas = replicas is None
        self._clients = ClientPool(self.replicas)
        """The endpoints' connections, shared by the agents (so dropping an agent closes nothing); closed on stop."""
        self._running: dict[int, asyncio.Task[None]] = {}
        self._model_jobs: dict[str, set[int]] = {e.name: set() for e in endpoints}
        """Each endpoint's jobs running here: they hold no slot, and count against their endpoint's cap."""
        for replica_set in self.replicas.values():
            replica_set.on_change = self.wake_up
        self._done: list[Trajectory] = []
        self._flushing = False
        """A batch of results is on its way: with ``LeasesWithResults`` it asks for the slots it frees."""
        self._sending: list[Trajectory] = []
        """The batch a flush is reporting, until its call returns (its results are nowhere else meanwhile)."""
        self._flushed = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._results = asyncio.Event()
        """Set when a result joins ``_done`` (and on stop): what the flush loop sleeps on."""
        self.counters = {"ran": 0, "infra_failures": 0, "in_flight": 0, "given_back": 0}
        """``in_flight``: rollouts running when ``stop`` began; ``given_back``: those of them that did not finish."""
        self.metrics = metrics

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def held(self) -> set[int]:
        """The jobs this worker holds now: running, finished and waiting for a flush, or being reported."""
        return {*self._running, *(t.id for t in self._done), *(t.id for t in self._sending)}

    def wake_up(self) -> None:
        """Jobs may be leasable now (the coordinator queued some, or a replica came back): an idle lease loop asks at
        once rather than at its next poll. In a lockstep loop every batch starts so; the poll alone cost it 50 ms
        on average."""
        self._wake.set()

    def _free(self) -> tuple[int, dict[str, int]]:
        """(free rollout slots, each endpoint's free room)."""
        model = sum(len(ids) for ids in self._model_jobs.values())
        rooms = {e.name: e.max_in_flight - len(self._model_jobs[e.name]) for e in self.endpoints}
        return self.slots - (len(self._running) - model), rooms

    def policy_versions(self) -> list[int]:
        """The policy versions this worker's torch agents have loaded."""
        return self._torch.loaded_versions() if self._torch is not None else []

    async def start(self) -> None:
        await self.leases.recover(self.node, self.owner)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._lease_loop(), name="worker-lease"),
                       loop.create_task(self._flush_loop(), name="worker-flush"),
                       loop.create_task(self._heartbeat_loop(), name="worker-heartbeat")]

    async def stop(self, grace_s: float) -> None:
        """No new leases; in-flight rollouts get ``grace_s`` to finish; the rest go back to the queue.

        The lease and flush loops are let finish, not cancelled: a completion cancelled in the
        middle of its transaction would be rolled back and its rollouts run again.
        """
        self._stopping = True
        self.counters["in_flight"] = len(self._running)
        self._wake.set()
        self._results.set()
        self._flush_now.set()
        leasing, flushing, heartbeat = self._tasks
        await asyncio.gather(leasing, return_exceptions=True)  # no lease is taken after this
        if self._running:
            _, pending = await asyncio.wait(list(self._running.values()), timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(flushing, return_exceptions=True)
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
        await self._flush()
        await self._clients.aclose()
        if self._own_replicas:
            await asyncio.gather(*(r.aclose() for r in self.replicas.values()))
        if self._torch is not None:
            await self._torch.aclose()
        given_back = await self.leases.release(self.owner)
        self.counters["given_back"] = given_back
        if given_back:
            log.info("gave back %d unfinished leases", given_back)

    def _agent(self, spec: str) -> Agent:
        agent = self._agents.get(spec)
        if agent is None:
            agent = self._agents[spec] = make_agent(spec, endpoints=self.endpoints, clients=self._clients,
                                                    policies=self.policies, torch=self._torch, envs=self.envs,
                                                    ctx=self.ctx, red_team=self._red_team)
            if len(self._agents) > _AGENTS_KEPT:
                self._agents.popitem(last=False)
        self._agents.move_to_end(spec)
        return agent

    async def _lease_loop(self) -> None:
        idle = _IDLE_MIN_S
        names = [e.name for e in self.endpoints]
        for servers in self.replicas.values():
            servers.start()  # their health is known before their jobs are leased
        while not self._stopping:
            free, rooms = self._free()
            if isinstance(self.leases, LeasesWithResults) and (self._done or self._flushing):
                free = 0  # the results on their way ask for these slots, in the same message
            if free <= 0 and not any(room > 0 for room in rooms.values()):
                self._wake.clear()
                await self._wake.wait()
                continue
            started = 0
            try:
                # Each lease's jobs start as it comes, not after the next lease call: what this worker holds is
                # always what it says it holds (``held``), which a node joining again tells its coordinator.
                if free > 0:
                    started += self._start(await self.leases.lease(self.owner, free, exclude=names))
                for name, room in rooms.items():
                    if room > 0:
                        leased = await self.leases.lease(self.owner, room, endpoint=name)
                        self._model_jobs[name].update(j.id for j in leased)
                        started += self._start(leased)
            except Exception:
                log.exception("leasing failed")
            if started:
                idle = _IDLE_MIN_S
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), idle)
            idle = min(_IDLE_MAX_S, idle * 2)

    def _start(self, jobs: list[Job]) -> int:
        # What the jobs' attempts will all wait on first (a just-published policy's load) begins before they do:
        # otherwise it would start behind every one of their first steps, hundreds of them after a publish.
        for spec, version in dict.fromkeys((job.agent, job.policy_version) for job in jobs if job.policy_version):
            with contextlib.suppress(Exception):  # an agent that cannot be made fails its rollouts, each saying why
                self._agent(spec).prepare(version)
        for job in jobs:
            self._running[job.id] = asyncio.get_running_loop().create_task(self._run(job))
        return len(jobs)

    async def _run(self, job: Job) -> None:
        try:
            if self._prepare is not None:
                await self._prepare(job.env)
            env = self.envs(job.env)
            agent = self._agent(job.agent)
            trajectory = await run_rollout(job, env, agent, self.ctx, self.node)
            self._done.append(trajectory)
            self._results.set()
            self.counters["ran"] += 1
            log.debug("job %d: reward %g", job.id, trajectory.reward,
                      extra={"job": job.id, "env": job.env, "event": "rollout", "reward": trajectory.reward,
                             "status": trajectory.status, "seconds": trajectory.timings.total})
            if self.metrics is not None:
                self.metrics.rollout_ended(job.env, trajectory.passed, trajectory.timings.verify,
                                           trajectory.timings.total)
            if len(self._done) >= _FLUSH_MAX:
                self._flush_now.set()  # only the flush loop writes: a rollout's cancellation never cuts one
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # InfraFailure or a bug: not the attempt's fault, so never scored
            self.counters["infra_failures"] += 1
            if self.metrics is not None:
                self.metrics.rollouts.labels(job.env, "infra_failure").inc()
                if isinstance(exc, EndpointError) or isinstance(exc.__cause__, EndpointError):
                    self.metrics.endpoint_failed(job.agent)
            log.warning("job %d: %s", job.id, exc, extra={"job": job.id, "env": job.env, "event": "infra_failure"})
            # As the error's kind says (``farmd.errors``); a bug is retried up to the job's attempts.
            transient = is_retried(exc)
            with contextlib.suppress(Exception):
                await self.leases.fail(self.owner, job.id, f"{type(exc).__name__}: {exc}", transient=transient)
        finally:
            self._running.pop(job.id, None)
            for ids in self._model_jobs.values():
                ids.discard(job.id)
            self._wake.set()

    async def _flush(self) -> None:
        if not self._done:
            return
        batch, self._done = self._done, []
        leases = self.leases
        self._flushing = True
        self._sending = batch
        try:
            if isinstance(leases, LeasesWithResults) and not self._stopping:
                free, _ = self._free()
                _, jobs = await leases.complete_and_lease(self.owner, batch, max(0, free),
                                                          exclude=[e.name for e in self.endpoints])
                if not self._stopping:  # else ``stop`` gives them back with every lease this worker holds
                    self._start(jobs)
            else:
                await leases.complete(self.owner, batch)
        except Exception:
            log.exception("reporting %d trajectories failed; their leases will expire and they will rerun",
                          len(batch))
        finally:
            self._flushing = False
            self._sending = []
            self._wake.set()  # slots the reply left empty (nothing queued): a lease of their own

    async def _flush_loop(self) -> None:
        # Asleep while nothing has finished: an idle worker wakes nobody (in the learning loop's lockstep the
        # trainer learns while this worker idles, and a loop that woke every 20 ms to find nothing, one of several
        # such timers, took cores from it mid-step). Once a result is in, the others finishing within _FLUSH_S
        # go with it, or _FLUSH_MAX of them at once.
        while not self._stopping:
            await self._results.wait()
            if not self._flush_now.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush_now.wait(), _FLUSH_S)
            self._results.clear()
            self._flush_now.clear()
            await self._flush()

    async def _heartbeat_loop(self) -> None:
        # Idle too: for a joined node the heartbeat is how the coordinator knows it is alive and what it holds.
        while True:
            await asyncio.sleep(self._lease_s / 3)
            with contextlib.suppress(Exception):
                await self.leases.heartbeat(self.owner, list(self._running))
