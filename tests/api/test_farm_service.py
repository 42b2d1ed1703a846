"""The gRPC API of a real farmd: the trainer stream, acks, policies, and bad input that changes nothing."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import grpc
import pytest
import torch
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient
from farm_client.record import PosedTask

pytestmark = pytest.mark.sandbox

ENV = "rg:chain_sum"  # verified in-process: many rollouts a second, so the tests are about the stream


def wait_done(client: FarmClient, runs: list[int], timeout_s: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = client.progress(runs)
        if progress["done"] + progress["failed"] == progress["jobs"]:
            return progress
        time.sleep(0.1)
    raise AssertionError(f"rollouts did not finish: {progress}")


@pytest.fixture
def farm(running_farm):  # type: ignore[no-untyped-def]
    running = running_farm("--workers", "2")
    with FarmClient(running.addr) as client:
        yield running, client


def test_stream_resumes_after_the_last_ack_with_no_gap(farm) -> None:  # type: ignore[no-untyped-def]
    _, client = farm
    run = client.run(ENV, "reference", 40, group_size=4)
    assert run["jobs"] == 40 and len(run["group_ids"]) == 10
    assert wait_done(client, [run["id"]]) == {"jobs": 40, "done": 40, "failed": 0, "cancelled": 0, "passed": 40}

    stream = client.batches("trainer", batch_size=8)
    first, second = next(stream), next(stream)
    stream.close()
    assert [t.seq for t in first.trajectories] == list(range(1, 9))
    assert client.ack(first) == 8
    # the trainer restarts: what it did not ack comes again, nothing before it, nothing skipped
    seen = []
    for batch in client.batches("trainer", batch_size=8):
        seen += [t.seq for t in batch.trajectories]
        client.ack(batch)
        if len(seen) >= 32:
            break
    assert seen == list(range(9, 41)) and [t.seq for t in second.trajectories] == seen[:8]
    ids = {t.id for t in client.trajectories(limit=100)}
    assert len(ids) == 40
    (trainer,) = [c for c in client.status()["consumers"] if c["name"] == "trainer"]
    assert (trainer["cursor"], trainer["lag"], trainer["whole_groups"]) == (40, 0, False)


def test_whole_groups_with_tensors_whole_or_only_what_a_loss_reads(farm) -> None:  # type: ignore[no-untyped-def]
    _, client = farm
    run = client.run(ENV, "random", 24, group_size=6)
    run2 = client.run(ENV, "reference", 12, group_size=6)
    wait_done(client, [run["id"], run2["id"]])
    got: list[dict[str, Any]] = []
    for batch in client.batches("grpo", batch_size=12, whole_groups=True, tensors=True):
        sizes = Counter(batch.group_ids)
        assert set(sizes.values()) == {6}, "a group never straddles two batches"
        assert len(batch) <= 12
        assert batch.rewards.shape == (len(batch),) and batch.advantages.dtype == torch.float32
        for g in sizes:
            in_group = [i for i, gid in enumerate(batch.group_ids) if gid == g]
            assert abs(float(batch.advantages[in_group].sum())) < 1e-3
        got += batch.trajectories
        client.ack(batch)
        if len(got) == 36:
            break
    assert len({t.id for t in got}) == 36
    assert all(t.reward == 1.0 for t in got if t.agent == "reference")
    grpo = [c for c in client.status()["consumers"] if c["name"] == "grpo"]
    assert [(c["whole_groups"], c["cursor"], c["lag"]) for c in grpo] == [(True, 6, 0)]

    # A trainer's stream (tokens_only): the same batches, without what no loss reads.
    lean = next(client.batches("lean", batch_size=12, whole_groups=True, tensors=True, tokens_only=True))
    whole = {t.id: t for t in got}
    assert [t.id for t in lean.trajectories] == [t.id for t in got[:len(lean)]]
    assert torch.equal(lean.advantages, next(client.batches("again", batch_size=12, whole_groups=True,
                                                            tensors=True)).advantages)
    for t in lean.trajectories:
        assert whole[t.id].final and whole[t.id].task.prompt and whole[t.id].messages is not None
        assert whole[t.id].scores, "a whole record carries its verdicts"
        assert (t.final, t.task, t.steps, t.verdict_details, t.scores) == ("", PosedTask(), [], {}, [])
        assert (t.reward, t.passed, t.status, t.turns, t.group_id) == \
            (whole[t.id].reward, whole[t.id].passed, whole[t.id].status, whole[t.id].turns, whole[t.id].group_id)
    with pytest.raises(grpc.RpcError) as err:
        next(client.batches("both", summary_only=True, tokens_only=True))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in (err.value.details() or "")


def test_policies_are_versioned_by_content_and_scripted_agents_run_none(farm) -> None:  # type: ignore[no-untyped-def]
    _, client = farm
    early = client.run(ENV, "reference", 4, group_size=4)
    wait_done(client, [early["id"]])

    v1 = client.publish_policy(b"weights-1")
    assert client.publish_policy(b"weights-1") == v1, "the same content is the same version"
    state = {"w": torch.arange(6.0)}
    v2 = client.publish_policy(state)
    v3 = client.publish_policy(uri="s3://bucket/ckpt-3")
    assert (v1["version"], v2["version"], v3["version"]) == (1, 2, 3)
    version, blob, _ = client.get_policy(v2["sha256"])
    assert version == 2
    import io

    assert torch.equal(torch.load(io.BytesIO(blob))["w"], state["w"])
    assert client.get_policy() == (3, b"", "s3://bucket/ckpt-3")
    assert client.status()["policy_version"] == 3

    late = client.run(ENV, "reference", 4, group_size=4)
    wait_done(client, [late["id"]])
    every = next(client.batches("everything", batch_size=64))
    assert len(every) == 8 and {t.policy_version for t in every.trajectories} == {0}, \
        "a scripted agent runs no farm policy: its trajectories carry no version, not the farm's newest"

    with grpc.insecure_channel(client.addr) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.PublishPolicy(iter([farm_pb2.PublishPolicyRequest(sha256="0" * 64, data=b"x")]), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "hashes to" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            list(stub.GetPolicy(farm_pb2.GetPolicyRequest(sha256="f" * 64), timeout=10))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_input_gets_clear_errors_and_loses_nothing(farm) -> None:  # type: ignore[no-untyped-def]
    running, client = farm
    queued = client.run(ENV, "reference", 8, group_size=4)
    wait_done(client, [queued["id"]])
    before = client.status()

    def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as err:
            call()
        return err.value.code(), err.value.details() or ""

    code, msg = code_of(lambda: client.run("no-such-env", "reference", 1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no-such-env" in msg
    code, msg = code_of(lambda: client.run(ENV, "telepathy", 1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "telepathy" in msg
    code, msg = code_of(lambda: client.run(ENV, "reference", 0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "rollouts" in msg
    code, msg = code_of(lambda: client.run(ENV, "reference", 10_000_000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, msg = code_of(lambda: client.run(ENV, "reference", 4, group_size=100_000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "group_size" in msg
    code, msg = code_of(lambda: client.ack("trainer", up_to=10_000))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "only reached 8" in msg
    code, msg = code_of(lambda: next(client.batches("")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "consumer" in msg
    code, msg = code_of(lambda: client.trajectory(999_999))
    assert code == grpc.StatusCode.NOT_FOUND

    with grpc.insecure_channel(running.addr) as channel:
        garbage = channel.unary_unary("/farm.v1.FarmService/CreateRun", request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
        code, msg = code_of(lambda: garbage(b"\xff\xff\xff\xff not a protobuf", timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "CreateRunRequest" in msg, (code, msg)
        huge = farm_pb2.CreateRunRequest(env="x" * (65 << 20), agent="reference", rollouts=1)
        code, msg = code_of(lambda: farm_pb2_grpc.FarmServiceStub(channel).CreateRun(huge, timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, msg)
        code, msg = code_of(lambda: channel.unary_unary("/farm.v1.FarmService/Nope")(b"", timeout=10))
        assert code == grpc.StatusCode.UNIMPLEMENTED

    after = client.status()
    assert running.proc.poll() is None, "the daemon stays up"
    assert after["queue"] == before["queue"] and after["last_seq"] == before["last_seq"] == 8
    assert len(client.trajectories(limit=100)) == 8
