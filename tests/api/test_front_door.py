"""The front door of a real farmd: what a call may cost before it is authenticated, how large a
message may be, and how many calls may be open at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.rss import MB, PeakRss

TOKEN = "s3cret"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def raw_call(channel: grpc.Channel, method: str) -> Callable[..., Any]:
    return channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def code_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def open_calls_answer(addr: str) -> None:
    """Health and reflection answer without a token."""
    with grpc.insecure_channel(addr) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=10))
        assert "farm.v1.FarmService" in {s.name for s in replies[0].list_services_response.service}


def test_unauthenticated_calls_cost_next_to_nothing(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--token", TOKEN)
    body = b"\x0a" + bytes(60 * MB)  # 60 MB that a server which reads before it checks must hold whole
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(farm.addr, options=options) as channel:
        open_calls_answer(farm.addr)  # warm: the first call's one-off allocations are not the attack's
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        assert stub.GetStatus(farm_pb2.GetStatusRequest(), metadata=AUTH, timeout=10).workers == 0
        run = raw_call(channel, "/farm.v1.FarmService/CreateRun")

        def publish() -> Iterator[farm_pb2.PolicyChunk]:
            for _ in range(60):
                yield farm_pb2.PublishPolicyRequest(data=bytes(MB))

        with PeakRss(farm.proc.pid) as rss, ThreadPoolExecutor(12) as pool:
            unary = list(pool.map(lambda _: code_of(lambda: run(body, timeout=60)), range(12)))
            streams = list(pool.map(lambda _: code_of(lambda: stub.PublishPolicy(publish(), timeout=60)), range(12)))
            time.sleep(0.5)
            after = rss.now()
        assert {code for code, _ in unary + streams} == {grpc.StatusCode.UNAUTHENTICATED}, unary + streams
        assert "token" in unary[0][1]
        grew, kept = (rss.peak - rss.base) / MB, (after - rss.base) / MB
        assert grew < 150 and kept < 150, f"farmd grew {grew:.0f} MB (kept {kept:.0f} MB) for calls it refused"

        # Health checks are open to anyone: what they may send is small, and refused before it is parsed;
        # how many are read at once is bounded.
        check = raw_call(channel, "/grpc.health.v1.Health/Check")
        big_check = health_pb2.HealthCheckRequest(service="x" * (MB - 100)).SerializeToString()
        with PeakRss(farm.proc.pid) as rss, ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(lambda _: code_of(lambda: check(big_check, timeout=60)), range(64)))
        assert {code for code, _ in codes} == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes[:3]
        assert any("Health/Check takes messages of at most" in msg for _, msg in codes), codes[:3]
        assert (rss.peak - rss.base) / MB < 150, f"open calls cost farmd {(rss.peak - rss.base) / MB:.0f} MB"
    assert farm.proc.poll() is None
    open_calls_answer(farm.addr)


def test_messages_over_the_limit_are_refused_and_the_daemon_stays_up(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--token", TOKEN)
    with grpc.insecure_channel(farm.addr, options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        # Over the method's own limit (a run names an environment and an agent: kilobytes at most) ...
        code, msg = code_of(lambda: stub.CreateRun(farm_pb2.CreateRunRequest(env="x" * (200 << 10), agent="reference",
                                                                 rollouts=1), metadata=AUTH, timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "Run" in msg, (code, msg)
        # Under it, a name the farm does not know is refused as such, and the refusal quotes only some of it:
        # a status's details travel in a header that clients refuse past 16 KiB.
        code, msg = code_of(lambda: stub.CreateRun(farm_pb2.CreateRunRequest(env="é" * 30_000, agent="reference",
                                                                 rollouts=1), metadata=AUTH, timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "no environment" in msg and len(msg) <= 500, code
        # ... and over what any call may send.
        code, msg = code_of(lambda: stub.CreateRun(farm_pb2.CreateRunRequest(env="x" * (20 * MB), agent="reference",
                                                                 rollouts=1), metadata=AUTH, timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, msg)
        # A policy chunk larger than the chunks clients send.
        chunk = farm_pb2.PublishPolicyRequest(data=bytes(3 * MB))
        code, msg = code_of(lambda: stub.PublishPolicy(iter([chunk]), metadata=AUTH, timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, msg)
        # The largest legitimate request still fits: a policy chunk.
        assert stub.PublishPolicy(iter([farm_pb2.PublishPolicyRequest(data=bytes(MB))]), metadata=AUTH, timeout=30).size == MB
    with FarmClient(farm.addr, token=TOKEN) as client:
        assert client.status()["workers"] == 0
    assert farm.proc.poll() is None, "the daemon stays up"
    open_calls_answer(farm.addr)


def _hold(stub: farm_pb2_grpc.FarmStub, n: int, release: threading.Event) -> list[grpc.Future]:
    """``n`` calls that stay open until ``release`` is set (publishes that send a chunk, then wait),
    or [] if one of them was turned away (a refused call ends at once; one let in stays open)."""
    def chunks() -> Iterator[farm_pb2.PolicyChunk]:
        yield farm_pb2.PublishPolicyRequest(sha256="0" * 64, data=b"x")  # a hash it does not have: never a policy
        release.wait(60)

    calls = [stub.PublishPolicy.future(chunks(), metadata=AUTH, timeout=60) for _ in range(n)]
    time.sleep(0.5)
    if all(not c.done() for c in calls):
        return calls
    release.set()
    for c in calls:
        c.exception(timeout=30)
    release.clear()
    return []


def _until(predicate: Callable[[], Any], timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


def test_concurrent_calls_are_bounded_and_open_calls_have_their_own_room(running_farm,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    config = tmp_path / "farm.toml"
    config.write_text("[farm]\nmax_concurrent_calls = 3\n")
    farm = running_farm("--workers", "0", "--token", TOKEN, "--config", str(config))
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        status = lambda: code_of(lambda: stub.GetStatus(farm_pb2.GetStatusRequest(), metadata=AUTH, timeout=10))  # noqa: E731

        # Calls cancelled at any stage give their room back: afterwards three can still be held open.
        for _ in range(30):
            stub.CreateRun.future(farm_pb2.CreateRunRequest(env="x", agent="y", rollouts=1), metadata=AUTH, timeout=10).cancel()
        release = threading.Event()
        held = _until(lambda: _hold(stub, 3, release))
        try:
            code, msg = status()
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent_calls" in msg, (code, msg)
            open_calls_answer(farm.addr)  # a full farm still says it is alive
            # Unauthenticated callers learn nothing about how busy the farm is.
            assert code_of(lambda: stub.GetStatus(farm_pb2.GetStatusRequest(), timeout=10))[0] == \
                grpc.StatusCode.UNAUTHENTICATED
        finally:
            release.set()
        for fut in held:
            assert fut.exception(timeout=30).code() == grpc.StatusCode.INVALID_ARGUMENT
        _until(lambda: status()[0] == grpc.StatusCode.OK)

        # Open calls (health watchers) have a room of their own: they cannot crowd out the farm's calls.
        health = health_pb2_grpc.HealthStub(channel)
        watchers = []
        try:
            while True:
                watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=60)
                try:
                    next(watch)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    break
                watchers.append(watch)
                assert len(watchers) <= 64, "open calls are not bounded"
            assert status()[0] == grpc.StatusCode.OK
        finally:
            for watch in watchers:
                watch.cancel()
        _until(lambda: code_of(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10))[0]
               == grpc.StatusCode.OK)
    assert farm.proc.poll() is None
