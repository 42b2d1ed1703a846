"""Issue 26: one coordinator feeding hundreds of nodes: sustained rollouts/s and the coordinator's CPU per rollout.

    .venv/bin/python -m bench --only fleet-sim
    .venv/bin/python -m bench --only fleet-sim --sim-nodes 400 --sim-slots 32 --sim-rollout-s 5

One real coordinator (``farmd serve --workers 0``) on SQLite, with the learning loop's demand settings (it keeps a
buffer queued ahead of the trainer, here of the ``reference`` agent on ``arith``). One process
(``bench.sim_nodes``) speaks the node protocol for hundreds of simulated nodes, each a real node's link and a
worker with its cadence whose rollouts wait ``rollout_s`` and report the honest record farm's own runner makes.
A trainer (this process, a thread) streams whole groups and acks every batch, so delivery is part of what the
coordinator does per rollout, as in the loop.

After a warm-up (the nodes joined, their first results in; on PostgreSQL the tables then analyzed, as autovacuum
would have by then in a farm that had run a minute) the bench reads, over a window: the trajectories the
coordinator committed (the store's last ``seq``, read from its database file by this process), the coordinator
process's CPU (user + system, every thread), the checks of nodes' verdicts it ran (``node_checks`` rows), and the
CPU of the simulation and of this process. Coordinator CPU per rollout is its CPU over the window per rollout
stored in it; the idle coordinator's background (before any node joins) is read apart and also taken off.

The coordinator's checks of nodes' verdicts (issue 23: every new node's first ``reverify_first`` results and
``reverify_share`` of the rest judged again on the coordinator, known-answer canaries run there too) are measured
apart: the same fleet runs a second time with every result picked (``reverify_share = 1``, 16 checks at once: what the coordinator keeps up with is checked, the rest dropped), and the CPU one
check costs is the difference per check between the two runs. Its share of the default run's per-rollout figure
is that times the checks per rollout it ran.

These print figures; they assert nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import asyncpg
import grpc
import psutil
from farm_client import FarmClient
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import committed_row, verdicts
from bench.fleet_procs import farmd_env, machine_busy_s, process_cpu_s
from farmd.cli.local_farmd import LocalFarmd
from tests.pg import PostgresServer

GOAL_MS = 0.5
"""Issue 26: at most this much coordinator CPU per rollout (one core feeds 2,000 rollouts/s)."""
README_MS = 6.5
"""The README's figure before issue 26 (issue 11's fleet bench: one-slot nodes, py-func)."""
BASELINES = [
    {"what": "branch point 1238a19 of issue 26's coordinator work (same bench)", "ms": 1.97, "per_s": 384.0},
    {"what": "branch point 3ed30f8 of the second round (same bench, two runs)", "ms": 1.49, "per_s": 553.0},
]
"""This bench at earlier commits, same defaults, on this 2-core VM (2026-12-02), SQLite. At 1238a19 its trainer took
14 rollouts/s of the 384 stored and its checks of nodes ran 20 in the window (the writer was the bottleneck), so its
figure holds almost none of their CPU. Compare the figures of one run, not of different runs."""
CONSUMER = "fleet-sim"
TRAINER_BATCH = 512
ENV, AGENT = "arith", "reference"
IDLE_S = 3.0
REVERIFY_SHARE = 0.05
"""The coordinator's default share of nodes' results checked again (``SchedulerConfig.reverify_share``)."""
CHECKS_AT_ONCE = 16
"""``reverify_concurrency`` of the trial with every result checked (the default's is 2)."""

TOML = """\
[farm]
# The simulated nodes share one credential (none): room for every node's Work stream, and calls beside them.
credential_streams = {streams}
max_concurrent_calls = {calls}

[scheduler]
demand_agent = "{agent}"
demand_envs = ["{env}"]
demand_consumers = ["{consumer}"]
# Every slot of the fleet busy, and a few seconds of rollouts queued behind them.
demand_buffer = {buffer}
group_size = 8
maintenance_every_s = 0.2
reverify_share = {share}
reverify_concurrency = {concurrency}
"""


@dataclass(frozen=True)
class Fleet:
    nodes: int
    slots: int
    rollout_s: float
    spread: float = 0.5
    """Each rollout takes ``rollout_s`` times a uniform draw in [1 - spread, 1 + spread]."""
    lease_apart: bool = False
    """Nodes never ask for jobs with their results (as nodes from before ``ResultsRequest.lease``)."""

    @property
    def offered_per_s(self) -> float:
        """What the fleet would run if the coordinator never held it back."""
        return self.nodes * self.slots / self.rollout_s


class Trainer:
    """Drains ``CONSUMER``'s stream of whole groups, acking every batch, until stopped."""

    def __init__(self, addr: str) -> None:
        self._client = FarmClient(addr)
        self.received = 0
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="fleet-sim-trainer", daemon=True)

    def _drain(self) -> None:
        try:
            for batch in self._client.batches(CONSUMER, batch_size=TRAINER_BATCH, whole_groups=True):
                self.received += len(batch.trajectories)
                self._client.ack(batch)
                if self._stop.is_set():
                    return
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                self.error = f"{exc.code().name}: {exc.details()}"

    def __enter__(self) -> Trainer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._client.close()  # ends a stream that waits for more
        self._thread.join(10)


_COUNTS = ("SELECT (SELECT COALESCE(MAX(seq), 0) FROM trajectories), "
           "(SELECT COUNT(*) FROM node_checks WHERE kind = 'reverify'), "
           "(SELECT COUNT(*) FROM node_checks WHERE kind = 'canary'), "
           "(SELECT COUNT(*) FROM node_checks WHERE outcome = 'disagreed')")


class Store:
    """The coordinator's database, read by this process (read-only): what it committed. ``url``: its PostgreSQL
    database; None: the SQLite file at ``path``."""

    def __init__(self, path: Path, url: str | None = None) -> None:
        self._path = path
        self._url = url

    def read(self) -> dict[str, int]:
        seq, checks, canaries, disagreed = committed_row(self._path, self._url, _COUNTS)
        return {"stored": seq, "reverified": checks, "canaries": canaries, "disagreed": disagreed}


class _Server:
    """A PostgreSQL server's processes (its postmaster and every backend it forked), whose CPU adds up: each
    connection of the coordinator's pool is a process of its own. None: no server (SQLite)."""

    def __init__(self, pid: int | None) -> None:
        self._root = psutil.Process(pid) if pid else None
        self._seen: dict[int, float] = {}

    def cpu_s(self) -> float:
        if self._root is None:
            return 0.0
        for proc in [self._root, *self._root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            self._seen[proc.pid] = times.user + times.system
        return sum(self._seen.values())


def _cpu_rate(process: psutil.Process, seconds: float) -> float:
    c0, t0 = process_cpu_s(process), time.perf_counter()
    time.sleep(seconds)
    return (process_cpu_s(process) - c0) / (time.perf_counter() - t0)


def _read_line(stream: IO[str], timeout_s: float, log: Path) -> dict[str, Any]:
    """The next JSON line the simulation prints (it prints two: joined, ended)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0]:
        raise RuntimeError(f"the simulated fleet said nothing within {timeout_s:g}s (its log: {log})")
    return cast(dict[str, Any], json.loads(box[0]))


def _analyze(url: str) -> None:
    """The database's planner statistics brought up to date, as autovacuum keeps them in a farm that has run for a
    minute. A database made for this trial has none of its own (autovacuum looks about once a minute): the
    planner then takes the queue for a few dozen jobs and reads every queued job to lease a few (5 ms a lease,
    measured), and the coordinator's transactions, slowed by that, batched more of its work than a farm in
    its steady state does (0.63-0.74 ms of coordinator CPU a rollout, against 0.98-1.10 with the statistics).
    farmd now analyzes the queue itself as it grows (``JobRecords``' ``ANALYZE_AFTER``); this analyzes every
    table once the warm-up has given them the shapes the window will see."""
    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("ANALYZE")
        finally:
            await conn.close()
    asyncio.run(run())


def trial(root: Path, fleet: Fleet, *, share: float, warmup_s: float, window_s: float, label: str,
          progress: Progress, bar: Any, store_url: str | None = None, server_pid: int | None = None
          ) -> dict[str, Any]:
    """One coordinator, one simulated fleet, one timed window. ``store_url``: the coordinator's store on that
    PostgreSQL database; None: SQLite in its data directory. ``server_pid``: that server's postmaster, whose
    processes' CPU is read over the window too (on PostgreSQL the database's work is theirs, not the coordinator's)."""
    data = root / f"coordinator-{label}"
    config = root / f"{label}.toml"
    slots = fleet.nodes * fleet.slots
    buffer = slots + int(2 * fleet.offered_per_s) + 1024
    config.write_text(TOML.format(agent=AGENT, env=ENV, consumer=CONSUMER, buffer=buffer, share=share,
                                  streams=fleet.nodes + 16, calls=fleet.nodes + 256,
                                  # Every result checked needs more checks at once than the default's two, or most
                                  # are dropped (a full queue) and the difference measures little.
                                  concurrency=CHECKS_AT_ONCE if share >= 1 else 2))
    out: dict[str, Any] = {"label": label, "reverify_share": share, "nodes": fleet.nodes, "slots": fleet.slots,
                           "rollout_s": fleet.rollout_s, "offered_per_s": fleet.offered_per_s,
                           "warmup_s": warmup_s, "window_s": window_s}
    on = ("--store", store_url) if store_url else ()
    with LocalFarmd(data, "--workers", "0", "--config", str(config), *on, log_path=root / f"coordinator-{label}.log",
                    env=farmd_env()) as coord:
        coordinator = psutil.Process(coord.proc.pid)
        store = Store(data / "farm.db", store_url)
        progress.update(bar, description=f"fleet-sim ({label}): the coordinator alone, idle")
        time.sleep(1.0)
        out["idle_cores"] = _cpu_rate(coordinator, IDLE_S)
        with Trainer(coord.addr) as trainer, open(root / f"sim-{label}.log", "w") as sim_log:
            progress.update(bar, description=f"fleet-sim ({label}): {fleet.nodes} nodes joining")
            seconds = warmup_s + window_s + 1.0
            sim = subprocess.Popen(
                [sys.executable, "-m", "bench.sim_nodes", "--addr", coord.addr, "--nodes", str(fleet.nodes),
                 "--slots", str(fleet.slots), "--rollout-s", str(fleet.rollout_s), "--spread", str(fleet.spread),
                 "--seconds", str(seconds),
                 "--prefix", f"sim-{label}", *(["--lease-apart"] if fleet.lease_apart else [])],
                stdout=subprocess.PIPE, stderr=sim_log, text=True, env=farmd_env())
            try:
                assert sim.stdout is not None
                _read_line(sim.stdout, 120, root / f"sim-{label}.log")
                simulated = psutil.Process(sim.pid)
                progress.update(bar, description=f"fleet-sim ({label}): warming up {warmup_s:g}s")
                time.sleep(warmup_s)
                if store_url:
                    _analyze(store_url)
                progress.update(bar, description=f"fleet-sim ({label}): timing {window_s:g}s")
                server = _Server(server_pid)
                s0, c0, i0, b0, m0, d0 = store.read(), process_cpu_s(coordinator), process_cpu_s(simulated), \
                    time.process_time(), machine_busy_s(), server.cpu_s()
                r0, t0 = trainer.received, time.perf_counter()
                time.sleep(window_s)
                s1, c1, i1, b1, m1, d1 = store.read(), process_cpu_s(coordinator), process_cpu_s(simulated), \
                    time.process_time(), machine_busy_s(), server.cpu_s()
                r1, t1 = trainer.received, time.perf_counter()
                ended = _read_line(sim.stdout, seconds + 120, root / f"sim-{label}.log")
                sim.wait(60)
            finally:
                if sim.poll() is None:
                    sim.kill()
                    sim.wait()
            if trainer.error:
                raise RuntimeError(f"the trainer's stream failed: {trainer.error}")
    elapsed = t1 - t0
    stored = s1["stored"] - s0["stored"]
    out.update({
        "seconds": elapsed, "stored": stored, "per_s": stored / elapsed, "trainer_per_s": (r1 - r0) / elapsed,
        "coordinator_cpu_s": c1 - c0, "sim_cpu_s": i1 - i0, "database_cpu_s": d1 - d0 if server_pid else None, "bench_cpu_s": b1 - b0, "machine_busy_s": m1 - m0,
        "reverified": s1["reverified"] - s0["reverified"], "canaries": s1["canaries"] - s0["canaries"],
        "disagreed": s1["disagreed"], "sim": ended,
    })
    out["ms_per_rollout"] = 1000 * out["coordinator_cpu_s"] / stored if stored else None
    out["ms_per_rollout_less_idle"] = (1000 * (out["coordinator_cpu_s"] - out["idle_cores"] * elapsed) / stored
                                       if stored else None)
    out["coordinator_cores"] = out["coordinator_cpu_s"] / elapsed
    out["database_ms_per_rollout"] = (1000 * out["database_cpu_s"] / stored
                                      if stored and out["database_cpu_s"] is not None else None)
    progress.advance(bar)
    return out


BACKENDS = ("sqlite", "postgresql")
BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def measure(fleet: Fleet, repeats: int, warmup_s: float, window_s: float, progress: Progress,
            checks_apart: bool = True, backends: tuple[str, ...] = BACKENDS) -> dict[str, Any]:
    """For each store backend, ``repeats`` trials at the default checks (medians), and with ``checks_apart`` as many
    with every result checked, alternating. PostgreSQL is a real server, started here (``make postgresql``
    installs it) and stopped after; each trial gets a database of its own."""
    plan = [("default", REVERIFY_SHARE), *([("all-checked", 1.0)] if checks_apart else [])]
    bar = progress.add_task("fleet-sim", total=repeats * len(plan) * len(backends))
    out: dict[str, Any] = {"backends": {}}
    for backend in backends:
        trials: list[dict[str, Any]] = []
        tmp = Path(tempfile.mkdtemp(prefix=f"farm-fleet-sim-{backend}-"))
        server = PostgresServer().start() if backend == "postgresql" else None
        try:
            for rep in range(repeats):
                for label, share in (plan if rep % 2 == 0 else plan[::-1]):
                    trials.append(trial(tmp, fleet, share=share, warmup_s=warmup_s, window_s=window_s,
                                        label=f"{backend}-{label}-{rep}", progress=progress, bar=bar,
                                        store_url=server.new_database() if server is not None else None,
                                        server_pid=server.pid if server is not None else None))
        finally:
            if server is not None:
                server.stop()
        shutil.rmtree(tmp)  # kept when a trial fails: its logs say why
        out["backends"][backend] = summarise(fleet, trials)
    return out


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarise(fleet: Fleet, trials: list[dict[str, Any]]) -> dict[str, Any]:
    default = [t for t in trials if t["reverify_share"] < 1]
    checked = [t for t in trials if t["reverify_share"] >= 1]
    ms = _median([t["ms_per_rollout"] for t in default])
    out: dict[str, Any] = {
        "fleet": {"nodes": fleet.nodes, "slots": fleet.slots, "rollout_s": fleet.rollout_s, "spread": fleet.spread,
                  "offered_per_s": fleet.offered_per_s},
        "trials": trials, "per_s": _median([t["per_s"] for t in default]),
        "trainer_per_s": _median([t["trainer_per_s"] for t in default]),
        "ms_per_rollout": ms, "ms_per_rollout_less_idle": _median([t["ms_per_rollout_less_idle"] for t in default]),
        "database_ms_per_rollout": _median([t.get("database_ms_per_rollout") for t in default]),
        "coordinator_cores": _median([t["coordinator_cores"] for t in default]),
        "sim_ms_per_rollout": _median([1000 * t["sim_cpu_s"] / t["stored"] if t["stored"] else None for t in default]),
        "goal_ms": GOAL_MS, "readme_ms": README_MS,
        "one_core_feeds_per_s": 1000 / ms if ms else None,
    }
    if checked and default:
        # One check's CPU: the all-checked runs' extra CPU per rollout over their extra checks per rollout.
        def per_rollout(ts: list[dict[str, Any]], key: str) -> float | None:
            return _median([t[key] / t["stored"] if t["stored"] else None for t in ts])

        extra_cpu = (per_rollout(checked, "coordinator_cpu_s") or 0) - (per_rollout(default, "coordinator_cpu_s") or 0)
        extra_checks = (per_rollout(checked, "reverified") or 0) - (per_rollout(default, "reverified") or 0)
        # On a loaded machine the two trials' CPU per rollout can differ by more than the checks cost: then the
        # difference says nothing (n/a), rather than a check costing less than nothing.
        per_check = extra_cpu / extra_checks if extra_checks > 0 and extra_cpu > 0 else None
        default_checks = per_rollout(default, "reverified") or 0
        canaries = per_rollout(default, "canaries") or 0
        part = 1000 * per_check * (default_checks + canaries) if per_check is not None else None
        # A fleet that just joined has every node's first results checked: the window may still hold those. Past
        # them, a node's checks are its share of re-verification and its canaries.
        steady = REVERIFY_SHARE + canaries
        out["checks"] = {
            "all_checked_ms_per_rollout": _median([t["ms_per_rollout"] for t in checked]),
            "all_checked_per_s": _median([t["per_s"] for t in checked]),
            "all_checked_checks_per_rollout": (per_rollout(checked, "reverified") or 0)
            + (per_rollout(checked, "canaries") or 0),
            "ms_per_check": 1000 * per_check if per_check is not None else None,
            "checks_per_rollout": default_checks,
            "canaries_per_rollout": canaries,
            "ms_per_rollout": part,
            "ms_per_rollout_without": ms - part if ms is not None and part is not None else None,
            "steady_checks_per_rollout": steady,
            "steady_ms_per_rollout": (ms - part + 1000 * per_check * steady
                                      if ms is not None and part is not None and per_check is not None else None),
        }
    out["met"] = bool(ms is not None and ms <= GOAL_MS)
    return out


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def render(out: dict[str, Any], console: Console) -> None:
    backends: dict[str, dict[str, Any]] = out["backends"]
    if not backends:
        return
    first = next(iter(backends.values()))
    f = first["fleet"]
    table = Table("", "rollouts/s", "coordinator ms / rollout", "less idle", "one core feeds /s", "coordinator cores",
                  "database server ms / rollout",
                  title=f"fleet-sim: {f['nodes']} simulated nodes x {f['slots']} slots, {f['rollout_s']:g} s rollouts "
                        f"(+-{100 * f['spread']:.0f}%) "
                        f"({ENV}, {AGENT}; {f['offered_per_s']:.0f}/s offered), one coordinator on each store, "
                        f"a trainer draining whole groups; medians")
    for backend, rep in backends.items():
        table.add_row(f"this run, {BACKEND_NAMES.get(backend, backend)}", _f(rep["per_s"], ".0f"),
                      _f(rep["ms_per_rollout"]), _f(rep["ms_per_rollout_less_idle"]),
                      _f(rep["one_core_feeds_per_s"], ".0f"), _f(rep["coordinator_cores"]),
                      _f(rep.get("database_ms_per_rollout")) if backend != "sqlite" else "(in the coordinator)")
    for base in BASELINES:
        table.add_row(f"{base['what']} (SQLite)", _f(base["per_s"], ".0f"), _f(base["ms"]), "",
                      _f(1000 / base["ms"], ".0f"), "", "")
    table.add_row("README before issue 26 (1-slot nodes, py-func)", "", _f(README_MS, ".1f"), "",
                  _f(1000 / README_MS, ".0f"), "", "")
    table.add_row("goal", "", f"<= {GOAL_MS:g}", "", _f(1000 / GOAL_MS, ".0f"), "", "")
    console.print(table)
    for backend, rep in backends.items():
        _render_backend(BACKEND_NAMES.get(backend, backend), rep, console)
    verdicts(console, {f"coordinator CPU per rollout <= {GOAL_MS:g} ms on {BACKEND_NAMES.get(b, b)}": rep["met"]
                       for b, rep in backends.items()}, LIMITS, how=" (from the readings above)")


def _render_backend(name: str, rep: dict[str, Any], console: Console) -> None:
    checks = rep.get("checks")
    if checks:
        table = Table("", "ms / rollout", "rollouts/s", "checks / rollout", "ms / check",
                      title=f"{name}: the coordinator's checks of nodes' verdicts, measured apart (the same fleet, every "
                            "result picked, against the default: first 16 of a node's and 5% of the rest)")
        table.add_row("default", _f(rep["ms_per_rollout"]), _f(rep["per_s"], ".0f"),
                      _f(checks["checks_per_rollout"], ".3f"), "")
        table.add_row("every result picked (16 at once)", _f(checks["all_checked_ms_per_rollout"]),
                      _f(checks["all_checked_per_s"], ".0f"), _f(checks["all_checked_checks_per_rollout"], ".3f"),
                      _f(checks["ms_per_check"]))
        table.add_row("the default's checks (and canaries), per rollout", _f(checks["ms_per_rollout"], ".3f"), "",
                      _f(checks["checks_per_rollout"] + checks["canaries_per_rollout"], ".3f"), "")
        table.add_row("the default less its checks", _f(checks["ms_per_rollout_without"]), "", "0", "")
        table.add_row("the default, its nodes' first results checked already (5% and canaries)",
                      _f(checks["steady_ms_per_rollout"]), "", _f(checks["steady_checks_per_rollout"], ".3f"), "")
        console.print(table)
    table = Table("trial", "checked", "stored", "rollouts/s", "trainer /s", "coord ms", "sim ms", "lease p50/p99 ms",
                  "results p50/p99 ms", "messages / rollout", "errors", title=f"{name}: each trial")
    for t in rep["trials"]:
        sim = t["sim"]
        messages = (sim["lease_calls"] + sim["result_calls"]) / sim["reported"] if sim["reported"] else None
        table.add_row(t["label"], f"{t['reverified']}+{t['canaries']}c", str(t["stored"]), _f(t["per_s"], ".0f"),
                      _f(t["trainer_per_s"], ".0f"), _f(t["ms_per_rollout"]),
                      _f(1000 * t["sim_cpu_s"] / t["stored"] if t["stored"] else None),
                      f"{_f(_ms(sim['lease_reply_s']['p50']), '.0f')}/{_f(_ms(sim['lease_reply_s']['p99']), '.0f')}",
                      f"{_f(_ms(sim['results_reply_s']['p50']), '.0f')}/{_f(_ms(sim['results_reply_s']['p99']), '.0f')}",
                      _f(messages), f"{sim['errors']}e {sim['refused']}r {t['disagreed']}d")
    console.print(table)


def _ms(s: float | None) -> float | None:
    return None if s is None else 1000 * s


LIMITS = [
    "the simulated nodes, the trainer and the coordinator share this machine's cores: past the coordinator's own "
    "limit, rollouts/s is what is left of the machine (coordinator cores near 1 says the coordinator is the limit)",
    "a simulated rollout is a wait and an honest record of a scripted agent on arith: a few hundred bytes; a "
    "model's record (token ids, logprobs) costs more to parse, check and store",
    "CPU per rollout is the coordinator process's user + system time over the window per trajectory it committed "
    "in it: leases, results, commits, the trainer's stream, the task bank, checks, everything",
    "this VM is shared: rerun and compare figures of one run, not of different runs",
    "on PostgreSQL the database's work (parsing, planning, writing) runs in the server's processes, read apart: the "
    "coordinator's figure is its own process, as on SQLite, where the same work runs in its threads",
]


def main_args(parser: Any) -> None:
    """``python -m bench``'s flags for this part."""
    parser.add_argument("--sim-nodes", type=int, default=100, help="fleet-sim: simulated nodes")
    parser.add_argument("--sim-slots", type=int, default=32, help="fleet-sim: slots per simulated node")
    parser.add_argument("--sim-rollout-s", type=float, default=5.0, help="fleet-sim: seconds a rollout takes")
    parser.add_argument("--sim-spread", type=float, default=0.5,
                        help="fleet-sim: each rollout takes the mean times a uniform draw within this of 1")
    parser.add_argument("--sim-warmup-s", type=float, default=10.0, help="fleet-sim: seconds before the window")
    parser.add_argument("--sim-window-s", type=float, default=20.0, help="fleet-sim: seconds timed")
    parser.add_argument("--sim-repeats", type=int, default=1, help="fleet-sim: trials of each kind (medians)")
    parser.add_argument("--sim-lease-apart", action="store_true",
                        help="fleet-sim: nodes lease only with lease requests, never with their results (older nodes)")
    parser.add_argument("--sim-backends", default=",".join(BACKENDS),
                        help="fleet-sim: the coordinator's store, each in turn (sqlite, postgresql)")
    parser.add_argument("--sim-no-checks-apart", action="store_true",
                        help="fleet-sim: skip the run with every result checked")


def run(args: Any, progress: Progress) -> dict[str, Any]:
    return measure(Fleet(args.sim_nodes, args.sim_slots, args.sim_rollout_s, args.sim_spread, args.sim_lease_apart),
                   args.sim_repeats, args.sim_warmup_s, args.sim_window_s, progress,
                   checks_apart=not args.sim_no_checks_apart,
                   backends=tuple(b.strip() for b in args.sim_backends.split(",") if b.strip()))
