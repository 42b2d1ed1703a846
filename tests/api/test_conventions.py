"""The API as gRPC users expect it, against a real farmd: buf-clean protos, reflection under v1 and
v1alpha, google.rpc error details on every error, page tokens, and runs as resources."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status

from farmd.api.reflection import v1_messages
from tests.conftest import BIN

ROOT = Path(__file__).resolve().parents[2]
BUF = BIN / "buf"
FAST = "rg:chain_sum"  # verified in process: many rollouts a second
SLOW = "py-func"  # a box per rollout: slow enough that a run is still queued when it is cancelled
TERMINAL = {farm_pb2.RUN_STATE_SUCCEEDED, farm_pb2.RUN_STATE_FAILED, farm_pb2.RUN_STATE_CANCELLED}


def error_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The code, ErrorInfo reason and metadata of the error ``call`` ends in, read from the
    ``grpc-status-details-bin`` trailer the way any grpc client reads it."""
    with pytest.raises(grpc.RpcError) as raised:
        call()
    err = raised.value
    status = rpc_status.from_call(err)  # also checks the details agree with the status's code and message
    assert status is not None, f"{err.code()} {err.details()!r} came without google.rpc details"
    infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1, status
    info = error_details_pb2.ErrorInfo()
    infos[0].Unpack(info)
    assert info.domain == "farm" and info.reason.isupper(), info
    return err.code(), info.reason, dict(info.metadata)


@pytest.fixture
def coordinator(farm_in_process: Callable[..., str]) -> Iterator[grpc.Channel]:
    """A channel to a farm with no workers: everything but rollouts."""
    with grpc.insecure_channel(farm_in_process()) as channel:
        yield channel


# -- the contract itself -------------------------------------------------------------------------


def _buf() -> str:
    found = str(BUF) if BUF.exists() else shutil.which("buf")
    if found is None:
        pytest.skip("buf is not installed: `make setup` installs it (buf-bin, the dev extra)")
    return found


def test_protos_are_clean_under_buf_lint_standard() -> None:
    lint = subprocess.run([_buf(), "lint", "protos"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "STANDARD" in (ROOT / "protos" / "buf.yaml").read_text()


def test_buf_lint_would_catch_a_bad_name(tmp_path: Path) -> None:
    """The check above can fail: the same config refuses a request type named after nothing."""
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    proto = tmp_path / "protos" / "farm" / "v1" / "farm.proto"
    proto.write_text(proto.read_text().replace("rpc Ack(AckRequest)", "rpc Ack(Acknowledgement)")
                     + "\nmessage Acknowledgement {}\n")
    lint = subprocess.run([_buf(), "lint", "protos"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert lint.returncode != 0 and 'should be named "AckRequest"' in lint.stdout, lint.stdout + lint.stderr


# -- reflection ----------------------------------------------------------------------------------


def _reflect(channel: grpc.Channel, version: str, requests: list[dict[str, str]]) -> list[Any]:
    if version == "v1":
        request_type, response_type = v1_messages()
    else:
        request_type, response_type = reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
    call = channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                                 request_serializer=request_type.SerializeToString,
                                 response_deserializer=response_type.FromString)
    return list(call(iter([request_type(**r) for r in requests]), timeout=10))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_answers_under_v1_and_v1alpha(farm_in_process: Callable[..., str], version: str) -> None:
    addr = farm_in_process(token="s3cret")  # reflection stays open without the token
    with grpc.insecure_channel(addr) as channel:
        listed, farm_file, reflection_file, unknown = _reflect(channel, version, [
            {"list_services": ""},
            {"file_containing_symbol": "farm.v1.FarmService"},
            {"file_containing_symbol": f"grpc.reflection.{version}.ServerReflection"},
            {"file_containing_symbol": "farm.v1.NoSuchThing"}])
    assert {s.name for s in listed.list_services_response.service} == {
        "farm.v1.FarmService", "farm.v1.NodeService", "farm.v1.IntakeService", "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}

    files = {}
    for raw in farm_file.file_descriptor_response.file_descriptor_proto:
        parsed = descriptor_pb2.FileDescriptorProto.FromString(raw)
        files[parsed.name] = parsed
    assert {"farm/v1/farm.proto", "farm/v1/trajectory.proto", "google/protobuf/timestamp.proto"} <= set(files)
    (service,) = files["farm/v1/farm.proto"].service
    assert {m.name for m in service.method} >= {"GetStatus", "CreateRun", "GetRun", "ListRuns", "CancelRun",
                                                "ListTrajectories", "StreamTrajectories", "Rescore"}

    (raw,) = reflection_file.file_descriptor_response.file_descriptor_proto
    described = descriptor_pb2.FileDescriptorProto.FromString(raw)
    assert described.package == f"grpc.reflection.{version}"
    assert [m.input_type for m in described.service[0].method] == [
        f".grpc.reflection.{version}.ServerReflectionRequest"]

    assert unknown.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_a_v1_reflection_client_sees_the_farm(farm_in_process: Callable[..., str]) -> None:
    """buf curl, a v1 reflection client of its own, lists and calls the farm knowing no proto."""
    url = f"http://{farm_in_process()}"
    base = [_buf(), "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--reflect-protocol", "grpc-v1"]
    listed = subprocess.run([*base, "--list-methods", url], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert {"farm.v1.FarmService/GetRun", "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} <= set(
        listed.stdout.split())
    called = subprocess.run([*base, "-d", '{"id": 42}', f"{url}/farm.v1.FarmService/GetTrajectory"],
                            capture_output=True, text=True, timeout=60)
    assert called.returncode != 0 and '"google.rpc.ErrorInfo"' in called.stderr, called.stdout + called.stderr
    assert '"not_found"' in called.stderr and "no trajectory 42" in called.stderr


# -- errors --------------------------------------------------------------------------------------


def test_errors_carry_google_rpc_details(coordinator: grpc.Channel) -> None:
    channel = coordinator
    stub = farm_pb2_grpc.FarmServiceStub(channel)
    cases: list[tuple[Callable[[], Any], grpc.StatusCode, str]] = [
        (lambda: stub.GetTrajectory(farm_pb2.GetTrajectoryRequest(id=404), timeout=10),
         grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        (lambda: stub.GetRun(farm_pb2.GetRunRequest(run_id=404), timeout=10),
         grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        (lambda: stub.CancelRun(farm_pb2.CancelRunRequest(run_id=404), timeout=10),
         grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        (lambda: stub.ListTrajectories(farm_pb2.ListTrajectoriesRequest(page_token="not-a-token"), timeout=10),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (lambda: stub.ListRuns(farm_pb2.ListRunsRequest(page_token="bm9wZQ"), timeout=10),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (lambda: stub.Rescore(farm_pb2.RescoreRequest(env=FAST), timeout=10),
         grpc.StatusCode.FAILED_PRECONDITION, "NO_WORKERS"),
        (lambda: stub.PublishPolicy(iter([farm_pb2.PublishPolicyRequest(sha256="0" * 64, data=b"weights")]),
                                    timeout=10),
         grpc.StatusCode.INVALID_ARGUMENT, "POLICY_HASH_MISMATCH"),
        (lambda: stub.PublishPolicy(iter([farm_pb2.PublishPolicyRequest()]), timeout=10),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        # server-streaming calls end in errors through the same place
        (lambda: list(stub.GetPolicy(farm_pb2.GetPolicyRequest(), timeout=10)),
         grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        (lambda: list(stub.StreamTrajectories(farm_pb2.StreamTrajectoriesRequest(consumer=" "), timeout=10)),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        (lambda: stub.CreateRun(farm_pb2.CreateRunRequest(env=FAST, agent="telepathy", rollouts=1), timeout=10),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_AGENT"),
    ]
    for call, code, reason in cases:
        assert error_of(call)[:2] == (code, reason)

    raw = channel.unary_unary("/farm.v1.FarmService/GetRun", request_serializer=lambda b: b)
    assert error_of(lambda: raw(b"\xff\xff not a protobuf", timeout=10))[:2] == (
        grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")
    assert error_of(lambda: raw(b"\x00" * 70_000, timeout=10))[:2] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "MESSAGE_TOO_LARGE")
    nothing = channel.unary_unary("/farm.v1.FarmService/NoSuchMethod")
    assert error_of(lambda: nothing(b"", timeout=10))[:2] == (grpc.StatusCode.UNIMPLEMENTED, "UNIMPLEMENTED")


def test_a_missing_token_is_unauthenticated_with_details(farm_in_process: Callable[..., str]) -> None:
    with grpc.insecure_channel(farm_in_process(token="s3cret")) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        for metadata in [(), (("authorization", "Bearer wrong"),)]:
            assert error_of(lambda m=metadata: stub.GetStatus(farm_pb2.GetStatusRequest(), metadata=m, timeout=10)
                            )[:2] == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
        ok = stub.GetStatus(farm_pb2.GetStatusRequest(), metadata=(("authorization", "Bearer s3cret"),), timeout=10)
        assert ok.workers == 0


# -- lists and runs (these run rollouts: they need a box) ----------------------------------------


def _wait_run(stub: farm_pb2_grpc.FarmServiceStub, run_id: int, until: Callable[[farm_pb2.Run], bool],
              timeout_s: float = 60) -> farm_pb2.Run:
    deadline = time.monotonic() + timeout_s
    while True:
        run = stub.GetRun(farm_pb2.GetRunRequest(run_id=run_id), timeout=10).run
        if until(run):
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.05)


def _pages(stub: farm_pb2_grpc.FarmServiceStub, page_token: str = "", **request: Any
           ) -> list[farm_pb2.ListTrajectoriesResponse]:
    pages, token = [], page_token
    while True:
        page = stub.ListTrajectories(farm_pb2.ListTrajectoriesRequest(page_token=token, **request), timeout=10)
        pages.append(page)
        token = page.next_page_token
        if not token:
            return pages


@pytest.mark.sandbox
def test_trajectory_pages_neither_repeat_nor_skip(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2")
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        first = stub.CreateRun(farm_pb2.CreateRunRequest(env=FAST, agent="reference", rollouts=13, group_size=4),
                               timeout=10).run
        second = stub.CreateRun(farm_pb2.CreateRunRequest(env=FAST, agent="random", rollouts=8, group_size=4),
                                timeout=10).run
        for run in (first, second):
            _wait_run(stub, run.id, lambda r: r.state in TERMINAL)

        oldest = _pages(stub, page_size=5)
        assert [len(p.trajectories) for p in oldest] == [5, 5, 5, 5, 1]
        seqs = [t.seq for p in oldest for t in p.trajectories]
        assert seqs == list(range(1, 22)) and not any(p.capped for p in oldest)
        newest = _pages(stub, page_size=4, newest_first=True)
        assert [t.seq for p in newest for t in p.trajectories] == seqs[::-1]

        # Trajectories stored while a caller pages do not shift the pages it has yet to read.
        middle = stub.ListTrajectories(farm_pb2.ListTrajectoriesRequest(page_size=8, newest_first=True), timeout=10)
        third = stub.CreateRun(farm_pb2.CreateRunRequest(env=FAST, agent="reference", rollouts=4), timeout=10).run
        _wait_run(stub, third.id, lambda r: r.state in TERMINAL)
        rest = _pages(stub, page_size=8, newest_first=True, page_token=middle.next_page_token)
        assert [t.seq for p in [middle, *rest] for t in p.trajectories] == seqs[::-1]

        by_run = _pages(stub, page_size=3, run_id=second.id)
        assert [t.run_id for p in by_run for t in p.trajectories] == [second.id] * 8
        everything = stub.ListTrajectories(farm_pb2.ListTrajectoriesRequest(page_size=5000), timeout=10)
        assert len(everything.trajectories) == 25 and not everything.capped and not everything.next_page_token

        # A token names a place in one order: used with the other it is refused, not misread.
        assert error_of(lambda: stub.ListTrajectories(farm_pb2.ListTrajectoriesRequest(
            page_size=5, newest_first=True, page_token=oldest[0].next_page_token), timeout=10))[:2] == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


@pytest.mark.sandbox
def test_runs_are_resources(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2")
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        created = [stub.CreateRun(farm_pb2.CreateRunRequest(env=FAST, agent="reference", rollouts=n, group_size=2),
                                  timeout=10).run for n in (1, 2, 3, 4, 5)]
        assert [(r.rollouts, r.jobs, len(r.group_ids), r.env) for r in created] == [
            (n, n, (n + 1) // 2, FAST) for n in (1, 2, 3, 4, 5)]
        assert all(r.state == farm_pb2.RUN_STATE_RUNNING and r.HasField("created_at") for r in created)
        last = _wait_run(stub, created[-1].id, lambda r: r.state in TERMINAL)
        assert (last.state, last.done, last.passed, last.failed, last.cancelled) == (
            farm_pb2.RUN_STATE_SUCCEEDED, 5, 5, 0, 0)
        assert last.finished_at.ToNanoseconds() >= last.created_at.ToNanoseconds()

        listed, token = [], ""
        sizes = []
        while True:
            page = stub.ListRuns(farm_pb2.ListRunsRequest(page_size=2, page_token=token), timeout=10)
            listed += [r.id for r in page.runs]
            sizes.append(len(page.runs))
            token = page.next_page_token
            if not token:
                break
        assert listed == [r.id for r in reversed(created)] and sizes == [2, 2, 1], "newest first, each once"
        assert stub.ListRuns(farm_pb2.ListRunsRequest(page_size=5000), timeout=10).capped is False


@pytest.mark.sandbox
def test_cancel_drops_queued_jobs_and_lets_running_ones_finish(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "1")
    with grpc.insecure_channel(farm.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        slow = stub.CreateRun(farm_pb2.CreateRunRequest(env=SLOW, agent="reference", rollouts=12, group_size=4),
                              timeout=10).run
        after = stub.CreateRun(farm_pb2.CreateRunRequest(env=FAST, agent="reference", rollouts=4, group_size=4),
                               timeout=10).run
        deadline = time.monotonic() + 30
        while stub.GetStatus(farm_pb2.GetStatusRequest(), timeout=10).queue.leased == 0:
            assert time.monotonic() < deadline, "no rollout started"
            time.sleep(0.01)

        cancelled = stub.CancelRun(farm_pb2.CancelRunRequest(run_id=slow.id), timeout=10).run
        assert cancelled.state == farm_pb2.RUN_STATE_CANCELLED
        assert 0 < cancelled.cancelled < 12 and cancelled.done + cancelled.cancelled < 12, "one was running"

        # Queued behind the cancelled run, the next one runs at once; what was running is stored.
        _wait_run(stub, after.id, lambda r: r.state in TERMINAL)
        ended = _wait_run(stub, slow.id, lambda r: r.done + r.failed + r.cancelled == r.jobs)
        assert ended.state == farm_pb2.RUN_STATE_CANCELLED and ended.cancelled == cancelled.cancelled
        assert ended.done >= 1 and ended.finished_at.ToNanoseconds() > 0
        stored = _pages(stub, run_id=slow.id)
        assert len([t for p in stored for t in p.trajectories]) == ended.done
        again = stub.CancelRun(farm_pb2.CancelRunRequest(run_id=slow.id), timeout=10).run
        assert (again.state, again.cancelled, again.done) == (ended.state, ended.cancelled, ended.done)

        # A whole-groups stream takes the cancelled run's groups as far as they got and goes on past them.
        want = {t.id for p in _pages(stub) for t in p.trajectories}
        got: set[int] = set()
        stream = stub.StreamTrajectories(farm_pb2.StreamTrajectoriesRequest(
            consumer="grpo", whole_groups=True, batch_size=64, summary_only=True), timeout=30)
        for message in stream:
            got |= {t.id for t in message.trajectories}
            if got >= want:
                stream.cancel()
                break
        assert got == want
