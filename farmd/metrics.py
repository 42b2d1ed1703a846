"""What a node reports to Prometheus, and the HTTP endpoint (prometheus_client's own) it is scraped from.

Counters and histograms are updated where things happen (a rollout ends, a box
exits, a call returns); figures that need the store (queue depth, consumer lag) are
refreshed by the scheduler's upkeep loop, so a scrape never touches SQLite. The
endpoint runs in prometheus_client's thread, so a scrape never waits on the event loop
either. Each daemon has its own registry: two farms in one process (tests) never mix.

Every label's values are bounded: environments come from the registry, endpoints from
the config, gRPC methods from the service's definition (anything else is ``other``),
and consumers are the few the scheduler reports, each removed when it stops reporting it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import platform
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from farm.v1 import farm_pb2
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from farmd import __version__
from farmd.errors import ConfigError
from farmd.records import Trajectory

log = logging.getLogger("farmd.metrics")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
OTHER = "other"
"""The label value for anything outside a label's known set (an unknown method, an unconfigured endpoint)."""

_SERVICE = farm_pb2.DESCRIPTOR.services_by_name["FarmService"]
_METHODS = {f"/{_SERVICE.full_name}/{m.name}": m.name for m in _SERVICE.methods}


@dataclass(frozen=True, slots=True)
class _RolloutSeries:
    passed: Counter
    failed: Counter
    verify: Histogram
    total: Histogram


class Metrics:
    def __init__(self, *, endpoints: Iterable[str] = ()) -> None:
        """``endpoints``: the configured model endpoints' names, the only values of ``endpoint`` labels."""
        self.registry = CollectorRegistry(auto_describe=True)
        """Where the figures are kept; ``exposed`` is what a scrape reads."""
        self.exposed = CollectorRegistry(support_collectors_without_names=True)
        self.exposed.register(_WithoutCreated(self.registry))
        r = self.registry
        Info("farm_build", "The farmd serving these figures", registry=r).info(
            {"version": __version__, "python": platform.python_version()})
        self.rollouts = Counter("farm_rollouts", "Rollouts ended, by environment and outcome "
                                "(passed, failed: scored; infra_failure: retried, never scored)",
                                ["env", "outcome"], registry=r)
        self.verdict_seconds = Histogram("farm_verdict_seconds", "Time to verify one attempt", ["env"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.rollout_seconds = Histogram("farm_rollout_seconds", "Time from a leased job to its verdict", ["env"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self._rollout_series: dict[str, _RolloutSeries] = {}
        """Each environment's rollout series (``rollout_ended``): as many as ``labels`` keeps anyway."""
        self.stored = Counter("farm_trajectories_stored", "Trajectories committed to the store", registry=r)
        self.tokens = Counter("farm_model_tokens", "Tokens of stored trajectories, as their model servers "
                              "reported them: prompt (read) or completion (written)", ["kind"], registry=r)
        self.endpoint_errors = Counter("farm_endpoint_errors", "Rollouts a model endpoint failed (an "
                                       "infrastructure failure, retried), by the endpoint's configured name",
                                       ["endpoint"], registry=r)
        self.queue = Gauge("farm_queue_jobs", "Jobs waiting (queued) and running (leased)", ["state"], registry=r)
        self.consumer_lag = Gauge("farm_consumer_lag", "Trajectories stored but not yet acked, by consumer and "
                                  "by what its cursor counts (trajectories, or groups for whole-group streams)",
                                  ["consumer", "cursor"], registry=r)
        self.policy_version = Gauge("farm_policy_version", "The policy version jobs are leased with", registry=r)
        self.streams = Gauge("farm_streams_open", "Trainer streams open now", registry=r)
        self.grpc_calls = Counter("farm_grpc_calls", "API calls ended, by method and status code",
                                  ["method", "code"], registry=r)
        self.grpc_seconds = Histogram("farm_grpc_call_seconds", "API call time, by method (a stream: as long as "
                                      "it stays open)", ["method"], buckets=_LATENCY_BUCKETS, registry=r)
        # A fleet's trust in its nodes: by kind and outcome only (node names are the status rows', unbounded here).
        self.node_results_refused = Counter("farm_node_results_refused", "Results joined nodes reported under "
                                            "another job's identity (environment, agent, seed, ...): not stored",
                                            registry=r)
        self.node_checks = Counter("farm_node_checks", "Joined nodes' results the coordinator checked, by kind "
                                   "(reverify: verified again; canary: a known-answer job) and outcome (agreed, "
                                   "disagreed, inconclusive: it could not judge; dropped: too many waiting)",
                                   ["kind", "outcome"], registry=r)
        self.node_quarantines = Counter("farm_node_quarantines", "Joined nodes quarantined: their verdicts "
                                        "disagreed with the coordinator's, or they kept reporting under other leases",
                                        registry=r)
        self.nodes_quarantined = Gauge("farm_nodes_quarantined", "Nodes quarantined now (until an operator clears "
                                       "them)", registry=r)
        self._endpoints = frozenset(endpoints)
        self._lag_series: set[tuple[str, str]] = set()
        # Series that exist before anything happened, so a rate over them starts at zero, not at the first event.
        for kind in ("prompt", "completion"):
            self.tokens.labels(kind)
        for name in self._endpoints:
            self.endpoint_errors.labels(name)
        for kind in ("reverify", "canary"):
            for outcome in ("agreed", "disagreed", "inconclusive", "dropped"):
                self.node_checks.labels(kind, outcome)

    def watch_boxes(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Report the sandbox's box outcomes (it counts them; it does not know about Prometheus)."""
        self.registry.register(_BoxOutcomes(counts))

    def rollout_ended(self, env: str, passed: bool, verify_s: float, total_s: float) -> None:
        """A scored rollout of ``env``: counted and timed. Each environment's series are looked up once: a rollout's
        figures cost 9 us with three ``labels`` lookups, 3.7 us without (measured)."""
        series = self._rollout_series.get(env)
        if series is None:
            series = self._rollout_series[env] = _RolloutSeries(
                self.rollouts.labels(env, "passed"), self.rollouts.labels(env, "failed"),
                self.verdict_seconds.labels(env), self.rollout_seconds.labels(env))
        (series.passed if passed else series.failed).inc()
        series.verify.observe(verify_s)
        series.total.observe(total_s)

    def stored_trajectories(self, trajectories: Iterable[Trajectory]) -> None:
        """Trajectories just committed: counted, with their tokens."""
        n = prompt = completion = 0
        for t in trajectories:
            n += 1
            prompt += t.usage.prompt_tokens
            completion += t.usage.completion_tokens
        self.stored.inc(n)
        self.tokens.labels("prompt").inc(prompt)
        self.tokens.labels("completion").inc(completion)

    def endpoint_failed(self, agent: str) -> None:
        """A rollout of ``agent`` (a job's spec, ``openai:MODEL@NAME[?...]``) failed because its endpoint did."""
        self.endpoint_errors.labels(self.endpoint_label(agent)).inc()

    def endpoint_label(self, agent: str) -> str:
        # Read as farmd.agents.registry reads a spec: the name follows the last '@', up to any query.
        if not agent.startswith("openai:"):
            return OTHER
        name = agent.rpartition("@")[2].partition("?")[0]
        return name if name in self._endpoints else OTHER

    def set_consumer_lag(self, lag: Mapping[tuple[str, str], float]) -> None:
        """The lag of each (consumer, cursor) reported now; a series not reported again is removed."""
        for labels, value in lag.items():
            self.consumer_lag.labels(*labels).set(value)
        for labels in self._lag_series - lag.keys():
            self.consumer_lag.remove(*labels)
        self._lag_series = set(lag)


class _WithoutCreated(Collector):
    """A registry's figures less the ``_created`` samples of its counters and histograms.

    They would double the series for a timestamp Prometheus does not use; prometheus_client's own
    switch for them (``disable_created_metrics``) is process-wide, this is one registry's.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            created = metric.name + "_created"
            metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


class _BoxOutcomes(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("farm_box_outcomes", "Boxes ended, by how: exit_0, exit_nonzero, signal, "
                                     "the bound hit (wall_time, memory, ...), or start_failed", labels=["outcome"])
        # Scrapes run in the endpoint's thread while the loop counts: dict() copies in one step under the GIL.
        for outcome, n in sorted(dict(self._counts()).items()):
            family.add_metric([outcome], n)
        yield family


class GrpcMetrics(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Counts every API call by method and status code, and times it.

    Placed first among the server's interceptors, so calls the others turn away (no token, no
    room) are counted with the code they were given.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        method = _METHODS.get(details.method, OTHER)
        if handler is None:  # grpc answers UNIMPLEMENTED without a handler to wrap
            self._metrics.grpc_calls.labels(method, grpc.StatusCode.UNIMPLEMENTED.name).inc()
            return handler
        return _observed(handler, method, self._ended)

    def _ended(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self._metrics.grpc_calls.labels(method, code.name).inc()
        self._metrics.grpc_seconds.labels(method).observe(seconds)


_Ended = Callable[[str, grpc.StatusCode, float], None]


def _observed(handler: grpc.RpcMethodHandler[Any, Any], method: str, ended: _Ended
              ) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` reporting how each call ended; its shape (which of the four kinds) unchanged."""
    behaviors = (handler.unary_unary, handler.unary_stream, handler.stream_unary, handler.stream_stream)
    if not all(b is None or inspect.iscoroutinefunction(b) or inspect.isasyncgenfunction(b) for b in behaviors):
        return handler  # a synchronous handler runs in grpc's threads; farmd registers none
    decode, encode = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_wrap(handler.unary_unary, method, ended), decode, encode)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_wrap(handler.unary_stream, method, ended), decode, encode)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_wrap(handler.stream_unary, method, ended), decode, encode)
    both = handler.stream_stream
    assert both is not None
    return grpc.stream_stream_rpc_method_handler(_wrap(both, method, ended), decode, encode)


def _code(exc: BaseException | None, context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode:
    """The status a call ended with: the one set or aborted with (the caller has it, even when the
    handler was cancelled after), else what grpc makes of how it ended."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if exc is None:
        return grpc.StatusCode.OK
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


def _wrap(behavior: Callable[..., Any], method: str, ended: _Ended) -> Callable[..., Any]:
    """The behavior, timed, whatever its requests are (one or a stream: it passes them on untouched).
    The wrapper keeps the behavior's kind (coroutine or async generator): grpc treats the two differently."""
    if inspect.isasyncgenfunction(behavior):
        async def replies(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            start = time.monotonic()
            failure: BaseException | None = None
            try:
                async for reply in behavior(request, context):
                    yield reply
            except BaseException as exc:
                failure = exc
                raise
            finally:
                ended(method, _code(failure, context), time.monotonic() - start)
        return replies

    async def run(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        start = time.monotonic()
        failure: BaseException | None = None
        try:
            return await behavior(request, context)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            ended(method, _code(failure, context), time.monotonic() - start)
    return run


class MetricsServer:
    """``GET /metrics`` from prometheus_client's HTTP server, in a thread of its own."""

    def __init__(self, metrics: Metrics, listen: str) -> None:
        self.metrics = metrics
        self.listen = listen
        self.port = 0
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        host, _, port = self.listen.rpartition(":")
        if not port.isdigit():
            raise ConfigError(f"cannot serve metrics on {self.listen!r}: give HOST:PORT (port 0: any free port)")
        host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
        try:
            # Binding resolves the host name: off the event loop.
            server, self._thread = await asyncio.get_running_loop().run_in_executor(
                None, lambda: start_http_server(int(port), host, registry=self.metrics.exposed))
        except (OSError, OverflowError) as exc:
            raise ConfigError(f"cannot serve metrics on {self.listen}: {getattr(exc, 'strerror', None) or exc}"
                              ) from exc
        self._server = server
        self.port = server.server_port
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    async def stop(self) -> None:
        """Stop serving and wait for the server's thread to end."""
        if self._server is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._shut_down, self._server)
            self._server = None

    def _shut_down(self, server: WSGIServer) -> None:
        server.shutdown()  # returns once serve_forever has, within its poll interval (half a second)
        server.server_close()
        if self._thread is not None:
            self._thread.join()
