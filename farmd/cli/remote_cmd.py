"""Commands that talk to a running farmd over gRPC (through farm_client, like any client)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import grpc

from farmd.cli.common import EXIT_FAILED, CliState, console, emit_json, fail, run_async

EXPORT_FIELDS = ("id", "env", "seed", "difficulty", "agent", "policy_version", "reward", "passed", "flags", "node",
                 "finished_at", "steps")


@contextlib.contextmanager
def client(state: CliState) -> Iterator[Any]:
    from farm_client import FarmClient

    try:
        with FarmClient(state.addr, token=state.token) as c:
            yield c
    except grpc.RpcError as exc:
        fail(f"{state.addr}: {exc.code().name}: {exc.details()}", EXIT_FAILED)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(state: CliState, as_json: bool) -> None:
    """The farm: nodes, queue, throughput, pass rate by environment and level, task bank band."""
    with client(state) as c:
        info = c.status()
    if as_json:
        emit_json(info)
        return
    from rich.table import Table

    out = console()
    iso = "[green]yes[/green]" if info["isolation_ok"] else "[red]NO: it refuses to run untrusted code[/red]"
    out.print(f"[bold]farmd {info['version']}[/bold] on {info['node']} at {state.addr}, up {info['uptime_s']:.0f}s; "
              f"policy version {info.get('policy_version', 0)}")
    out.print(f"workers: {info['workers']}   boxes at once: {info['max_boxes']}   isolation: {iso}")
    for c in info["isolation"]:
        if not c["ok"]:
            out.print(f"  missing {c['name']}: {c['detail']}")
    if "queue" in info:
        q = info["queue"]
        out.print(f"queue: {q['queued']} queued, {q['leased']} running, {q['done']} done, {q['failed']} failed   "
                  f"throughput: {info['throughput_per_s']:.1f} rollouts/s (last minute)")
        table = Table("env", "level", "trajectories", "passed", "pass rate", "mean reward", "verifier errors")
        for r in info["pass_rates"]:
            rate = r["passed"] / r["trajectories"] if r["trajectories"] else 0.0
            table.add_row(r["env"], str(r["difficulty"]), str(r["trajectories"]), str(r["passed"]), f"{rate:.2f}",
                          f"{r['mean_reward']:.3f}" if r["mean_reward"] is not None else "-", str(r["errors"]))
        out.print(table)
        bank = info.get("bank", {})
        band = Table("env", "level", "tasks", "in band", "band occupancy", "informative groups", "retired")
        for env, b in bank.get("envs", {}).items():
            band.add_row(env, str(b.get("level")), str(b.get("tasks")), str(b.get("in_band")),
                         _pct(b.get("band_occupancy")), _pct(b.get("informative_fraction")), str(b.get("retired")))
        out.print(band)
        if info.get("consumers"):
            out.print("consumers: " + ", ".join(f"{k} at {v}" for k, v in info["consumers"].items())
                      + f" (stream at {info.get('last_seq', 0)})")
    sys.stdout.flush()


def _pct(x: object) -> str:
    return f"{x:.2f}" if isinstance(x, float) else "-"


@click.command()
@click.option("--env", "env_name", required=True, help="Environment, e.g. py-func.")
@click.option("--agent", required=True, help="reference, random, openai:MODEL@URL, ...")
@click.option("--rollouts", type=click.IntRange(min=1), required=True)
@click.option("--group-size", type=click.IntRange(min=0), default=0, help="Attempts per task (0: the farm's default).")
@click.option("--wait", is_flag=True, help="Wait, with a progress bar, until every rollout has ended.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def run(state: CliState, env_name: str, agent: str, rollouts: int, group_size: int, wait: bool, as_json: bool) -> None:
    """Queue rollouts (returns at once unless --wait)."""
    with client(state) as c:
        queued = c.run(env_name, agent, rollouts, group_size)
        if not wait:
            emit_json(queued) if as_json else console().print(
                f"queued {queued['jobs']} rollouts in {len(queued['group_ids'])} groups")
            return
        progress = _wait(c, queued["group_ids"], queued["jobs"], quiet=as_json)
    if as_json:
        emit_json({**queued, **progress})
    else:
        console().print(f"{progress['done']} done ({progress['passed']} passed), {progress['failed']} failed")


def _wait(c: Any, group_ids: list[int], total: int, quiet: bool) -> dict[str, int]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), disable=quiet, transient=False) as bar:
        task = bar.add_task("run", total=total, note="")
        while True:
            p = c.progress(group_ids)
            ended = p["done"] + p["failed"]
            bar.update(task, completed=ended, note=f"{p['passed']} passed, {p['failed']} failed")
            if ended >= p["jobs"]:
                return dict(p)
            time.sleep(0.25)


@click.group("trajectories")
def trajectories_group() -> None:
    """Look at stored trajectories."""


@trajectories_group.command("list")
@click.option("--env", "env_name", default="", help="Only this environment.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=20)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def trajectories_list(state: CliState, env_name: str, limit: int, as_json: bool) -> None:
    """The newest trajectories."""
    with client(state) as c:
        rows = c.trajectories(env=env_name, limit=limit, newest_first=True)
    if as_json:
        emit_json(rows)
        return
    from rich.table import Table

    table = Table("id", "env", "seed", "level", "agent", "policy", "reward", "passed", "flags", "node")
    for r in rows:
        table.add_row(str(r["id"]), r["env"], str(r["seed"]), str(r["difficulty"]), r["agent"],
                      str(r["policy_version"]), f"{r['reward']:.3f}", "yes" if r["passed"] else "no",
                      ",".join(r["flags"]), r["node"])
    console().print(table)


@trajectories_group.command("show")
@click.argument("traj_id", type=int)
@click.pass_obj
def trajectories_show(state: CliState, traj_id: int) -> None:
    """One trajectory, whole, as JSON."""
    with client(state) as c:
        emit_json(c.trajectory(traj_id))


@click.command()
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Read a stopped farm's data directory directly instead of asking farmd.")
@click.option("--env", "env_name", default="", help="Only this environment.")
@click.pass_obj
def export(state: CliState, fmt: str, out_path: Path, data_dir: Path | None, env_name: str) -> None:
    """One record per trajectory: id, env, seed, difficulty, agent, policy_version, reward, passed, flags, node,
    finished_at, steps (and more)."""
    if data_dir is not None:
        records = run_async(_read_store(data_dir, env_name))
    else:
        records = []
        with client(state) as c:
            after = 0
            while True:
                page = c.trajectories(env=env_name, limit=1000, after_seq=after, include_steps=True)
                if not page:
                    break
                records += page
                after = page[-1]["seq"]
    _write(records, out_path, fmt)
    console().print(f"exported {len(records)} trajectories to {out_path}")


async def _read_store(data_dir: Path, env: str) -> list[dict[str, Any]]:
    from farmd.store import Store

    path = data_dir / "farm.db"
    if not path.exists():
        fail(f"{data_dir} holds no farm.db", EXIT_FAILED)
    store = await Store.open(path)
    try:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = await store.trajectories(after_seq=after, limit=1000, env=env or None)
            if not page:
                return out
            out += [t.to_json() for t in page]
            after = page[-1].seq
    finally:
        await store.close()


def _write(records: list[dict[str, Any]], path: Path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with open(path, "w") as fh:
            for r in records:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {name: [] for name in EXPORT_FIELDS}
    extra = ("seq", "group_id", "env_version", "status", "verifier_version", "reasons", "final")
    columns.update({name: [] for name in extra})
    for r in records:
        for name in columns:
            value = r.get(name)
            columns[name].append(json.dumps(value) if name in ("steps",) else value)
    pq.write_table(pa.table(columns), path)


@click.command()
@click.option("--env", "env_name", required=True)
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most this many (0: all).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def rescore(state: CliState, env_name: str, limit: int, as_json: bool) -> None:
    """Score an environment's trajectories again under the current verifier version; overwrites nothing."""
    with client(state) as c:
        result = c.rescore(env_name, limit)
    if as_json:
        emit_json(result)
    else:
        console().print(f"verifier {result['verifier_version']}: {result['scored']} scored, {result['already']} "
                        f"already scored, {result['errors']} could not be judged")
