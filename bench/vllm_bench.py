"""farm against a real vLLM server: its overhead on the server's own throughput, and the loop it runs.

- **Overhead.** One vLLM server (its CPU build, the loop's model). The same prompts (``arith`` tasks, as farm's agent
  sends them: its system message and the task) go through farm (``openai:policy@vllm`` rollouts, the endpoint's
  ``max_in_flight`` jobs at once, each a lease, a request, a verdict and a stored record, stamped with the
  server's weight label) and straight to the server from one asyncio client at the same concurrency, alternately.
  The figure is the median over the rounds of farm's rollouts/s over the server's requests/s in the round right
  after it: on two cores shared with other work the rates drift by half within a minute, and a ratio of neighbours
  drifts less than a ratio of medians. Each rate is taken two ways: over the whole round, and over its steady part
  (from the tenth of its rollouts done to nine tenths), which a farm that is never drained runs at: a round of a
  few seconds spends a good part of them filling and draining, once per round in farm (a run queued, leases
  taken, the last results flushed and read) and not in a client that only posts.
- **The loop.** ``make run ENGINE=vllm`` and the tiny loop (``make run``), each for the same budget: the held-out
  pass rate at level 1 against wall time, side by side.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from farm_client import FarmClient
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import verdicts
from bench.loop_bench import _held_out_curve
from farmd.cli.local_farmd import LocalFarmd
from farmd.cli.main_job import run_loop
from farmd.cli.vllm_server import VllmServer, ensure_model, vllm_python

GOALS = {"overhead_ratio": 0.9, "gain": 0.10, "versions": 5}


def _wait(client: FarmClient, run_id: int, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (run := client.get_run(run_id))["state"] == "running":
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} did not finish: {run}")
        time.sleep(0.02)
    return run


def _steady(times: list[float], total: int) -> float:
    """Completions a second between the tenth of ``total`` done and nine tenths (``times``: when each count of
    completions was first seen, in order)."""
    first, last = times[total // 10 - 1], times[(9 * total) // 10 - 1]
    return ((9 * total) // 10 - total // 10) / max(last - first, 1e-6)


def _farm_round(client: FarmClient, rollouts: int) -> tuple[float, float, list[dict[str, Any]]]:
    """(rollouts/s over the round, over its steady part, the payloads farm sent)."""
    started = time.monotonic()
    run_id = client.run("arith", "openai:policy@vllm", rollouts, 8)["id"]
    seen: list[float] = []
    while (run := client.get_run(run_id))["state"] == "running" or len(seen) < run["done"]:
        now = time.monotonic()
        seen.extend([now] * (run["done"] - len(seen)))
        if run["state"] == "running":
            time.sleep(0.01)
        if now - started > 600:
            raise TimeoutError(f"run {run_id} did not finish: {run}")
    seconds = time.monotonic() - started
    if run["done"] != rollouts:
        raise RuntimeError(f"the farm round lost rollouts: {run}")
    rows = client.trajectories(limit=rollouts, full=True, run_id=run["id"])
    payloads = [{"model": "policy", "messages": [{"role": m.role, "content": m.content} for m in t.messages[:2]],
                 "max_tokens": 8, "temperature": 1.0, "logprobs": True, "return_token_ids": True,
                 "seed": t.sampling.seed} for t in rows]
    return rollouts / seconds, _steady(seen, rollouts), payloads


async def _direct_round(url: str, payloads: list[dict[str, Any]], concurrency: int) -> tuple[float, float]:
    """(requests/s over the round, over its steady part)."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for p in payloads:
        queue.put_nowait(p)

    async def worker(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            payload = queue.get_nowait()
            response = await http.post(url + "/chat/completions", json=payload)
            response.raise_for_status()
            response.json()
            done.append(time.monotonic())

    done: list[float] = []
    async with httpx.AsyncClient(timeout=120) as http:
        started = time.monotonic()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        return len(payloads) / (time.monotonic() - started), _steady(sorted(done), len(payloads))


def overhead(rollouts: int, concurrency: int, rounds: int, progress: Progress) -> dict[str, Any]:
    task = progress.add_task("vLLM: farm against the server alone", total=2 * rounds + 1)
    with tempfile.TemporaryDirectory(prefix="farm-vllm-bench-") as tmp:
        model = ensure_model(Path(tmp) / "model")
        with VllmServer(model, ("policy",), Path(tmp) / "vllm.log") as server:
            config = Path(tmp) / "farm.toml"
            config.write_text(f'[endpoints.vllm]\nurl = "{server.url}"\nserves = "policy"\nmax_tokens = 8\n'
                              f"seed = 1\nmax_in_flight = {concurrency}\n")
            farmd = LocalFarmd(Path(tmp) / "farm", "--config", str(config), "--workers", "2")
            try:
                with FarmClient(farmd.addr) as client:
                    _farm_round(client, 64)  # first requests, imports, connections: not measured
                    progress.advance(task)
                    farm_rates, direct_rates, farm_steady, direct_steady = [], [], [], []
                    for _ in range(rounds):
                        rate, steady, payloads = _farm_round(client, rollouts)
                        farm_rates.append(rate)
                        farm_steady.append(steady)
                        progress.advance(task)
                        rate, steady = asyncio.run(_direct_round(server.url, payloads, concurrency))
                        direct_rates.append(rate)
                        direct_steady.append(steady)
                        progress.advance(task)
            finally:
                farmd.stop()
    def ratio(farm: list[float], direct: list[float]) -> float:
        return statistics.median(f / d for f, d in zip(farm, direct, strict=True))

    return {"rollouts": rollouts, "concurrency": concurrency, "rounds": rounds,
            "farm_per_s": statistics.median(farm_rates), "direct_per_s": statistics.median(direct_rates),
            "ratio": ratio(farm_rates, direct_rates), "farm_rounds": farm_rates, "direct_rounds": direct_rates,
            "farm_steady_per_s": statistics.median(farm_steady), "direct_steady_per_s": statistics.median(direct_steady),
            "steady_ratio": ratio(farm_steady, direct_steady), "farm_steady_rounds": farm_steady,
            "direct_steady_rounds": direct_steady}


def loops(minutes: float, progress: Progress) -> dict[str, Any]:
    task = progress.add_task("vLLM loop and tiny loop", total=2)
    out: dict[str, Any] = {"minutes": minutes}
    with tempfile.TemporaryDirectory(prefix="farm-vllm-loop-") as tmp:
        for engine in ("vllm", "tiny"):
            data = Path(tmp) / engine
            summary = run_loop(data, minutes, engine=engine, trainer_args=("--eval-every-s", "15"))
            out[engine] = {**summary.to_json(), "curve": _held_out_curve(data)}
            progress.advance(task)
    return out


def measure(rollouts: int, concurrency: int, rounds: int, loop_minutes: float, progress: Progress) -> dict[str, Any]:
    if vllm_python() is None:
        return {"skipped": "the vLLM venv is not built: make vllm-setup"}
    return {"overhead": overhead(rollouts, concurrency, rounds, progress),
            "loops": loops(loop_minutes, progress) if loop_minutes > 0 else None}


def render(rep: dict[str, Any], console: Console) -> None:
    if "skipped" in rep:
        console.print(f"vLLM: skipped ({rep['skipped']})")
        return
    o = rep["overhead"]
    table = Table("path", "rollouts/s, steady (median)", "rounds", "whole round (median)", "rounds", title=(
        f"farm's overhead on vLLM: {o['rollouts']} arith prompts a round, {o['concurrency']} at a time"))

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{r:.0f}" for r in values)

    table.add_row("through farm (lease, request, verdict, store, stamp)", f"{o['farm_steady_per_s']:.1f}",
                  rounds(o["farm_steady_rounds"]), f"{o['farm_per_s']:.1f}", rounds(o["farm_rounds"]))
    table.add_row("straight to the server", f"{o['direct_steady_per_s']:.1f}", rounds(o["direct_steady_rounds"]),
                  f"{o['direct_per_s']:.1f}", rounds(o["direct_rounds"]))
    table.add_row(f"farm / server (median of the rounds' ratios; goal >= {GOALS['overhead_ratio']})",
                  f"{o['steady_ratio']:.2f}", "", f"{o['ratio']:.2f}", "")
    console.print(table)
    checks = {"farm's overhead on vLLM within 10%, steady": o["steady_ratio"] >= GOALS["overhead_ratio"]}
    loops_ = rep.get("loops")
    if loops_:
        table = Table("vLLM loop: s", "held-out L1", "tiny loop: s", "held-out L1",
                      title=f"held-out pass rate at level 1 against seconds since the first evaluation, "
                            f"{loops_['minutes']:g} minutes each")
        v, t = loops_["vllm"]["curve"], loops_["tiny"]["curve"]
        for i in range(max(len(v), len(t))):
            table.add_row(*(f"{v[i][0]:.0f}", f"{v[i][1]:.2f}") if i < len(v) else ("", ""),
                          *(f"{t[i][0]:.0f}", f"{t[i][1]:.2f}") if i < len(t) else ("", ""))
        vg, tg = loops_["vllm"]["held_out_gain"] or 0.0, loops_["tiny"]["held_out_gain"] or 0.0
        table.add_row("gain", f"{100 * vg:+.0f} points", "gain", f"{100 * tg:+.0f} points")
        console.print(table)
        checks["the vLLM loop's held-out gain >= +10 points"] = vg >= GOALS["gain"]
        checks["at least 5 versions synced"] = (loops_["vllm"].get("versions") or 0) >= GOALS["versions"]
    verdicts(console, checks, [
        "both paths share two cores with the server; farm's path also runs farmd and its store on them",
        "the server's rate is what one asyncio client gets from it at the same concurrency: the ceiling farm meets",
    ])
