"""What a node reports to Prometheus, and the small HTTP endpoint it is scraped from.

Counters and histograms are updated where things happen (a rollout ends, a box
exits); figures that need the store (queue depth, consumer lag) are refreshed by the
scheduler's upkeep loop, so a scrape never touches SQLite or blocks the event loop.
Each daemon has its own registry: two farms in one process (tests) never mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from farmd.errors import ConfigError

log = logging.getLogger("farmd.metrics")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rollouts = Counter("farm_rollouts", "Rollouts ended, by environment and outcome "
                                "(passed, failed: scored; infra_failure: retried, never scored)",
                                ["env", "outcome"], registry=r)
        self.verdict_seconds = Histogram("farm_verdict_seconds", "Time to verify one attempt", ["env"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.rollout_seconds = Histogram("farm_rollout_seconds", "Time from a leased job to its verdict", ["env"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.stored = Counter("farm_trajectories_stored", "Trajectories committed to the store", registry=r)
        self.queue = Gauge("farm_queue_jobs", "Jobs waiting (queued) and running (leased)", ["state"], registry=r)
        self.consumer_lag = Gauge("farm_consumer_lag", "Trajectories stored but not yet acked, by consumer and "
                                  "by what its cursor counts (trajectories, or groups for whole-group streams)",
                                  ["consumer", "cursor"], registry=r)
        self.policy_version = Gauge("farm_policy_version", "The policy version jobs are leased with", registry=r)
        self.streams = Gauge("farm_streams_open", "Trainer streams open now", registry=r)

    def watch_boxes(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Report the sandbox's box outcomes (it counts them; it does not know about Prometheus)."""
        self.registry.register(_BoxOutcomes(counts))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _BoxOutcomes(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("farm_box_outcomes", "Boxes ended, by how: exit_0, exit_nonzero, signal, "
                                     "the bound hit (wall_time, memory, ...), or start_failed", labels=["outcome"])
        for outcome, n in sorted(self._counts().items()):
            family.add_metric([outcome], n)
        yield family


class MetricsServer:
    """``GET /metrics`` over plain HTTP/1.0 on asyncio: enough for a Prometheus scrape, nothing else."""

    def __init__(self, metrics: Metrics, listen: str) -> None:
        self.metrics = metrics
        self.listen = listen
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        host, _, port = self.listen.rpartition(":")
        if not port.isdigit():
            raise ConfigError(f"cannot serve metrics on {self.listen!r}: give HOST:PORT (port 0: any free port)")
        try:
            self._server = await asyncio.start_server(self._serve, host or "127.0.0.1", int(port))
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self.listen}: {exc.strerror}") from exc
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", host or "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path = [*request.split(b"\r\n", 1)[0].split(b" "), b"", b""][:2]
            if method != b"GET":
                self._reply(writer, b"405 Method Not Allowed", b"text/plain", b"GET only\n")
            elif path.split(b"?")[0] != b"/metrics":
                self._reply(writer, b"404 Not Found", b"text/plain", b"try /metrics\n")
            else:
                self._reply(writer, b"200 OK", CONTENT_TYPE_LATEST.encode(), self.metrics.render())
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: bytes, content_type: bytes, body: bytes) -> None:
        writer.write(b"HTTP/1.0 " + status + b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
