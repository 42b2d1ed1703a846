"""farmd: wiring, start-up and graceful shutdown of one node.

``Daemon.start()`` checks isolation, starts the sandbox (when this node runs
rollouts) and the gRPC server; ``stop()`` stops intake, waits a grace period and
closes everything it started, in that order, and logs what was done. Signal handlers only set a
flag; a second signal makes ``serve`` raise ``ForcedStop``, and the entry point decides the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc, intake_pb2, intake_pb2_grpc, node_pb2, node_pb2_grpc
from grpc_health.v1 import _async as health_aio  # what grpc_health.v1.health.aio re-exports
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from farmd import __version__
from farmd.agents.replicas import ReplicaSet
from farmd.agents.weights import Published, WeightSync
from farmd.api.auth import RoleInterceptor
from farmd.api.budget import Budgets
from farmd.api.farm_service import FarmService
from farmd.api.intake_service import IntakeService
from farmd.api.limits import CallLimits, server_bound, server_options
from farmd.api.malformed import MalformedInterceptor
from farmd.api.names import NameGuard
from farmd.api.node_service import NodeService
from farmd.api.reflection import enable_reflection
from farmd.api.refuse import UnknownMethods
from farmd.api.tls import add_port, peer_common_name
from farmd.config import Config, sandbox_for
from farmd.envs import VerifyContext
from farmd.envs.catalog import Catalog
from farmd.errors import ActiveLost, ConfigError, ForcedStop, IsolationUnavailable, PackageError
from farmd.fleet.joined import JoinedNode
from farmd.intake.attacker import Attacker, AttackerConfig
from farmd.intake.funnel import Funnel
from farmd.intake.package import Package, read_package
from farmd.intake.redteam import make_red_team_agent
from farmd.intake.served import ContributedEnvironment
from farmd.intake.vf import local_environment
from farmd.metrics import GrpcMetrics, Metrics, MetricsServer
from farmd.names import CONSUMER
from farmd.node import NodeInfo
from farmd.offload import OFFLOAD
from farmd.private import hold_data_dir, make_data_dir_private, write_file
from farmd.rollout import Worker
from farmd.rollout.reverify import Rechecker
from farmd.rollout.verify import Judges
from farmd.sandbox import Sandbox, check_host
from farmd.sandbox.host import missing
from farmd.scheduler import Scheduler
from farmd.scheduler.history import History
from farmd.scheduler.nodes import Nodes, NodeStatus
from farmd.store import Store
from farmd.taskbank import SeedSequence
from farmd.verifier import VerifierKey

if TYPE_CHECKING:
    from farmd.api.atropos import AtroposServer
    from farmd.api.atropos_feed import AtroposFeed
    from farmd.api.console import ConsoleServer
    from farmd.api.sandbox_fusion import SandboxFusionServer

log = logging.getLogger("farmd.daemon")

_MAX_SEND_BYTES = 64 * 1024 * 1024
_INTAKE_BOXES = 3
"""Boxes a coordinator without workers keeps for checking submissions (a check runs a few at once)."""
FARM_KEY_STATE = "verifier_key"
"""The farm's verifier key in a shared database's saved state (hex): the database is the farm, so its key is there."""


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.port = 0
        self.sandbox: Sandbox | None = None
        self.store: Store | None = None
        self.scheduler: Scheduler | None = None
        self.worker: Worker | None = None
        self.nodes: Nodes | None = None
        self.catalog = Catalog()
        """The environments this farm serves: the built-ins, and approved contributed versions (the funnel's)."""
        self.funnel: Funnel | None = None
        self._attacker: Attacker | None = None
        self.joined: JoinedNode | None = None
        """This node's worker role for a coordinator elsewhere (``--join``); then nothing else runs here."""
        self._server: grpc.aio.Server | None = None
        self._health: health_aio.HealthServicer | None = None
        self._stopping = asyncio.Event()
        self._data_lock: int | None = None
        """The data directory's lock (``hold_data_dir``), held from the start of ``start`` to the end of ``stop``."""
        self.lost_active = False
        """Stopped because another coordinator may now serve the farm (``_lost_active``), not because asked."""
        self.metrics = Metrics(endpoints=[e.name for e in config.endpoints]) if config.metrics_listen else None
        """None unless metrics are served: nobody pays for figures nobody scrapes."""
        self._metrics_server: MetricsServer | None = None
        self._console: ConsoleServer | None = None
        self._atropos: AtroposServer | None = None
        self._sandbox_fusion: SandboxFusionServer | None = None
        self._budgets = Budgets(config.credentials, streams=config.credential_streams,
                                pending_bytes=config.credential_pending_bytes,
                                pending_pieces=config.credential_pending_pieces)
        """What each credential holds at once across every API (gRPC and Atropos's HTTP)."""
        self._atropos_feed: AtroposFeed | None = None
        self.history: History | None = None
        self.replicas: dict[str, ReplicaSet] = {}
        """Each model endpoint's servers, their health and weight labels: the worker's and the weight sync's."""
        self.weight_sync: WeightSync | None = None
        """The farm's status sampled every few seconds, for the console's plots (GetHistory)."""

    @property
    def workers(self) -> int:
        if self.config.workers is not None:
            return self.config.workers
        return os.cpu_count() or 1

    async def start(self) -> None:
        # First: nothing of the directory is touched, nor its run file written or removed, by a second farmd on it.
        self._data_lock = await asyncio.get_running_loop().run_in_executor(None, hold_data_dir, self.config.data_dir)
        if self.config.join:
            if self.config.http_listen or self.config.atropos_listen or self.config.sandbox_fusion_listen:
                raise ConfigError("a joined node serves no console, no Atropos API and no SandboxFusion API: --http, "
                                  "--atropos and --sandbox-fusion go to its coordinator, which keeps the store")
            self.joined = JoinedNode(self.config, self.workers, self.metrics, contributed=_contributed,
                                     red_team=make_red_team_agent)  # config refuses --join --workers 0
            await self.joined.start(self._stopping)
            await self._start_metrics()
            return
        loop = asyncio.get_running_loop()
        checks = await loop.run_in_executor(None, check_host, self.config.sandbox)
        gaps = missing(checks)
        if gaps and self.workers:
            raise IsolationUnavailable(gaps)
        if gaps:
            log.warning("this host cannot isolate untrusted code; serving as coordinator only: %s", "; ".join(gaps))
        await loop.run_in_executor(None, make_data_dir_private, self.config.data_dir)
        self.store = await Store.open(self.config.data_dir / "farm.db", self.config.store)
        # On a shared database one coordinator serves at a time; the others wait here, and the first to get the
        # role when the active one is gone takes over its leases and streams (the scheduler extends the leases).
        await self.store.db.become_active(self._lost_active, self.config.listen)
        for name, where in self.config.verifiers:  # the operator's own verifiers environments, as vf:NAME
            try:
                self.catalog.add(await loop.run_in_executor(None, local_environment, name, where))
            except PackageError as exc:
                raise ConfigError(f"[verifiers] {name} = {str(where)!r}: {'; '.join(exc.problems)}") from None
        levels = self.catalog.max_difficulty()
        key = await self._farm_key()
        # Fresh seeds from the farm's keyed sequence: intake draws the seeds it checks on the same way.
        self.scheduler = await Scheduler.open(
            self.store, levels, self.config.scheduler, self.metrics, bank_config=self.config.taskbank,
            endpoint_lines={e.name: (e.serves, e.served_policy) for e in self.config.endpoints
                            if e.serves and e.served_policy},
            seeds=SeedSequence.keyed(key.seed))
        await self.scheduler.start()
        await self._start_weight_sync()
        ctx = None
        if self.workers:
            self.sandbox = Sandbox(sandbox_for(self.config, self.workers))
            await self.sandbox.start()
            if self.metrics is not None:
                sandbox = self.sandbox
                self.metrics.watch_boxes(lambda: sandbox.outcomes)
            ctx = VerifyContext(sandbox=self.sandbox, key=key, scratch_dir=None)
            self.worker = Worker(self.scheduler, ctx, slots=self.workers, lease_s=self.config.scheduler.lease_s,
                                 metrics=self.metrics, endpoints=self.config.endpoints, policies=self.scheduler.policies,
                                 envs=self.catalog.get, red_team=make_red_team_agent, replicas=self.replicas,
                                 torch_threads=self.config.torch_threads)
        await self.scheduler.take_over(self.worker.owner if self.worker is not None else "")
        if self.sandbox is None and not gaps:
            # A coordinator runs no rollouts, but it checks submissions: the funnel's boxes are its own few.
            self.sandbox = Sandbox(sandbox_for(self.config, _INTAKE_BOXES))
            await self.sandbox.start()
        self._attacker = self._make_attacker()
        self.funnel = Funnel(self.store, self.sandbox, key, self.config.intake, serve=self._serve, unserve=self._unserve,
                             attacker=self._attacker)
        self.scheduler.canaries = self.funnel.canaries  # production keeps checking what intake approved
        await self.funnel.start()  # approved versions served before a worker leases their jobs
        if self.worker is not None:
            self.scheduler.on_work.append(self.worker.wake_up)
            await self.worker.start()
        # Joined nodes' verdicts are checked on the coordinator's own boxes (its workers', or intake's few).
        own = ctx or (VerifyContext(sandbox=self.sandbox, key=key, scratch_dir=None) if self.sandbox else None)
        self.nodes = Nodes(self.scheduler, lost_after_s=self.config.scheduler.node_lost_s,
                           local=self.worker.node if self.worker is not None else None,
                           local_status=self._local_node if self.worker is not None else None,
                           checker=Rechecker(own, self.catalog.get) if own is not None else None)
        await self.nodes.start()
        self.history = History(self.scheduler, self.nodes)
        await self.history.start()

        node = NodeInfo(workers=self.workers, max_boxes=self.config.sandbox.boxes, isolation=checks)
        # In this order: every call is counted, refusals too; no token, nothing read; then the call counts
        # against its room; then it is parsed.
        max_calls = self.config.max_concurrent_calls
        interceptors: list[Any] = [GrpcMetrics(self.metrics)] if self.metrics is not None else []
        interceptors += [RoleInterceptor(self.config.credentials)] if self.config.credentials else []
        interceptors += [CallLimits(max_calls), MalformedInterceptor()]
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                *server_options(),
                ("grpc.max_send_message_length", _MAX_SEND_BYTES),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=server_bound(max_calls),
        )
        names = NameGuard(self.store, self.config.credentials)
        budgets = self._budgets
        service = FarmService(node, self.store, self.scheduler, ctx, endpoints=self.config.endpoints, budgets=budgets,
                              max_policy_bytes=self.config.max_policy_bytes, nodes=self.nodes, envs=self.catalog.get,
                              history=self.history, names=names,
                              judges=Judges(own, self.catalog.get, node.name, max(1, self.workers or _INTAKE_BOXES)))
        intake = IntakeService(self.funnel, self.config.credentials, budgets)
        farm_pb2_grpc.add_FarmServiceServicer_to_server(service, server)
        intake_pb2_grpc.add_IntakeServiceServicer_to_server(intake, server)
        node_pb2_grpc.add_NodeServiceServicer_to_server(NodeService(
            self.nodes, verifier_key=key.material(), version=__version__, lease_s=self.config.scheduler.lease_s,
            peer_name=peer_common_name if self.config.tls_ca else None, names=names, budgets=budgets), server)
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        enable_reflection((farm_pb2.DESCRIPTOR.services_by_name["FarmService"].full_name,
                           node_pb2.DESCRIPTOR.services_by_name["NodeService"].full_name,
                           intake_pb2.DESCRIPTOR.services_by_name["IntakeService"].full_name, health.SERVICE_NAME),
                          server)
        server.add_generic_rpc_handlers((UnknownMethods(),))
        try:
            self.port = add_port(server, self.config.listen, self.config.tls_cert, self.config.tls_key,
                                 self.config.tls_ca)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {self.config.listen}: {exc}") from exc
        if self.port == 0:
            raise ConfigError(f"cannot listen on {self.config.listen}: address in use or invalid")
        await server.start()
        self._server = server
        for name in ("", "farm.v1.FarmService"):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        host = self.config.listen.rsplit(":", 1)[0]
        metrics_addr = await self._start_metrics()
        console_addr = await self._start_console({"FarmService": service, "IntakeService": intake})
        atropos_addr = await self._start_atropos()
        sandbox_fusion_addr = await self._start_sandbox_fusion()
        self._write_runfile(f"{host}:{self.port}", metrics_addr, console_addr, atropos_addr, sandbox_fusion_addr)
        # What is loaded by now (modules, the API, the catalog) lives as long as the daemon: kept out of the cyclic
        # collector's way, whose full collections would walk all of it again and again (in a fleet's coordinator,
        # about a tenth of the event loop's busy time went there).
        gc.freeze()
        # What lives on is mostly records kept for the streams (``Recent``: hundreds of thousands of objects), and
        # none of it is ever cyclic garbage. At Python's default (a full collection after every 10 of the middle
        # generation) the full collections came every 4-5 s in the learning loop, each walking all of it for
        # 0.4-0.8 s with the whole daemon stopped, and collected nothing. After 100, they came every ~10 s (the loop
        # has grown faster since), 0.2-0.4 s each. The youngest generation's threshold counts objects: at 700 a
        # lockstep step of 512 rollouts ran ~30 young collections, and everything still referenced was promoted
        # along; at 10,000 most of a step's objects are freed before one runs. Measured in a 90 s held loop: 3.0 s
        # in the collector at 700, 1.3 s at 10,000 (2 full collections, not 7).
        gc.set_threshold(10_000, 10, 100)
        log.info("farmd listening on %s:%d (workers=%d, data=%s)", host, self.port, self.workers,
                 self.config.data_dir, extra={"event": "listening", "addr": f"{host}:{self.port}",
                                              "metrics": metrics_addr, "console": console_addr,
                                              "workers": self.workers})
        if console_addr:
            log.info("web console at http://%s/", console_addr, extra={"event": "console", "addr": console_addr})
        if atropos_addr:
            log.info("Atropos API at http://%s/", atropos_addr, extra={"event": "atropos", "addr": atropos_addr})
        if sandbox_fusion_addr:
            log.info("SandboxFusion API at http://%s/run_code", sandbox_fusion_addr,
                     extra={"event": "sandbox_fusion", "addr": sandbox_fusion_addr})

    async def _start_weight_sync(self) -> None:
        """Each endpoint's replicas (shared by the worker's requests and the weight sync), and the sync that loads
        every version of a line into the endpoints that serve it."""
        store, scheduler = self.store, self.scheduler
        assert store is not None and scheduler is not None
        self.replicas = {e.name: ReplicaSet(e.name, e.urls, e.health) for e in self.config.endpoints}
        sync = WeightSync(self.config.endpoints, self.replicas, self.config.data_dir,
                          content=lambda sha256: store.policy_content(sha256, 1 << 20),
                          synced=scheduler.policies.synced)
        self.weight_sync = sync
        for name in sync.endpoints:
            scheduler.policies.syncs(name)
        scheduler.policies.watchers.append(
            lambda p: sync.published(Published(p.name, p.version, p.sha256, p.uri)))
        newest = {}
        for line in sync.lines:
            policy = await store.latest_policy(line)
            if policy is not None:
                newest[line] = Published(policy.name, policy.version, policy.sha256, policy.uri)
        await sync.start(newest)

    def _make_attacker(self) -> Attacker | None:
        """The LLM attacker ``[intake] attacker = "MODEL@NAME"`` names (config checked NAME exists)."""
        spec = self.config.intake.attacker
        if spec is None:
            return None
        model, name = spec.rsplit("@", 1)
        endpoint = next(e for e in self.config.endpoints if e.name == name)
        return Attacker(AttackerConfig(base_url=endpoint.urls[0], model=model, api_key=endpoint.api_key,
                                       request_timeout_s=min(endpoint.request_timeout_s, 600.0)))

    async def _serve(self, env: str, package: Package) -> None:
        """An approved contributed version joins the catalog (workers find it) and the task bank (runs get it)."""
        served = ContributedEnvironment(package)
        if served.name != env:
            raise ValueError(f"package {served.name} is not {env}")
        if env not in self.catalog.names():
            self.catalog.add(served)
        assert self.scheduler is not None
        self.scheduler.bank.add_env(env, served.max_difficulty)
        log.info("serving %s", env, extra={"event": "env_served", "env": env})

    async def _unserve(self, env: str) -> None:
        """A quarantined (or re-reviewed) version leaves the bank and the catalog: its queued jobs are the
        funnel's to cancel, and one leased now fails as an unknown environment, never scored."""
        if env in self.catalog.names():
            removed = self.catalog.remove(env)
            if isinstance(removed, ContributedEnvironment):
                await removed.aclose()
        assert self.scheduler is not None
        self.scheduler.bank.remove_env(env)
        log.info("no longer serving %s", env, extra={"event": "env_unserved", "env": env})

    def _local_node(self) -> NodeStatus:
        """This node's own worker, as ``farmctl status`` lists nodes."""
        worker = self.worker
        assert worker is not None
        now = time.time()
        return NodeStatus(name=worker.node, address="local", state="connected", capacity=worker.slots,
                          in_flight=worker.in_flight, done=worker.counters["ran"],
                          failed=worker.counters["infra_failures"], last_heartbeat=now, last_seen=now,
                          policy_versions=tuple(worker.policy_versions()), isolation_ok=True, version=__version__,
                          facts={})

    async def _start_metrics(self) -> str | None:
        """Serve Prometheus metrics when asked to; returns where."""
        if self.metrics is None or not self.config.metrics_listen:
            return None
        self._metrics_server = MetricsServer(self.metrics, self.config.metrics_listen)
        await self._metrics_server.start()
        metrics_host = self.config.metrics_listen.rsplit(":", 1)[0] or "127.0.0.1"
        return f"{metrics_host}:{self._metrics_server.port}"

    @property
    def console_address(self) -> str | None:
        """HOST:PORT of the web console, once it serves; None when it does not."""
        return self._console.address if self._console is not None else None

    async def _start_console(self, services: dict[str, Any]) -> str | None:
        """Serve the web console when asked to; returns where."""
        if not self.config.http_listen:
            return None
        # aiohttp is a tenth of a second of every farmd's start: loaded only by one that serves a console.
        from farmd.api.console import ConsoleServer, Gateway

        self._console = ConsoleServer(Gateway(services, self.config.credentials), self.config.http_listen)
        await self._console.start()
        return self._console.address

    async def _reserve_consumer(self, consumer: str) -> None:
        """``consumer`` is farmd's own cursor (the Atropos feed's): no credential may read or ack under it, and
        the config naming it farmd's takes it from one that used it before."""
        assert self.store is not None
        taken = await self.store.names.take(CONSUMER, consumer)
        if taken is not None:
            log.warning("consumer %r was credential %r's; [atropos] consumer names it farmd's own, so it is farmd's "
                        "now", consumer, taken.credential,
                        extra={"event": "name_reassigned", "kind": CONSUMER, "bound_name": consumer,
                               "previous": taken.credential})

    async def _start_atropos(self) -> str | None:
        """Serve Atropos's HTTP API when asked to, its queue in the store; returns where."""
        if not self.config.atropos_listen:
            return None
        from farmd.api.atropos import AtroposServer
        from farmd.api.atropos_feed import AtroposFeed
        from farmd.atropos.queue import AtroposQueue

        assert self.store is not None and self.scheduler is not None
        unknown = sorted(set(self.config.atropos.envs) - set(self.catalog.names()))
        if unknown:
            raise ConfigError(f"[atropos] envs names {unknown}, which this farm does not serve")
        queue = AtroposQueue(self.store, stored=self.scheduler.delivery.stored)
        await queue.open()
        self._atropos = AtroposServer(queue, self.config.atropos_listen, self.config.credentials, self._budgets)
        await self._atropos.start()
        if self.config.atropos.envs and self.config.credentials:  # without, no name is anyone's
            await self._reserve_consumer(self.config.atropos.consumer)
        self._atropos_feed = AtroposFeed(self.scheduler.delivery, queue, self.config.atropos)
        await self._atropos_feed.start()
        return self._atropos.address

    async def _start_sandbox_fusion(self) -> str | None:
        """Serve SandboxFusion's HTTP API when asked to, on boxes of its own; returns where."""
        if not self.config.sandbox_fusion_listen:
            return None
        from farmd.api.sandbox_fusion import SandboxFusionServer

        self._sandbox_fusion = SandboxFusionServer(self.config.sandbox, self.config.sandbox_fusion_listen,
                                                   self.config.credentials, self._budgets)
        await self._sandbox_fusion.start()
        return self._sandbox_fusion.address

    def _write_runfile(self, addr: str, metrics_addr: str | None, console_addr: str | None = None,
                       atropos_addr: str | None = None, sandbox_fusion_addr: str | None = None) -> None:
        """Where a local farmctl or a test finds this farmd when it listens on port 0."""
        write_file(self.config.data_dir / "farmd.json",
                   json.dumps({"pid": os.getpid(), "addr": addr, "metrics": metrics_addr,
                               "console": console_addr, "atropos": atropos_addr,
                               "sandbox_fusion": sandbox_fusion_addr}).encode())

    def _remove_runfile(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            Path(self.config.data_dir / "farmd.json").unlink()

    async def _farm_key(self) -> VerifierKey:
        """The data directory's key on SQLite. On a shared database the farm's key is the database's, so every
        coordinator of the farm derives the same hidden inputs and welcomes nodes with the same key, with no file to
        copy between their hosts; the first coordinator's key becomes the farm's. Only the active coordinator gets
        here, so two never race to set it."""
        assert self.store is not None
        loop = asyncio.get_running_loop()
        if self.config.store is None:
            return await loop.run_in_executor(None, VerifierKey.load_or_create, self.config.data_dir)
        stored = await self.store.get_state(FARM_KEY_STATE)
        if stored is None:
            key = await loop.run_in_executor(None, VerifierKey.load_or_create, self.config.data_dir)
            await self.store.put_state(FARM_KEY_STATE, key.material().hex())
            return key
        return await loop.run_in_executor(None, VerifierKey.adopt, self.config.data_dir, bytes.fromhex(stored))

    def _lost_active(self) -> None:
        log.error("lost the connection that makes this the active coordinator: stopping, another takes over",
                  extra={"event": "active_lost"})
        self.lost_active = True
        self.request_stop()

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    async def wait(self) -> None:
        """Until a stop is asked for, or, on a joined node, until its coordinator refuses it for good
        (``JoinRefused`` is raised then)."""
        ended = self.joined.ended if self.joined is not None else None
        if ended is None:
            await self._stopping.wait()
            return
        stopping = asyncio.get_running_loop().create_task(self._stopping.wait())
        try:
            await asyncio.wait((stopping, ended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if ended.done() and not ended.cancelled():
            ended.result()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop intake, let rollouts in flight finish (or give their leases back), then close the store."""
        log.info("farmd stopping: no new calls, %gs grace for those in flight", grace_s)
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        if self._console is not None:
            await self._console.stop()
        if self._atropos_feed is not None:
            await self._atropos_feed.stop()
        if self._atropos is not None:
            await self._atropos.stop()
        if self._sandbox_fusion is not None:
            await self._sandbox_fusion.stop()
        if self.history is not None:
            await self.history.stop()
        if self.joined is not None:
            await self.joined.stop(grace_s)
        if self.nodes is not None:
            await self.nodes.stop()
        if self.funnel is not None:
            await self.funnel.stop()
        if self._attacker is not None:
            await self._attacker.aclose()
        if self.worker is not None:
            await self.worker.stop(grace_s)
            log.info("worker: %(ran)d rollouts run, %(infra_failures)d infrastructure failures", self.worker.counters)
        if self.weight_sync is not None:
            await self.weight_sync.aclose()
        await asyncio.gather(*(r.aclose() for r in self.replicas.values()))
        await asyncio.to_thread(OFFLOAD.close)  # after the workers: their last replies may be being read
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.sandbox is not None:
            await self.sandbox.close()
        if self.store is not None:
            await self.store.close()
        if self._data_lock is not None:  # else the run file is another farmd's
            await asyncio.get_running_loop().run_in_executor(None, self._remove_runfile)
            os.close(self._data_lock)
            self._data_lock = None
        self._log_counts()

    def _log_counts(self) -> None:
        """What this farmd did, in the figures an operator checks after a stop (arq's worker logs the same)."""
        done = self.scheduler.counters if self.scheduler is not None else {}
        worker = self.worker or (self.joined.worker if self.joined is not None else None)
        ran = worker.counters if worker is not None else {}
        counts = {"complete": done.get("completed", 0), "failed": done.get("failed", 0),
                  # a failure sent back to the queue and an expired lease requeued are both a retry
                  "retried": done.get("retried", 0) + done.get("requeued", 0),
                  "in_flight": ran.get("in_flight", 0), "given_back": ran.get("given_back", 0)}
        log.info("farmd stopped: %(complete)d complete, %(failed)d failed, %(retried)d retried, %(in_flight)d in "
                 "flight (%(given_back)d of them given back unfinished)", counts,
                 extra={"event": "stopped", **counts})


def _contributed(data: bytes, digest: str) -> ContributedEnvironment:
    """A joined node's approved contributed version, from the package its coordinator sent (blocking)."""
    try:
        package = read_package(data)
    except PackageError as exc:
        raise ConfigError("; ".join(exc.problems)) from exc
    if package.digest != digest:
        raise ConfigError(f"the package's files have digest {package.digest[:12]}, not {digest[:12]} as approved")
    return ContributedEnvironment(package)


async def serve(config: Config) -> None:
    """Run a node until SIGTERM or SIGINT, then stop it gracefully.

    A second signal raises ``ForcedStop`` at once, whatever the shutdown is waiting for, and leaves
    that shutdown unfinished: the caller is to exit without waiting for anything (``farmd serve``
    does), since that is what a second Ctrl-C asks for.
    """
    daemon = Daemon(config)
    loop = asyncio.get_running_loop()
    forced: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not daemon.stop_requested:
            daemon.request_stop()
        elif not forced.done():
            log.warning("second signal: exiting now")
            forced.set_result(None)

    async def lifetime() -> None:
        try:
            await daemon.start()
            await daemon.wait()
        finally:
            await daemon.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    # Raced rather than cancelled: parts of the shutdown rightly shield themselves from cancellation
    # (a flush mid-transaction), and a second signal must not wait for them.
    life = loop.create_task(lifetime(), name="farmd")
    try:
        await asyncio.wait((life, forced), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        life.cancel()
        await asyncio.gather(life, return_exceptions=True)
        raise
    if not life.done():
        raise ForcedStop("a second signal: farmd exits without finishing its shutdown")
    await life
    if daemon.lost_active:
        raise ActiveLost("this coordinator lost the lock that made it the farm's active one, and stopped so that "
                         "another may serve; started again, it waits as a standby")
