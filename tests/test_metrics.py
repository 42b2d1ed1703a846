"""Prometheus metrics, scraped over HTTP from a real farmd, and its JSON logs."""

from __future__ import annotations

import asyncio
import json
import platform
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from farm_client import FarmClient

from farmd import __version__
from tests.agents.fake_endpoint import Reply, fake_endpoint
from tests.conftest import RunningFarm

pytestmark = pytest.mark.sandbox

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Scrape:
    """One scrape of ``/metrics``: its text, and each sample's value by name and labels (in any order)."""

    def __init__(self, addr: str) -> None:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain")
            self.text = reply.read().decode()
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for line in self.text.splitlines():
            if line and not line.startswith("#"):
                match = _SAMPLE.match(line)
                assert match, line
                name, labels, value = match.groups()
                self.samples[name, frozenset(_LABEL.findall(labels or ""))] = float(value)

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def labelled(self, name: str, label: str) -> set[str]:
        """The values ``label`` takes in ``name``'s samples."""
        return {dict(ls)[label] for n, ls in self.samples if n == name and label in dict(ls)}


def metrics_addr(farm: RunningFarm) -> str:
    return str(json.loads((farm.data_dir / "farmd.json").read_text())["metrics"])


def scrape_until(addr: str, ready: Callable[[Scrape], bool], timeout_s: float = 10) -> Scrape:
    """Gauges follow the scheduler's upkeep (every second): scrape until ``ready`` or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = Scrape(addr)
        if ready(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def test_metrics_count_rollouts_boxes_queue_lag_and_calls(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2", "--metrics", "127.0.0.1:0", "--log-format", "json")
    metrics = metrics_addr(farm)
    first = Scrape(metrics)
    assert "_created" not in first.text, "no _created series: a timestamp nobody reads, doubling every series"
    assert first.get("farm_build_info", version=__version__, python=platform.python_version()) == 1
    assert first.get("farm_model_tokens_total", kind="prompt") == 0
    with FarmClient(farm.addr) as client:
        runs = [client.run("rg:chain_sum", "reference", 8, group_size=4), client.run("py-func", "random", 4)]
        deadline = time.monotonic() + 90
        while (p := client.progress([r["id"] for r in runs]))["done"] < 12:
            assert time.monotonic() < deadline, p
            time.sleep(0.1)
        client.ack(next(client.batches("trainer", batch_size=5)))
        whole = next(client.batches("grouper", batch_size=4, whole_groups=True))
        client.ack(whole)
        with pytest.raises(grpc.RpcError) as missing:
            client.get_run(99999)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        passerby = client.batches("passerby", batch_size=1)
        next(passerby)  # streaming now, never acks
        m = scrape_until(metrics, lambda m: m.get("farm_consumer_lag", consumer="passerby",
                                                  cursor="trajectories") is not None
                         and m.get("farm_consumer_lag", consumer="grouper", cursor="groups") == 12 - len(whole))
        passerby.close()  # gone: its stream cancelled, nothing acked
        gone = scrape_until(metrics, lambda m: "passerby" not in m.labelled("farm_consumer_lag", "consumer"))
        unknown = grpc.insecure_channel(farm.addr)
        with pytest.raises(grpc.RpcError):
            unknown.unary_unary("/farm.v1.FarmService/NoSuchMethod")(b"", timeout=10)
        unknown.close()

    assert m.get("farm_rollouts_total", env="rg:chain_sum", outcome="passed") == 8
    assert m.get("farm_rollouts_total", env="py-func", outcome="failed") == 4, "random attempts fail, scored"
    assert m.get("farm_trajectories_stored_total") == 12
    assert m.get("farm_model_tokens_total", kind="completion") == 0, "scripted agents use no model"
    assert m.get("farm_queue_jobs", state="queued") == 0 and m.get("farm_queue_jobs", state="leased") == 0
    assert m.get("farm_consumer_lag", consumer="trainer", cursor="trajectories") == 7
    assert m.get("farm_consumer_lag", consumer="grouper", cursor="groups") == 12 - len(whole), \
        "a whole-group consumer's lag is counted too"
    assert m.get("farm_consumer_lag", consumer="passerby", cursor="trajectories") == 12
    assert m.get("farm_verdict_seconds_count", env="py-func") == 4
    boxes = sum(v for (name, _), v in m.samples.items() if name == "farm_box_outcomes_total")
    assert boxes >= 4, "py-func attempts ran in boxes"

    assert "passerby" not in gone.labelled("farm_consumer_lag", "consumer"), "a consumer gone is not reported"
    assert {"trainer", "grouper"} <= gone.labelled("farm_consumer_lag", "consumer"), "those that acked stay"
    # A call is counted as its handler returns, just after the caller has its status: scrape until the last is in.
    after = scrape_until(metrics, lambda m: m.get("farm_grpc_calls_total", method="other", code="UNIMPLEMENTED") is not None)
    assert after.get("farm_grpc_calls_total", method="CreateRun", code="OK") == 2
    assert after.get("farm_grpc_call_seconds_count", method="CreateRun") == 2
    assert (after.get("farm_grpc_calls_total", method="GetRun", code="OK") or 0) >= 2
    assert after.get("farm_grpc_calls_total", method="GetRun", code="NOT_FOUND") == 1
    assert after.get("farm_grpc_calls_total", method="Ack", code="OK") == 2
    assert (after.get("farm_grpc_calls_total", method="StreamTrajectories", code="CANCELLED") or 0) >= 1, \
        "a stream counts when it ends, however it ends"
    calls = {tuple(sorted(labels)): v for (name, labels), v in after.samples.items() if name == "farm_grpc_calls_total"}
    assert after.get("farm_grpc_calls_total", method="other", code="UNIMPLEMENTED") == 1, calls
    methods = after.labelled("farm_grpc_calls_total", "method")
    assert "NoSuchMethod" not in methods and "/farm.v1.FarmService/NoSuchMethod" not in methods
    assert "_created" not in after.text

    assert farm.stop() == 0
    lines = [json.loads(line) for line in farm.log.read_text().splitlines() if line.startswith("{")]
    listening = [r for r in lines if r.get("event") == "listening"]
    assert listening and listening[0]["addr"] == farm.addr and listening[0]["level"] == "info"
    assert all(re.match(r"\d{4}-\d\d-\d\dT", r["ts"]) for r in lines)
    with pytest.raises(OSError):
        Scrape(metrics)  # stopped with farmd


async def test_model_tokens_and_endpoint_errors_are_counted(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Tokens from stored trajectories' usage; a dead endpoint's failures by its name; ``run --wait`` fails."""
    async with fake_endpoint(lambda request: Reply.text("<answer>3</answer>", prompt_tokens=11,
                                                        completion_tokens=7)) as ep:
        cfg = tmp_path / "farm.toml"
        cfg.write_text(f'[scheduler]\nmax_attempts = 1\n\n[endpoints.good]\nurl = "{ep.url}"\n\n'
                       '[endpoints.dead]\nurl = "http://127.0.0.1:1/v1"\nmax_attempts = 1\n')

        def scenario() -> tuple[Scrape, dict[str, object], dict[str, object], int]:
            farm = running_farm("--workers", "2", "--metrics", "127.0.0.1:0", "--config", str(cfg))
            with FarmClient(farm.addr) as client:
                good = client.run("rg:chain_sum", "openai:fake@good", 2)
                deadline = time.monotonic() + 30
                while (good := client.get_run(good["id"]))["state"] == "running":
                    assert time.monotonic() < deadline, good
                    time.sleep(0.1)
            dead = farm.farmctl("run", "--env", "rg:chain_sum", "--agent", "openai:fake@dead", "--rollouts", "3",
                                "--wait", "--json", check=False)
            m = scrape_until(metrics_addr(farm),
                             lambda m: m.get("farm_endpoint_errors_total", endpoint="dead") == 3)
            return m, good, json.loads(dead.stdout), dead.returncode

        m, good, dead, code = await asyncio.to_thread(scenario)
    assert good["done"] == 2 and good["failed"] == 0
    assert code == 1 and dead["failed"] == 3 and dead["state"] != "succeeded", "run --wait exits 1 on failed rollouts"
    assert m.get("farm_model_tokens_total", kind="prompt") == 22
    assert m.get("farm_model_tokens_total", kind="completion") == 14
    assert m.get("farm_endpoint_errors_total", endpoint="dead") == 3
    assert m.get("farm_endpoint_errors_total", endpoint="good") == 0, "each configured endpoint has a series"
    assert m.labelled("farm_endpoint_errors_total", "endpoint") == {"good", "dead"}
    assert m.get("farm_rollouts_total", env="rg:chain_sum", outcome="infra_failure") == 3


def test_bad_metrics_address_is_a_usage_error(running_farm) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AssertionError, match="cannot serve metrics"):
        running_farm("--workers", "0", "--metrics", "127.0.0.1:notaport")


def test_metrics_address_taken_is_a_usage_error(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--metrics", "127.0.0.1:0")
    with pytest.raises(AssertionError, match="cannot serve metrics"):
        running_farm("--workers", "0", "--metrics", metrics_addr(farm))
