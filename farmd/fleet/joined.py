"""``farmd serve --join HOST:PORT``: a node that runs the worker role only, for a coordinator elsewhere.

It checks its own host first: a host that cannot isolate never joins (and the coordinator would refuse
it anyway, from the report sent with its hello). Then it connects, and once welcomed (the verifier key
arrives with the welcome, over the authenticated connection: never on a command line, never in a box)
it runs the same worker a single-node farm runs, its leases taken over the link. Its data directory
holds the outbox and the policy cache; nothing of the coordinator's store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc, intake_pb2, intake_pb2_grpc, node_pb2
from farm_client.addresses import grpc_target
from farm_client.convert import seconds

from farmd import __version__
from farmd.agents.registry import RedTeamFactory
from farmd.config import Config, sandbox_for
from farmd.envs import Environment, VerifyContext
from farmd.envs.catalog import CONTRIBUTED_PREFIX, Catalog
from farmd.errors import ConfigError, FarmError, InfraFailure, IsolationUnavailable, JoinRefused
from farmd.fleet.link import Link
from farmd.fleet.outbox import Outbox
from farmd.fleet.policy_cache import PolicyCache
from farmd.fleet.remote import RemoteLeases
from farmd.metrics import Metrics
from farmd.private import make_data_dir_private, write_file
from farmd.records import MAX_HELD_JOBS, NODE_NAME
from farmd.rollout import Worker
from farmd.sandbox import Check, Sandbox, check_host
from farmd.sandbox.host import missing
from farmd.verifier import VerifierKey

log = logging.getLogger("farmd.fleet")

MAX_POLICY_FETCH_BYTES = 1 << 30
MAX_PACKAGE_FETCH_BYTES = 64 << 20
"""Far above what intake accepts (``[intake] max_package_bytes``): a bound on a coordinator gone wrong."""


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def channel_credentials(config: Config) -> grpc.ChannelCredentials | None:
    """TLS to the coordinator when a CA or a client certificate is configured (system roots without a CA)."""
    if config.tls_ca is None and config.tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read(config.tls_ca), private_key=_read(config.tls_key),
                                        certificate_chain=_read(config.tls_cert))


def host_facts() -> dict[str, str]:
    return {"cores": str(os.cpu_count() or 0), "memory_bytes": str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
            "kernel": platform.release(), "python": platform.python_version(), "host": socket.gethostname()}


ContributedMaker = Callable[[bytes, str], Environment]
"""An approved contributed version's environment from its package's bytes and the digest it must have; a
``FarmError`` if it is not that package (the daemon's: the fleet never imports intake, which would bring the
funnel's store with it)."""


class JoinedNode:
    def __init__(self, config: Config, workers: int, metrics: Metrics | None = None,
                 contributed: ContributedMaker | None = None, red_team: RedTeamFactory | None = None) -> None:
        assert config.join is not None
        self.config = config
        self.catalog = Catalog()
        """The built-ins, and the approved contributed versions this node has fetched for its jobs."""
        self._contributed = contributed
        self._red_team = red_team
        self._fetching_env = asyncio.Lock()
        self.workers = workers
        self.metrics = metrics
        self.name = config.node_name or socket.gethostname().split(".")[0]
        if not NODE_NAME.fullmatch(self.name):
            raise ConfigError(f"node name {self.name!r}: use 1-64 letters, digits, '.', '_' or '-' (--node-name)")
        self.owner = f"{self.name}:{os.getpid()}:{secrets.token_hex(4)}"
        self.sandbox: Sandbox | None = None
        self.worker: Worker | None = None
        self.link: Link | None = None
        self.remote: RemoteLeases | None = None
        self._checks: list[Check] = []
        self._link_task: asyncio.Task[None] | None = None

    @property
    def ended(self) -> asyncio.Task[None] | None:
        """The link's task: it ends only when the coordinator refused this node for good."""
        return self._link_task

    async def start(self, stopping: asyncio.Event | None = None) -> None:
        """Check the host, connect, and once welcomed start the worker. ``stopping``: a stop asked for while
        still waiting to be welcomed (a coordinator that is down, or that refuses the handshake) ends the
        wait, not only a welcome."""
        loop = asyncio.get_running_loop()
        config = self.config
        self._checks = await loop.run_in_executor(None, check_host, config.sandbox)
        gaps = missing(self._checks)
        if gaps:
            raise IsolationUnavailable(gaps)
        await loop.run_in_executor(None, make_data_dir_private, config.data_dir)
        self.sandbox = Sandbox(sandbox_for(config, self.workers))
        await self.sandbox.start()
        outbox = Outbox(config.data_dir / "outbox")
        await outbox.open()
        policies = PolicyCache(config.data_dir / "policies", config.policy_cache_bytes, self._fetch_policy)
        await policies.open()
        assert config.join is not None
        self.link = Link(grpc_target(config.join), self._hello, on_connect=self._on_connect,
                         credentials=channel_credentials(config), token=config.token)
        self.remote = RemoteLeases(self.link, outbox, policies)
        self._link_task = loop.create_task(self.link.run(), name="node-link")
        if len(outbox):
            log.info("%d results from an earlier run are buffered: they go to the coordinator first", len(outbox))
        log.info("node %s joining %s (%d slots)", self.name, config.join, self.workers,
                 extra={"event": "joining", "coordinator": config.join, "node": self.name})
        welcomed = loop.create_task(self.link.welcomed.wait())
        stop = loop.create_task(stopping.wait()) if stopping is not None else None
        await asyncio.wait([t for t in (welcomed, self._link_task, stop) if t is not None],
                           return_when=asyncio.FIRST_COMPLETED)
        for waiting in (welcomed, stop):
            if waiting is not None and not waiting.done():
                waiting.cancel()
        if self._link_task.done():
            await self._link_task  # raises JoinRefused
        if not welcomed.done() or welcomed.cancelled():
            return  # stopped before it ever joined
        welcome = self.link.welcome
        assert welcome is not None
        key = VerifierKey(welcome.verifier_key)
        lease_s, heartbeat_s = seconds(welcome.lease), seconds(welcome.heartbeat_every)
        if lease_s <= 0:  # the welcome of a farmd from before these were Durations: its leases are unknown here
            raise JoinRefused(f"the coordinator at {config.join} (farmd {welcome.version[:40]!r}) says no lease "
                              "time: it is older than this node; run the same farmd version on both")
        lease_s = min(lease_s, 3 * heartbeat_s) if heartbeat_s > 0 else lease_s
        self.worker = Worker(self.remote, VerifyContext(sandbox=self.sandbox, key=key), slots=self.workers,
                             lease_s=lease_s, node=self.name, metrics=self.metrics, endpoints=config.endpoints,
                             policies=policies, owner=self.owner, envs=self.catalog.get, prepare=self._prepare_env,
                             red_team=self._red_team, torch_threads=config.torch_threads)
        await self.worker.start()
        write_file(config.data_dir / "farmd.json",
                   json.dumps({"pid": os.getpid(), "node": self.name, "coordinator": config.join}).encode())

    def _hello(self) -> node_pb2.NodeHello:
        hello = node_pb2.NodeHello(
            name=self.name, owner=self.owner, capacity=self.workers, version=__version__, facts=host_facts(),
            isolation=[farm_pb2.IsolationCheck(name=c.name, ok=c.ok, detail=c.detail, fix=c.fix)
                       for c in self._checks])
        if self.worker is not None and self.remote is not None:  # joining again: say what it holds
            held = self.worker.held() | self.remote.holding()
            if len(held) <= MAX_HELD_JOBS:
                hello.held.job_ids.extend(sorted(held))
                hello.held.SetInParent()  # present even when it holds nothing: then every lease of its goes back
            else:
                log.info("joining again holding %d jobs, more than a hello names: leases this node never received "
                         "wait out their time", len(held))
        return hello

    async def _on_connect(self, welcome: node_pb2.Welcome, first: bool) -> None:
        assert self.remote is not None
        await self.remote.on_connect(welcome, first)

    async def _fetch_policy(self, sha256: str) -> bytes:
        """The policy's content from the coordinator, in its chunks (checked by the cache)."""
        assert self.link is not None
        data = bytearray()
        channel = self.link.channel()
        try:
            stub = farm_pb2_grpc.FarmServiceStub(channel)
            call = stub.GetPolicy(farm_pb2.GetPolicyRequest(sha256=sha256), metadata=self.link.metadata,
                                  timeout=600)
            async for chunk in call:
                data += chunk.data
                if len(data) > MAX_POLICY_FETCH_BYTES:
                    raise InfraFailure(f"policy {sha256[:12]} is larger than {MAX_POLICY_FETCH_BYTES} bytes")
        except grpc.aio.AioRpcError as exc:
            raise InfraFailure(f"fetching policy {sha256[:12]}: {exc.code().name}: {exc.details()}") from exc
        finally:
            await channel.close(None)
        return bytes(data)

    async def _prepare_env(self, env: str) -> None:
        """A job's contributed environment, fetched from the coordinator the first time one comes: its package
        as approved, checked against the digest the submission recorded, then run like any environment."""
        if not env.startswith(CONTRIBUTED_PREFIX) or self._contributed is None:
            return
        async with self._fetching_env:  # jobs of one new version arrive together: one fetch for all
            if env in self.catalog.names():
                return
            data, digest = await self._fetch_package(env)
            try:
                served = await asyncio.to_thread(self._contributed, data, digest)
            except FarmError as exc:
                raise InfraFailure(f"the package of {env} does not load: {exc}", transient=False) from exc
            if served.name != env:
                raise InfraFailure(f"the coordinator sent a package that is not {env} as approved", transient=False)
            self.catalog.add(served)
            log.info("fetched %s from the coordinator", env, extra={"event": "env_fetched", "env": env})

    async def _fetch_package(self, env: str) -> tuple[bytes, str]:
        assert self.link is not None
        data, digest = bytearray(), ""
        channel = self.link.channel()
        try:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            call = stub.GetEnvironmentPackage(intake_pb2.GetEnvironmentPackageRequest(env=env),
                                              metadata=self.link.metadata, timeout=120)
            async for chunk in call:
                digest = digest or chunk.digest
                data += chunk.data
                if len(data) > MAX_PACKAGE_FETCH_BYTES:
                    raise InfraFailure(f"{env}'s package is larger than {MAX_PACKAGE_FETCH_BYTES} bytes",
                                       transient=False)
        except grpc.aio.AioRpcError as exc:
            gone = exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
            raise InfraFailure(f"fetching {env}: {exc.code().name}: {exc.details()}", transient=not gone) from exc
        finally:
            await channel.close(None)
        return bytes(data), digest

    async def stop(self, grace_s: float) -> None:
        if self.worker is not None:
            await self.worker.stop(grace_s)
            log.info("worker: %(ran)d rollouts run, %(infra_failures)d infrastructure failures", self.worker.counters)
        if self.link is not None:
            await self.link.close()
        if self._link_task is not None:
            self._link_task.cancel()
            await asyncio.gather(self._link_task, return_exceptions=True)
        if self.sandbox is not None:
            await self.sandbox.close()
        await asyncio.to_thread(lambda: (self.config.data_dir / "farmd.json").unlink(missing_ok=True))


__all__ = ["JoinedNode"]
