"""Crash safety: kill -9 farmd twice in the middle of 2,000 rollouts; nothing is lost, nothing is doubled."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
from farm_client import FarmClient

from tests.conftest import farmctl

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

# Mostly an environment verified in-process (fast, so the run fits in the suite) and some
# that run in boxes, interleaved, so kills land on rollouts mid-box too.
WORKLOAD = [("rg:chain_sum", 180), ("py-func", 20)] * 5
TOTAL = sum(n for _, n in WORKLOAD)


class AckingTrainer(threading.Thread):
    """Consumes the stream, acking each batch before taking the next; rides through restarts."""

    def __init__(self, addr: str) -> None:
        super().__init__(daemon=True)
        self.addr = addr
        self.received: list[int] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with FarmClient(self.addr) as client:
                for batch in client.batches("crash-trainer", batch_size=50, reconnect_s=120):
                    self.received += [t.id for t in batch.trajectories]
                    client.ack(batch, retry_s=120)
                    if len(self.received) >= TOTAL or self.stop.is_set():
                        return
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc


@pytest.mark.timeout(600)
def test_kill_9_twice_loses_and_doubles_nothing(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2")
    port = farm.addr.rsplit(":", 1)[1]
    listen = f"127.0.0.1:{port}"  # restarts come back on the same address, as a real node would
    with FarmClient(farm.addr) as client:
        runs = [client.run(env, "reference", n, group_size=8)["id"] for env, n in WORKLOAD]
    trainer = AckingTrainer(farm.addr)
    trainer.start()
    try:
        for kill_at in (TOTAL // 4, TOTAL // 2):
            wait_for(farm.addr, lambda s, at=kill_at: s["last_seq"] >= at, timeout_s=240)
            farm.proc.kill()  # SIGKILL: no shutdown code runs
            farm.proc.wait()
            farm = running_farm("--workers", "2", data_dir=farm.data_dir, listen=listen)
        status = wait_for(farm.addr, lambda s: s["queue"]["queued"] + s["queue"]["leased"] == 0, timeout_s=300)
        assert status["queue"]["done"] == TOTAL and status["queue"]["failed"] == 0, status["queue"]
        with FarmClient(farm.addr) as client:
            assert client.progress(runs) == {"jobs": TOTAL, "done": TOTAL, "failed": 0, "cancelled": 0, "passed": TOTAL}
        trainer.join(120)
        assert trainer.error is None, trainer.error
        assert not trainer.is_alive(), f"the trainer got {len(trainer.received)} of {TOTAL}"
    finally:
        trainer.stop.set()
    assert len(trainer.received) == TOTAL and len(set(trainer.received)) == TOTAL, "each exactly once"

    assert farm.stop() == 0
    out = farm.data_dir.parent / "export.jsonl"
    farmctl("export", "--format", "jsonl", "--out", str(out), "--data", str(farm.data_dir))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in records]
    assert len(ids) == TOTAL and len(set(ids)) == TOTAL
    assert set(ids) == set(trainer.received)
    assert all(r["passed"] and r["reward"] == 1.0 for r in records), "reference attempts, scored honestly"
    restarts = farm.log.read_text().count("went back to the queue")
    assert restarts >= 1, "a restart requeued what the killed farmd held"


def wait_for(addr: str, ready, timeout_s: float) -> dict:  # type: ignore[no-untyped-def, type-arg]
    deadline = time.monotonic() + timeout_s
    status: dict = {}  # type: ignore[type-arg]
    with FarmClient(addr) as client:
        while time.monotonic() < deadline:
            try:
                status = client.status()
            except grpc.RpcError as exc:  # a channel that saw farmd down backs off before it reconnects
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(0.2)
                continue
            if ready(status):
                return status
            time.sleep(0.05)
    raise AssertionError(f"not ready after {timeout_s}s: {status}")
