"""Prometheus metrics over HTTP and JSON logs from a real farmd."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
from farm_client import FarmClient

pytestmark = pytest.mark.sandbox


def scrape(addr: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_metrics_count_rollouts_boxes_queue_and_lag(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2", "--metrics", "127.0.0.1:0", "--log-format", "json")
    metrics = json.loads((farm.data_dir / "farmd.json").read_text())["metrics"]
    with FarmClient(farm.addr) as client:
        runs = [client.run("rg:chain_sum", "reference", 8, group_size=4), client.run("py-func", "random", 4)]
        groups = [g for r in runs for g in r["group_ids"]]
        deadline = time.monotonic() + 90
        while (p := client.progress(groups))["done"] < 12:
            assert time.monotonic() < deadline, p
            time.sleep(0.1)
        batch = next(client.batches("trainer", batch_size=5))
        client.ack(batch)
    deadline = time.monotonic() + 10
    while True:  # gauges follow the scheduler's upkeep (every second)
        m = scrape(metrics)
        if m.get('farm_consumer_lag{consumer="trainer",cursor="trajectories"}') == 7 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert m['farm_rollouts_total{env="rg:chain_sum",outcome="passed"}'] == 8
    assert m['farm_rollouts_total{env="py-func",outcome="failed"}'] == 4, "random attempts fail, scored"
    assert m["farm_trajectories_stored_total"] == 12
    assert m['farm_queue_jobs{state="queued"}'] == 0 and m['farm_queue_jobs{state="leased"}'] == 0
    assert m['farm_consumer_lag{consumer="trainer",cursor="trajectories"}'] == 7
    assert m['farm_verdict_seconds_count{env="py-func"}'] == 4
    boxes = sum(v for k, v in m.items() if k.startswith("farm_box_outcomes_total"))
    assert boxes >= 4, "py-func attempts ran in boxes"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{metrics}/nope", timeout=10)
    assert err.value.code == 404
    err.value.close()

    assert farm.stop() == 0
    lines = [json.loads(line) for line in farm.log.read_text().splitlines() if line.startswith("{")]
    listening = [r for r in lines if r.get("event") == "listening"]
    assert listening and listening[0]["addr"] == farm.addr and listening[0]["level"] == "info"
    assert all(re.match(r"\d{4}-\d\d-\d\dT", r["ts"]) for r in lines)


def test_bad_metrics_address_is_a_usage_error(running_farm) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AssertionError, match="cannot serve metrics"):
        running_farm("--workers", "0", "--metrics", "127.0.0.1:notaport")
