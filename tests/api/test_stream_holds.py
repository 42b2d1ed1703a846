"""No attempt and no client can jam the stream: bounded records travel in size-packed messages, old
records holding broken text are repaired on the way out, demand follows the trainers actually consuming,
and one consumer's name can never move another's cursor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient

from farmd.records import Step, Trajectory
from farmd.store import Store
from tests.conftest import farmctl

ENV = "rg:chain_sum"


def traj(job: Any, final: str, reasons: list[str] | None = None) -> Trajectory:
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=0, reward=0.0, passed=False,
                      status="ok", reasons=reasons or ["wrong"], flags=[], verifier_version="1",
                      steps=[Step(duration=0.1)], final=final,
                      node="n1")


async def prefill(data: Path, groups: list[list[str]]) -> list[int]:
    """Store groups of trajectories with the given finals, as a farm would have; returns their ids."""
    store = await Store.open(data / "farm.db")
    ids = []
    try:
        for finals in groups:
            await store.enqueue([(ENV, 1, 1, "reference", len(finals))])
            jobs = await store.lease("w", len(finals), 60, lambda _agent: 0)
            ids += await store.complete([("w", traj(j, f)) for j, f in zip(jobs, finals, strict=True)])
    finally:
        await store.close()
    return ids


def poison(db: Path, traj_id: int) -> None:
    """Rewrite a stored trajectory the way farmd stored text before it was repaired on the way in: a lone
    surrogate kept as a JSON escape, which decodes to a string no encoder accepts."""
    body = {"steps": [{"action": "\\ud800", "observation": "out \\udfff", "exit_code": 1, "seconds": 0.1}],
            "final": "def f(x): raise ValueError('\\ud800')", "timings": {}, "details": {"e": "\\ud800"}}
    raw = json.dumps(body).replace("\\\\ud", "\\ud").encode()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE trajectories SET body=?, reasons=? WHERE id=?",
                     (zlib.compress(raw), '["test 3: raised ValueError: \\ud800"]', traj_id))


def raw_messages(addr: str, batch_size: int, until: Callable[[list[tuple[int, bool, int]]], bool]
                 ) -> list[tuple[int, bool, int]]:
    """A whole-groups stream's messages as farmd sends them, (trajectories, more, up_to) each, until ``until``."""
    with grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        stub = farm_pb2_grpc.FarmServiceStub(channel)
        stream = stub.StreamTrajectories(farm_pb2.StreamTrajectoriesRequest(consumer="raw", batch_size=batch_size,
                                                                            whole_groups=True), timeout=30)
        messages: list[tuple[int, bool, int]] = []
        for message in stream:
            messages.append((len(message.trajectories), message.more, message.up_to))
            if until(messages):
                break
        stream.cancel()
    return messages


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, list[int]]:
    data = tmp_path / "data"
    data.mkdir()
    wide = "\U0001F600" * (200 * 1024)  # 200 Ki characters of 4 bytes: each record near its bound
    ids = asyncio.run(prefill(data, [["x" * (24 << 20)] * 3, [wide] * 16, ["ok"]]))
    poison(data / "farm.db", ids[-1])
    return data, ids


def test_big_groups_and_broken_old_records_travel(stored, running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data, ids = stored
    farm = running_farm("--workers", "0", data_dir=data)
    with FarmClient(farm.addr) as client:
        got: list[Any] = []
        for batch in client.batches("t", batch_size=64, whole_groups=True):
            assert len(set(batch.group_ids)) == len(batch.group_ids) // max(1, len(batch)) or batch.trajectories
            got += batch.trajectories
            client.ack(batch)
            if len(got) == len(ids):
                break
        assert sorted(t.id for t in got) == sorted(ids)
        by_id = {t.id: t for t in got}
        assert "truncated" in by_id[ids[0]].flags and len(by_id[ids[0]].final) <= 256 * 1024
        assert by_id[ids[3]].final == "\U0001F600" * (200 * 1024), "a record within bounds comes whole"
        assert "\ufffd" in by_id[ids[-1]].final and "\ufffd" in by_id[ids[-1]].reasons[0]

        # Not whole groups, with and without steps; the listing pages by size; one at a time.
        for summary in (False, True):
            seen = []
            for batch in client.batches(f"flat{summary}", batch_size=64, summary_only=summary):
                seen += [t.id for t in batch.trajectories]
                client.ack(batch)
                if len(seen) == len(ids):
                    break
            assert sorted(seen) == sorted(ids)
        listed = [t for page in client.trajectory_pages(full=True) for t in page]
        assert [t.id for t in listed] == sorted(ids)
        old = client.trajectory(ids[-1])  # stored by an older farmd, upgraded on read
        assert "\ufffd" in old.steps[0].action and old.steps[0].exit_code == 1

    # The 16 records near their bound make one batch of more than one message: the raw stream says so.
    messages = raw_messages(farm.addr, 64, until=lambda got: sum(n for n, _, _ in got) == len(ids))
    assert any(more for _, more, _ in messages), messages
    assert all(up_to == 0 for _, more, up_to in messages if more), "only a batch's last message can be acked"

    for where, place in (("farmd", ("--addr", farm.addr)), ("data", ())):
        for fmt in ("jsonl", "parquet"):
            out = tmp_path / f"export-{where}.{fmt}"
            direct = ("--data", str(data)) if where == "data" else ()
            farmctl(*place, "export", "--format", fmt, "--out", str(out), *direct)
            assert out.stat().st_size > 0
        lines = (tmp_path / f"export-{where}.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(ids) and "\ufffd" in json.loads(lines[-1])["final"]
    listing = farmctl("--addr", farm.addr, "trajectories", "list", "--limit", "50")
    assert listing.returncode == 0


def demand_farm(running_farm, tmp_path: Path, **scheduler: Any):  # type: ignore[no-untyped-def]
    table = {"demand_agent": "reference", "demand_envs": [ENV], "demand_buffer": 8, "group_size": 4,
             "maintenance_every_s": 0.1, **scheduler}
    lines = ["[scheduler]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    config = tmp_path / "farm.toml"
    config.write_text("\n".join(lines) + "\n")
    return running_farm("--workers", "2", "--config", str(config))


def consume(addr: str, consumer: str, want: int, timeout_s: float, **stream: Any) -> int:
    """Take and ack batches until ``want`` trajectories came, or the time is up; how many came."""
    got = 0
    deadline = time.monotonic() + timeout_s
    with FarmClient(addr) as client:
        batches = client.batches(consumer, batch_size=8, **stream)
        result: list[Any] = []

        def take() -> None:
            try:
                result.append(next(batches))
            except Exception as exc:  # the stream closed under us
                result.append(exc)

        while got < want and time.monotonic() < deadline:
            result.clear()
            reader = threading.Thread(target=take, daemon=True)
            reader.start()
            reader.join(max(0.1, deadline - time.monotonic()))
            if not result or isinstance(result[0], Exception):
                break
            got += len(result[0])
            client.ack(result[0])
        batches.close()
    return got


@contextlib.contextmanager
def rogue(addr: str) -> Iterator[None]:
    """A client streaming as ``rogue`` that takes the first batch it is sent and sits on it, never acking."""
    with grpc.insecure_channel(addr) as channel:
        stream = farm_pb2_grpc.FarmServiceStub(channel).StreamTrajectories(farm_pb2.StreamTrajectoriesRequest(consumer="rogue",
                                                                                           batch_size=4))
        reader = threading.Thread(target=lambda: next(stream, None), daemon=True)
        reader.start()
        try:
            yield
        finally:
            stream.cancel()
            reader.join(5)


@pytest.mark.sandbox
def test_a_whole_groups_trainer_that_acks_keeps_getting_work(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = demand_farm(running_farm, tmp_path)
    assert consume(farm.addr, "grpo", 24, 60, whole_groups=True) >= 24, "demand stopped after one buffer"


@pytest.mark.sandbox
def test_a_consumer_that_never_acks_does_not_halt_production(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = demand_farm(running_farm, tmp_path, consumer_stall_s=1.0)
    with rogue(farm.addr):
        assert consume(farm.addr, "trainer", 24, 60) >= 24, "a silent consumer pinned demand"
        deadline = time.monotonic() + 10
        while True:  # its clock runs from the batch it was sent and never acked: stalled after consumer_stall_s
            states = {c["name"]: c["state"] for c in FarmClient(farm.addr).status()["consumers"]}
            if states["rogue"] == "stalled" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert states["rogue"] == "stalled" and states["trainer"] in ("consuming", "closed"), states


@pytest.mark.sandbox
def test_named_trainers_are_the_only_ones_demand_follows(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    farm = demand_farm(running_farm, tmp_path, demand_consumers=["trainer"])
    with rogue(farm.addr):
        assert consume(farm.addr, "trainer", 24, 60) >= 24


def test_a_name_cannot_move_another_consumers_cursor(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    data.mkdir()
    asyncio.run(prefill(data, [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]))
    farm = running_farm("--workers", "0", data_dir=data)
    with FarmClient(farm.addr) as client:
        assert client.ack("x", 1, whole_groups=True) == 1
        assert client.ack("x#groups", 6) == 6  # a trajectory cursor that happens to be named like a group one
        with grpc.insecure_channel(farm.addr) as channel:
            stream = farm_pb2_grpc.FarmServiceStub(channel).StreamTrajectories(
                farm_pb2.StreamTrajectoriesRequest(consumer="x", batch_size=64, whole_groups=True), timeout=10)
            first = next(stream)
            stream.cancel()
        assert len(first.trajectories) == 6 and first.up_to == 4, "x's groups after its own cursor, all of them"


def test_a_name_that_is_not_utf8_is_refused_at_the_edge(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0")
    good = farm_pb2.AckRequest(consumer="ab", up_to=0).SerializeToString()
    with grpc.insecure_channel(farm.addr) as channel:
        ack = channel.unary_unary("/farm.v1.FarmService/Ack")
        with pytest.raises(grpc.RpcError) as refused:
            ack(good.replace(b"ab", b"a\xed"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert farm_pb2.AckResponse.FromString(ack(good, timeout=10)).cursor == 0  # the next is served as ever


def test_a_batch_of_hundreds_comes_in_messages_and_reaches_the_client_whole(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """farmd builds each message while the one before it travels, and the client reads each as it comes; a
    trainer still gets the batch whole, in order, acked once."""
    data = tmp_path / "data"
    data.mkdir()
    ids = asyncio.run(prefill(data, [[f"{g}-{i}" for i in range(8)] for g in range(25)]))
    farm = running_farm("--workers", "0", data_dir=data)
    messages = raw_messages(farm.addr, 200, until=lambda got: not got[-1][1])
    assert [(n, more) for n, more, _ in messages] == [(64, True), (64, True), (64, True), (8, False)], messages
    with FarmClient(farm.addr) as client:
        batch = next(client.batches("trainer", batch_size=200, whole_groups=True))
        assert [t.id for t in batch.trajectories] == ids
        assert [t.final for t in batch.trajectories] == [f"{g}-{i}" for g in range(25) for i in range(8)]
        assert client.ack(batch) == batch.up_to == messages[-1][2]
