"""Issue 26, failover: the coordinator a run is using killed (SIGKILL) half way, and how soon the farm goes on.

    .venv/bin/python -m bench --only failover
    .venv/bin/python -m bench --only failover --json

Two ways of living through the kill, each trial a fresh farm, alternating (restart, standby, then standby,
restart, ...) so drift on this shared machine falls on both:

- restart, the baseline: one coordinator on SQLite, started again on the same data directory and port as soon
  as it is dead, as a supervisor would (systemd's ``Restart=always``). Its clients were given its one address.
- standby: two coordinators on one PostgreSQL database (a real server this part starts), the second waiting on
  the active one's advisory lock (docs/architecture.md). Nobody restarts anything; the nodes and the trainer were
  given both addresses.

Each trial queues ``ROLLOUTS`` ``arith`` rollouts of the farm's OpenAI-compatible agent against a simulated model
server that answers after ``LATENCY_S`` (``bench.fleet_procs.SimModel``; no box, so a trial measures the farm,
not this machine's cores), run by ``NODES`` worker nodes (``farmd serve --join``, ``WORKERS`` at once each), while
a trainer (this process) streams them and acks every batch. When a third of the run is stored, the serving
coordinator is killed. Read from the database itself, not from any coordinator's word: the seconds from the kill
to the next rollout stored and to a coordinator serving again, the rollouts lost (the run's jobs not done when it
ends) and stored twice, and the trajectories the trainer was sent again after it had acked them.

These print figures; they assert nothing (``tests/fleet/test_failover.py`` asserts the same outcomes).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from farm_client import FarmClient
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import fleet_sim_bench
from bench.common import committed_row, free_port, verdicts
from bench.fleet_bench import TOML as SIM_CONFIG
from bench.fleet_procs import SimModel, farmd_env, nodes
from farmd.cli.local_farmd import LocalFarmd
from tests.pg import PostgresServer

ROLLOUTS = 1200
NODES = 2
WORKERS = 8
LATENCY_S = 0.1
"""The simulated model's wait before each answer: ``NODES * WORKERS / LATENCY_S`` rollouts/s offered (160)."""
GROUP = 8
KILL_AT = 1 / 3
"""The share of the run stored when the coordinator is killed."""
CONSUMER = "failover-bench"
AGENT = "openai:sim@sim"
RESUME_GOAL_S = 15.0
"""Issue 26: a killed coordinator's work resumes within this many seconds, no rollout lost or stored twice."""
RUN_TIMEOUT_S = 240.0
POLL_S = 0.05
MODES = ("restart", "standby")
LABELS = {"restart": "restart in place (SQLite)", "standby": "standby takes over (PostgreSQL)"}


_COUNTS = ("SELECT (SELECT COUNT(*) FROM trajectories), (SELECT COUNT(DISTINCT id) FROM trajectories), "
           "(SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'leased') AND for_node IS NULL)")


class TrialFailed(RuntimeError):
    """A trial that could not be measured (a node died, the run stalled), with the logs to read."""


class _Database:
    """The farm's database as committed, read by this process: the SQLite file (read-only) or the PostgreSQL
    database at ``url``; the coordinators may be dead while it is read."""

    def __init__(self, path: Path, url: str | None) -> None:
        self._path = path
        self._url = url

    def counts(self) -> tuple[int, int, int]:
        """Trajectory rows, distinct trajectories, and jobs still queued or leased (a node's canaries left out)."""
        if self._url is None and not self._path.exists():
            return 0, 0, 0
        rows, distinct, open_jobs = committed_row(self._path, self._url, _COUNTS)
        return rows, distinct, open_jobs

    def stored(self) -> int:
        return self.counts()[1]


class Trainer(fleet_sim_bench.Trainer):
    """Streams ``CONSUMER`` from whichever coordinator serves (``reconnect_s``), acking each batch, and counts what
    it is sent again after acking it."""

    def __init__(self, addrs: str, want: int) -> None:
        self._want = want
        self.acked: set[int] = set()
        self.again = 0
        super().__init__(addrs)

    def _drain(self) -> None:
        try:
            for batch in self._client.batches(CONSUMER, batch_size=16, reconnect_s=60):
                ids = [t.id for t in batch.trajectories]
                self.again += sum(1 for i in ids if i in self.acked)
                self._client.ack(batch, retry_s=60)
                self.acked.update(ids)
                if len(self.acked) >= self._want or self._stop.is_set():
                    return
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                self.error = f"{exc.code().name}: {exc.details()}"

    def done(self) -> bool:
        return not self._thread.is_alive()


def _until(what: str, done: Any, deadline: float, logs: list[Path]) -> None:
    while not done():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-1500:]}" for p in logs if p.exists())
            raise TrialFailed(f"{what} within {RUN_TIMEOUT_S:g}s\n{tails}")
        time.sleep(POLL_S)


def trial(root: Path, mode: str, k: int, model_url: str, server: PostgresServer | None) -> dict[str, Any]:
    """One farm, one run, one kill; the figures of ``mode`` (``MODES``)."""
    label = f"{mode}-{k}"
    config = root / f"{label}.toml"
    config.write_text(SIM_CONFIG.format(url=model_url))
    url = server.new_database() if server is not None else None
    flags = ("--workers", "0", "--config", str(config), *(("--store", url) if url else ()))
    env = farmd_env()
    a_data, b_data = root / f"{label}-a", root / f"{label}-b"
    a_log, b_log = root / f"{label}-a.log", root / f"{label}-b.log"
    a_addr, b_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    addrs = f"{a_addr},{b_addr}" if mode == "standby" else a_addr
    db = _Database(a_data / "farm.db", url)
    coordinators: list[LocalFarmd] = []
    out: dict[str, Any] = {"mode": mode, "trial": k, "rollouts": ROLLOUTS, "nodes": NODES, "workers": WORKERS}
    try:
        first = LocalFarmd(a_data, *flags, log_path=a_log, env=env, listen=a_addr)
        coordinators.append(first)
        if mode == "standby":
            coordinators.append(LocalFarmd(b_data, *flags, log_path=b_log, env=env, listen=b_addr, wait=False))
        names = [f"{label}-n{i}" for i in range(NODES)]
        with nodes(root, addrs, names, workers=WORKERS, config=config) as joined, Trainer(addrs, ROLLOUTS) as trainer:
            logs = [a_log, b_log, *(n.log_path for n in joined)]
            with FarmClient(addrs) as client:
                client.run("arith", AGENT, ROLLOUTS, GROUP)
            started = time.monotonic()
            deadline = started + RUN_TIMEOUT_S
            _until("a third of the run stored", lambda: db.stored() >= ROLLOUTS * KILL_AT, deadline, logs)
            first.proc.kill()
            killed = time.monotonic()
            first.proc.wait()
            before = db.stored()
            out["stored_at_kill"] = before
            serving = resumed = None
            if mode == "restart":  # as a supervisor would, at once: nothing is stored until it serves
                coordinators.append(LocalFarmd(a_data, *flags, log_path=a_log, env=env, listen=a_addr))
                serving = time.monotonic() - killed
                _until("a rollout stored after the kill", lambda: db.stored() > before, deadline, logs)
                resumed = time.monotonic() - killed
            else:
                standby = coordinators[1]
                while serving is None or resumed is None:
                    now = time.monotonic()
                    if serving is None and standby.serving():
                        serving = now - killed
                    if resumed is None and db.stored() > before:
                        resumed = now - killed
                    if now > deadline:
                        raise TrialFailed(f"the standby did not take over: serving {serving}, resumed {resumed}\n"
                                          f"{b_log.read_text(errors='replace')[-3000:]}")
                    time.sleep(POLL_S)
            out.update(serving_s=serving, resumed_s=resumed)
            # Ended: every job done, or failed for good (a rollout lost is one never stored).
            _until("the run ended", lambda: db.counts()[2] == 0, deadline, logs)
            out["run_s"] = time.monotonic() - started
            rows, distinct, _ = db.counts()
            _until("the trainer acked what was stored", lambda: len(trainer.acked) >= distinct, deadline, logs)
            dead = [f"node {n.name} exited {n.proc.returncode}" for n in joined if n.proc.poll() is not None]
            if dead or trainer.error:
                raise TrialFailed(f"{'; '.join(dead)} {trainer.error}")
            out.update(stored=distinct, stored_twice=rows - distinct, lost=ROLLOUTS - distinct,
                       acked=len(trainer.acked), sent_again_after_ack=trainer.again)
    finally:
        for coordinator in coordinators:
            coordinator.stop()
    return out


def measure(repeats: int, progress: Progress) -> dict[str, Any]:
    task = progress.add_task("failover: kill the coordinator mid-run", total=repeats * len(MODES))
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="farm-failover-") as tmp, SimModel(LATENCY_S) as model, \
            contextlib.ExitStack() as stack:
        server = PostgresServer().start()
        stack.callback(server.stop)
        for k in range(repeats):
            for mode in (MODES if k % 2 == 0 else MODES[::-1]):
                progress.update(task, description=f"failover: {LABELS[mode]}, trial {k + 1} of {repeats}")
                trials.append(trial(Path(tmp), mode, k, model.url, server if mode == "standby" else None))
                progress.advance(task)
    out: dict[str, Any] = {"rollouts": ROLLOUTS, "nodes": NODES, "workers": WORKERS, "latency_s": LATENCY_S,
                           "kill_at": KILL_AT, "trials": trials, "modes": {}}
    for mode in MODES:
        mine = [t for t in trials if t["mode"] == mode]
        out["modes"][mode] = {
            "resumed_s": statistics.median(t["resumed_s"] for t in mine),
            "resumed_worst_s": max(t["resumed_s"] for t in mine),
            "serving_s": statistics.median(t["serving_s"] for t in mine),
            "run_s": statistics.median(t["run_s"] for t in mine),
            "lost": sum(t["lost"] for t in mine), "stored_twice": sum(t["stored_twice"] for t in mine),
            "sent_again_after_ack": sum(t["sent_again_after_ack"] for t in mine)}
    standby = out["modes"]["standby"]
    out["goals"] = {"resumed_s": RESUME_GOAL_S}
    out["met"] = {"failover_resumes_in_time": standby["resumed_worst_s"] <= RESUME_GOAL_S,
                  "nothing_lost_or_twice": all(m["lost"] == 0 and m["stored_twice"] == 0 and
                                               m["sent_again_after_ack"] == 0 for m in out["modes"].values())}
    return out


def render(rep: dict[str, Any], console: Console) -> None:
    modes = rep["modes"]
    table = Table(title=f"Failover (issue 26): the coordinator SIGKILLed with {rep['kill_at']:.0%} of "
                        f"{rep['rollouts']:,} rollouts stored, {rep['nodes']} nodes x {rep['workers']} at once, "
                        f"a trainer streaming; medians of {len(rep['trials']) // len(MODES)} trials each")
    table.add_column("figure")
    for mode in MODES:
        table.add_column(LABELS[mode], justify="right")
    table.add_column("standby / restart", justify="right")
    rows = [("kill -> next rollout stored, s (median)", "resumed_s", ".1f"),
            ("kill -> next rollout stored, s (worst)", "resumed_worst_s", ".1f"),
            ("kill -> a coordinator serving, s (median)", "serving_s", ".1f"),
            ("the whole run, kill included, s (median)", "run_s", ".1f"),
            ("rollouts lost (all trials)", "lost", "d"), ("rollouts stored twice", "stored_twice", "d"),
            ("sent again to the trainer after its ack", "sent_again_after_ack", "d")]
    for name, key, fmt in rows:
        a, b = modes["restart"][key], modes["standby"][key]
        ratio = f"{b / a:.2f}" if fmt != "d" and a else ""
        table.add_row(name, format(a, fmt), format(b, fmt), ratio)
    console.print(table)
    console.print("  the restart is the best a supervisor can do for one coordinator (started again at once, on the "
                  "same disk); the standby needs no one, and no disk of the dead coordinator's")
    verdicts(console, rep["met"], [
        "standby: the server lets the dead coordinator's advisory lock go when its session ends, at once for a "
        "killed process (the kernel closes its socket); then the standby opens the scheduler as a restarted "
        "coordinator does (extending every lease), and nodes and the trainer redial the address list (grpc's "
        "reconnect backoff, up to a second or two)",
        "a host that vanishes without closing its sockets ends its session only when the server's TCP keepalive "
        "gives up on it: see the operator's guide, running PostgreSQL for a farm",
        "this VM is shared and noisy: rerun and compare the two columns, not absolute figures"],
        goals={"failover_resumes_in_time": f"the standby's worst at most {RESUME_GOAL_S:g} s",
               "nothing_lost_or_twice": "0 lost, 0 stored twice, 0 sent again after an ack, every trial"})
