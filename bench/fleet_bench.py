"""Issue 11, the fleet: rollouts/s with two worker nodes against one, and the coordinator's CPU per rollout.

    .venv/bin/python -m bench --only fleet
    .venv/bin/python -m bench --only fleet --json

One coordinator (``farmd serve --workers 0``: it runs no rollouts) with one config serves the whole
run. Each trial joins fresh worker nodes (``farmd serve --join``, ``--workers 1``: one rollout at a time
each), waits until the coordinator lists them connected, warms them up (imports, first box, first
connection), queues N rollouts and times them from the queue to the last one stored (the run's
``created_at`` to its ``finished_at``, both the coordinator's clock), then stops the nodes. A trainer
(this process) drains every trajectory from the stream and acks it, as a trainer does: delivery is part
of what the coordinator does per rollout, and the stream tells the bench the run is over without
polling the coordinator. One-node and two-node trials alternate (1, 2, then 2, 1, ...) so drift on this
shared machine hits both; the figures are medians over the repeats, the ratio is two over one.

Two workloads, reported apart:

- (a) ``py-func`` with the ``reference`` agent: every rollout runs its submission, then the judge, each
  in a fresh box (tens of ms of CPU a rollout). The coordinator, the nodes and their boxes share this
  machine's cores, so past some rate this measures the machine rather than the farm.
- (b) ``arith`` with ``openai:sim@sim``: the farm's own OpenAI-compatible agent against a simulated model
  server (``bench.fleet_procs.SimModel``, in this process) that waits ``SIM_LATENCY_S`` before answering
  right. No box (``arith`` is judged on the host): a rollout's time is mostly waiting for "the model", as
  with a real remote model, so this shows the farm's own scaling rather than this machine's core count.
  Nothing in ``farmd/envs`` or ``farmd/agents`` waits by itself (the scripted agents answer at once, and
  every other environment runs boxes), hence the simulated server.

The coordinator's CPU (user + system of its process, every thread) is read around each timed window;
its background (no node joined, nobody calling) and its cost per idle node (a node with nothing to run
keeps asking for a lease; the coordinator holds each ask up to ``LEASE_WAIT_S`` for work) are read apart.

These print figures; they assert nothing.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
from farm_client import FarmClient
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import drain, verdicts
from bench.fleet_procs import Node, SimModel, farmd_env, machine_busy_s, nodes, process_cpu_s
from farmd.cli.local_farmd import LocalFarmd
from farmd.fleet.remote import LEASE_WAIT_S

GOAL_RATIO = 1.8
"""Issue 11: two nodes give at least this many times one node's rollouts/s."""
SIM_LATENCY_S = 0.2
"""The simulated model's wait before each reply (one reply per ``arith`` rollout)."""
GROUP = 8
BATCH = 64
"""The trainer's batch size on the stream."""
CONSUMER = "fleet-bench"
IDLE_S = 2.0
"""Seconds of each idle reading of the coordinator's CPU (alone: twice this)."""
SETTLE_S = 0.5
"""Before an idle reading: past the warm-up's last results and the idle nodes' first asks."""
WARM_PER_NODE = 2
RUN_TIMEOUT_S = 120.0
WATCH_EVERY_S = 5.0
"""How often the watchdog asks whether a run failed (a node's exit it sees at once)."""

TOML = """\
[scheduler]
lease_s = 30

[endpoints.sim]
url = "{url}"
request_timeout_s = 30
max_attempts = 2
"""


@dataclass(frozen=True)
class Workload:
    key: str
    env: str
    agent: str
    rollouts: int
    label: str
    about: str


WORKLOADS = (
    Workload("boxes", "py-func", "reference", 128, "(a) py-func, reference",
             "each rollout runs its submission, then the judge, each in a fresh box: tens of ms of CPU"),
    Workload("waits", "arith", "openai:sim@sim", 32, "(b) arith, simulated model",
             f"the openai agent waits {SIM_LATENCY_S * 1000:.0f} ms for a simulated model server; no box: "
             "mostly waiting"),
)


class RunFailed(RuntimeError):
    """A run ended with failed rollouts, or not in time, or a node died under it; with the nodes' logs."""


def _logs(joined: list[Node]) -> str:
    return "\n".join(f"--- node {n.name} ({n.log_path}):\n{n.log_tail(2000)}" for n in joined)


def _run_to_end(client: FarmClient, watch: FarmClient, w: Workload, rollouts: int, joined: list[Node]
                ) -> dict[str, Any]:
    """Queue ``rollouts`` of ``w`` and drain them from the trainer stream; the run as it ended.

    RunFailed, loudly, unless every rollout was stored: a watchdog closes the stream under the drain
    when a node exits or the run fails, and ``drain`` gives up after ``RUN_TIMEOUT_S``.
    """
    run = client.run(w.env, w.agent, rollouts, min(GROUP, rollouts))
    problems: list[str] = []
    stop = threading.Event()

    def watchdog() -> None:
        last = time.monotonic()
        while not stop.wait(0.2):
            dead = [f"node {n.name} exited {n.proc.returncode}" for n in joined if n.proc.poll() is not None]
            if not dead and time.monotonic() - last >= WATCH_EVERY_S:
                last = time.monotonic()
                with contextlib.suppress(grpc.RpcError):  # the drain's own deadline still holds
                    state = watch.get_run(run["id"])["state"]
                    dead = [] if state in ("running", "succeeded") else [f"run {run['id']} is {state}"]
            if dead:
                problems.extend(dead)
                client.close()  # ends the drain's stream now
                return

    thread = threading.Thread(target=watchdog, name="fleet-watchdog", daemon=True)
    thread.start()
    try:
        got = drain(client, CONSUMER, rollouts, BATCH, deadline_s=RUN_TIMEOUT_S)
    except RuntimeError as exc:
        ended = watch.get_run(run["id"])
        raise RunFailed(f"run {run['id']} ({w.env}, {w.agent}) {ended['state'].upper()}: {ended['done']} done, "
                        f"{ended['failed']} failed of {rollouts}; {'; '.join(problems) or exc}\n{_logs(joined)}"
                        ) from exc
    finally:
        stop.set()
        thread.join()
    ended = watch.get_run(run["id"])
    strays = sorted({t.run_id for t in got} - {run["id"]})
    if ended["state"] != "succeeded" or ended["done"] != rollouts or strays:
        raise RunFailed(f"run {run['id']} ({w.env}, {w.agent}) ended {ended['state'].upper()}: {ended['done']} "
                        f"done, {ended['failed']} failed, {ended['cancelled']} cancelled of {rollouts}"
                        f"{f'; the stream held trajectories of runs {strays}' if strays else ''}\n{_logs(joined)}")
    return ended


def _wait_connected(client: FarmClient, names: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {n["name"]: n["state"] for n in client.status()["nodes"]}
        if all(states.get(name) == "connected" for name in names):
            return
        time.sleep(0.05)
    raise RunFailed(f"the coordinator does not list {names} as connected within {timeout_s:g}s: {states}")


def _done_by_node(client: FarmClient, names: list[str]) -> dict[str, int]:
    return {n["name"]: int(n["done"]) for n in client.status()["nodes"] if n["name"] in names}


def _cpu_rate(process: psutil.Process, seconds: float) -> float:
    """Cores ``process`` used on average over the next ``seconds`` (CPU seconds per second)."""
    c0, t0 = process_cpu_s(process), time.perf_counter()
    time.sleep(seconds)
    return (process_cpu_s(process) - c0) / (time.perf_counter() - t0)


def _trial(client: FarmClient, watch: FarmClient, addr: str, coordinator: psutil.Process, root: Path,
           config: Path, w: Workload, k: int, rep: int) -> dict[str, Any]:
    names = [f"{w.key}-r{rep}-of{k}-{i}" for i in range(k)]
    out: dict[str, Any] = {"workload": w.key, "nodes": k, "repeat": rep, "rollouts": w.rollouts}
    with nodes(root, addr, names, workers=1, config=config) as joined:
        _wait_connected(watch, names)
        _run_to_end(client, watch, w, WARM_PER_NODE * k, joined)
        if k == 2:
            time.sleep(SETTLE_S)
            out["idle_coordinator_cores"] = _cpu_rate(coordinator, IDLE_S)
        done0 = _done_by_node(watch, names)
        c0, n0, b0, m0 = process_cpu_s(coordinator), sum(n.cpu_s() for n in joined), time.process_time(), \
            machine_busy_s()
        t0 = time.perf_counter()
        run = _run_to_end(client, watch, w, w.rollouts, joined)
        window_s = time.perf_counter() - t0
        c1, n1, b1, m1 = process_cpu_s(coordinator), sum(n.cpu_s() for n in joined), time.process_time(), \
            machine_busy_s()
        done1 = _done_by_node(watch, names)
    elapsed = run["finished_at"] - run["created_at"]
    out.update({
        "run": run["id"], "passed": run["passed"], "seconds": elapsed, "window_s": window_s,
        "per_s": w.rollouts / elapsed,
        "coordinator_cpu_s": c1 - c0, "nodes_cpu_s": n1 - n0, "bench_cpu_s": b1 - b0, "machine_busy_s": m1 - m0,
        "done_by_node": {name: done1.get(name, 0) - done0.get(name, 0) for name in names},
    })
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def _summary(w: Workload, trials: list[dict[str, Any]], background: float, cores: int) -> dict[str, Any]:
    mine = [t for t in trials if t["workload"] == w.key]
    one = [t for t in mine if t["nodes"] == 1]
    two = [t for t in mine if t["nodes"] == 2]
    rate1, rate2 = _median([t["per_s"] for t in one]), _median([t["per_s"] for t in two])
    by_rep = {t["repeat"]: t for t in one}
    paired = [t["per_s"] / by_rep[t["repeat"]]["per_s"] for t in two if t["repeat"] in by_rep]

    def per_rollout(ts: list[dict[str, Any]], key: str) -> float | None:
        return _median([t[key] / t["rollouts"] for t in ts])

    def less_background(ts: list[dict[str, Any]]) -> float | None:
        # What the coordinator burns with nothing to do (its maintenance tick), over the same window, taken off.
        return _median([(t["coordinator_cpu_s"] - background * t["window_s"]) / t["rollouts"] for t in ts])

    def cores_used(ts: list[dict[str, Any]]) -> dict[str, float | None]:
        busy = _median([t["machine_busy_s"] / t["window_s"] for t in ts])
        farm = _median([(t["coordinator_cpu_s"] + t["nodes_cpu_s"] + t["bench_cpu_s"]) / t["window_s"] for t in ts])
        return {"machine": busy, "farm_and_bench": farm,
                "others": None if busy is None or farm is None else max(0.0, busy - farm)}

    coord2, net2, node2 = per_rollout(two, "coordinator_cpu_s"), less_background(two), per_rollout(two, "nodes_cpu_s")
    feeds = 1 / net2 if net2 and net2 > 0 else None
    idle2 = _median([t["idle_coordinator_cores"] for t in two if "idle_coordinator_cores" in t])
    per_idle_node = (idle2 - background) / 2 if idle2 is not None else None
    return {
        "label": w.label, "about": w.about, "env": w.env, "agent": w.agent, "rollouts": w.rollouts, "trials": mine,
        "one_node_per_s": rate1, "two_nodes_per_s": rate2,
        "ratio": rate2 / rate1 if rate1 and rate2 else None, "paired_ratios": paired,
        "goal_met": bool(rate1 and rate2 and rate2 / rate1 >= GOAL_RATIO),
        "one_node_s_per_rollout": 1 / rate1 if rate1 else None,
        "coordinator_cpu_ms_per_rollout": {"one_node": _ms(per_rollout(one, "coordinator_cpu_s")),
                                           "two_nodes": _ms(coord2), "one_node_less_background": _ms(less_background(one)),
                                           "two_nodes_less_background": _ms(net2)},
        "nodes_cpu_ms_per_rollout": {"one_node": _ms(per_rollout(one, "nodes_cpu_s")), "two_nodes": _ms(node2)},
        "one_core_feeds_per_s": feeds,
        "nodes_one_core_feeds": feeds / rate1 if feeds and rate1 else None,
        "idle_coordinator_cores_two_nodes": idle2, "idle_cores_per_node": per_idle_node,
        "idle_node_equals_per_s": per_idle_node / net2 if per_idle_node is not None and net2 else None,
        "cores_used": {"one_node": cores_used(one), "two_nodes": cores_used(two)},
        "cpu_ceiling_per_s": cores / (coord2 + node2) if coord2 and node2 else None,
    }


def measure(repeats: int, progress: Progress) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    bar = progress.add_task("fleet: the coordinator", total=2 * repeats * len(WORKLOADS))
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="farm-fleet-bench-") as tmp, SimModel(SIM_LATENCY_S) as sim:
        root = Path(tmp)
        config = root / "fleet.toml"
        config.write_text(TOML.format(url=sim.url))
        with LocalFarmd(root / "coordinator", "--workers", "0", "--config", str(config),
                        log_path=root / "coordinator.log", env=farmd_env()) as coord, \
                FarmClient(coord.addr) as client, FarmClient(coord.addr) as watch:
            coordinator = psutil.Process(coord.proc.pid)
            progress.update(bar, description="fleet: the coordinator alone, idle")
            time.sleep(SETTLE_S)
            background = _cpu_rate(coordinator, 2 * IDLE_S)
            for rep in range(repeats):
                for w in WORKLOADS:
                    for k in ((1, 2) if rep % 2 == 0 else (2, 1)):
                        progress.update(bar, description=f"fleet: {w.env}, {w.agent}, {k} node{'s' * (k > 1)}, "
                                                         f"repeat {rep + 1}")
                        trials.append(_trial(client, watch, coord.addr, coordinator, root, config, w, k, rep))
                        progress.advance(bar)
    summaries = {w.key: _summary(w, trials, background, cores) for w in WORKLOADS}
    return {"repeats": repeats, "cores": cores, "sim_latency_s": SIM_LATENCY_S, "group_size": GROUP,
            "idle_coordinator_cores_alone": background, "workloads": summaries, "goal_ratio": GOAL_RATIO,
            "met": {w.key: summaries[w.key]["goal_met"] for w in WORKLOADS}}


def _inverse(per_s: float | None, nodes: int) -> float | None:
    """Seconds a rollout takes on one node, from a fleet's rollouts/s (one slot a node)."""
    return nodes / per_s if per_s else None


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def render(rep: dict[str, Any], console: Console) -> None:
    ws = rep["workloads"]
    table = Table("workload", "N", "1 node /s", "2 nodes /s", "two / one", "each repeat", "goal",
                  "ms / rollout (1 -> 2)",
                  title=f"a fleet: coordinator --workers 0, nodes --workers 1, medians of {rep['repeats']}")
    for w in ws.values():
        table.add_row(w["label"], str(w["rollouts"]), _f(w["one_node_per_s"]), _f(w["two_nodes_per_s"]),
                      _f(w["ratio"], ".2f"), " ".join(f"{r:.2f}" for r in w["paired_ratios"]),
                      f">= {rep['goal_ratio']:g}",
                      f"{_f(_ms(_inverse(w['one_node_per_s'], 1)), '.0f')} -> "
                      f"{_f(_ms(_inverse(w['two_nodes_per_s'], 2)), '.0f')}")
    console.print(table)
    for w in ws.values():
        console.print(f"  {w['label']}: {w['about']}")
    waits = ws.get("waits")
    if waits and waits["one_node_s_per_rollout"]:
        console.print(f"  (b) one node, one slot: {1000 * waits['one_node_s_per_rollout']:.0f} ms a rollout, of which "
                      f"{1000 * rep['sim_latency_s']:.0f} ms the model's wait: the rest is the farm's own latency "
                      "per rollout (lease, task, agent, verdict, report)")
    console.print("  rollouts/s: N over the run's created_at to finished_at (queued to the last one stored), "
                  "fresh warmed-up nodes each trial, a trainer draining the stream; 'each repeat': two / one "
                  "within a repeat; ms / rollout: how long one node takes a rollout, alone (1) and beside "
                  "another node (2)")

    table = Table("workload", "coordinator ms / rollout", "less background", "1 core feeds /s", "= nodes",
                  "node ms / rollout", title="CPU (user + system) per rollout, two-node trials (one-node), medians")
    for w in ws.values():
        c, n = w["coordinator_cpu_ms_per_rollout"], w["nodes_cpu_ms_per_rollout"]
        table.add_row(w["label"], f"{_f(c['two_nodes'], '.2f')} ({_f(c['one_node'], '.2f')})",
                      f"{_f(c['two_nodes_less_background'], '.2f')} ({_f(c['one_node_less_background'], '.2f')})",
                      _f(w["one_core_feeds_per_s"], ".0f"), _f(w["nodes_one_core_feeds"], ".0f"),
                      f"{_f(n['two_nodes'])} ({_f(n['one_node'])})")
    console.print(table)
    for w in ws.values():
        console.print(f"  {w['label']}: one coordinator core feeds about {_f(w['one_core_feeds_per_s'], '.0f')} "
                      f"rollouts/s, i.e. about {_f(w['nodes_one_core_feeds'], '.0f')} nodes like these "
                      f"({_f(w['one_node_per_s'])} rollouts/s each)")
    console.print(f"  coordinator: its process, every thread: leases, results into the store, the stream to the "
                  f"trainer; less background: less its CPU with no node joined "
                  f"({_pct(rep['idle_coordinator_cores_alone'])} of a core) over the same time; "
                  "node: the node processes and the boxes they reaped")

    table = Table("coordinator, idle", "of a core", "per idle node", "= the coordinator CPU of",
                  title=f"idle: a node with nothing to run asks for a lease, held at the coordinator up to "
                        f"{LEASE_WAIT_S:g} s for work ({IDLE_S:g} s readings, medians)")
    table.add_row("alone, no node joined", _pct(rep["idle_coordinator_cores_alone"]), "", "")
    for w in ws.values():
        table.add_row(f"two idle nodes (after {w['env']})", _pct(w["idle_coordinator_cores_two_nodes"]),
                      _pct(w["idle_cores_per_node"]), f"{_f(w['idle_node_equals_per_s'])} rollouts/s of {w['env']}")
    console.print(table)

    table = Table("workload", "nodes", "machine busy", "farm + bench", "others", "CPU ceiling /s",
                  title=f"cores in use in the timed window, of {rep['cores']}, medians")
    for w in ws.values():
        for k, key in ((1, "one_node"), (2, "two_nodes")):
            u = w["cores_used"][key]
            table.add_row(w["label"] if k == 1 else "", str(k), _f(u["machine"], ".2f"),
                          _f(u["farm_and_bench"], ".2f"), _f(u["others"], ".2f"),
                          _f(w["cpu_ceiling_per_s"]) if k == 2 else "")
    console.print(table)
    console.print("  farm + bench: the coordinator, the nodes with their boxes, and this process (the trainer, "
                  "the simulated model); others: the rest of the machine; CPU ceiling: "
                  f"{rep['cores']} cores over (coordinator + node) CPU per rollout, the most this machine could run")

    verdicts(console, {f"two nodes >= {rep['goal_ratio']:g}x one node, {w['label']}": w["goal_met"]
                       for w in ws.values()}, LIMITS, how=" (from the CPU readings above)")


LIMITS = [
    "(a) py-func: a one-slot node keeps much of a core busy (node ms / rollout against ms / rollout), so two "
    "nodes, their boxes and the coordinator contend for 2 cores and each rollout gets slower beside another "
    "node (ms / rollout, 1 -> 2): the machine, not the coordinator, keeps the ratio under 2 here; the CPU "
    "ceiling is where the cores would run out entirely, and other jobs on this machine ('others') take from it",
    f"(b) arith with the simulated model: a rollout waits {SIM_LATENCY_S * 1000:.0f} ms for its reply plus the "
    "farm's own per-rollout latency; a one-slot node runs one at a time, so two nodes double the rate until "
    "the coordinator or the cores run out",
    "nodes like these: one coordinator core over one node's rollouts/s measured here (with one slot each); it "
    "leaves out the store's disk under load and the network between machines",
    "this VM is shared and has 2 cores: rerun and compare ratios, not absolute figures",
]
