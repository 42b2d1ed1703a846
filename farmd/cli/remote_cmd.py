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
from rich.console import Console
from rich.table import Table
from rich.text import Text

from farmd.cli.common import EXIT_FAILED, CliState, console, emit_json, fail, run_async
from farmd.cli.shown import joined, text
from farmd.cli.status_view import status_view

EXPORT_FIELDS = ("id", "env", "seed", "difficulty", "agent", "policy_version", "reward", "passed", "flags", "node",
                 "finished_at", "steps", "seq", "group_id", "env_version", "status", "verifier_version", "reasons",
                 "final")
"""One record per trajectory, the same whether read from farmd or from a data dir."""


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
    out = console()
    for part in status_view(info, state.addr):
        out.print(part)
    sys.stdout.flush()


@click.command()
@click.option("--env", "env_name", required=True, help="Environment, e.g. py-func.")
@click.option("--agent", required=True, help="reference, random, skilled:S, openai:MODEL@ENDPOINT, ...")
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
    console().print(trajectory_table(rows))


def trajectory_table(rows: list[dict[str, Any]]) -> Table:
    """One row per trajectory; agent specs, flags and nodes are whatever a client or an attempt made them."""
    table = Table("id", "env", "seed", "level", "agent", "policy", "reward", "passed", "flags", "node")
    for r in rows:
        table.add_row(str(r["id"]), text(r["env"]), str(r["seed"]), str(r["difficulty"]), text(r["agent"]),
                      str(r["policy_version"]), f"{r['reward']:.3f}", "yes" if r["passed"] else "no",
                      joined(r["flags"]), text(r["node"]))
    return table


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
        n = run_async(_export_store(data_dir, env_name, out_path, fmt))
    else:
        with client(state) as c, _Writer(out_path, fmt) as writer:
            after = 0
            while page := c.trajectories(env=env_name, limit=1000, after_seq=after, include_steps=True):
                writer.write(page)
                after = page[-1]["seq"]
            n = writer.count
    console().print(Text.assemble(f"exported {n} trajectories to ", text(out_path)))


async def _export_store(data_dir: Path, env: str, out_path: Path, fmt: str) -> int:
    from farmd.store import Store

    path = data_dir / "farm.db"
    if not path.exists():
        fail(f"{data_dir} holds no farm.db", EXIT_FAILED)
    store = await Store.open(path)
    try:
        with _Writer(out_path, fmt) as writer:
            after = 0
            while page := await store.trajectories(after_seq=after, limit=1000, env=env or None):
                writer.write([t.to_json() for t in page])
                after = page[-1].seq
            return writer.count
    finally:
        await store.close()


class _Writer:
    """Writes pages of records as they come (a farm's export need not fit in memory), with a
    running count on stderr."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path = path
        self.fmt = fmt
        self.count = 0
        self._fh: Any = None
        self._parquet: Any = None
        self._status: Any = None

    def __enter__(self) -> _Writer:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.fmt == "jsonl":
            self._fh = open(self.path, "w", encoding="utf-8")
        self._status = Console(stderr=True).status("exporting", spinner="dots")
        self._status.start()
        return self

    def write(self, records: list[dict[str, Any]]) -> None:
        records = [{name: r.get(name) for name in EXPORT_FIELDS} for r in records]
        if self.fmt == "jsonl":
            self._fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        else:
            self._write_parquet(records)
        self.count += len(records)
        self._status.update(f"exporting: {self.count} trajectories")

    def _write_parquet(self, records: list[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        text, whole, real, strings = pa.string(), pa.int64(), pa.float64(), pa.list_(pa.string())
        schema = pa.schema([
            ("id", whole), ("env", text), ("seed", whole), ("difficulty", whole), ("agent", text),
            ("policy_version", whole), ("reward", real), ("passed", pa.bool_()), ("flags", strings), ("node", text),
            ("finished_at", real), ("steps", text), ("seq", whole), ("group_id", whole), ("env_version", text),
            ("status", text), ("verifier_version", text), ("reasons", strings), ("final", text)])
        columns = {f.name: [json.dumps(r.get(f.name)) if f.name == "steps" else r.get(f.name) for r in records]
                   for f in schema}
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.path, schema)
        self._parquet.write_table(pa.table(columns, schema=schema))

    def __exit__(self, *exc: object) -> None:
        self._status.stop()
        if self._fh is not None:
            self._fh.close()
        if self.fmt == "parquet":
            if self._parquet is None:  # nothing to export: still a valid, empty file
                self._write_parquet([])
            self._parquet.close()


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
        console().print(Text.assemble("verifier ", text(result["verifier_version"]),
                                      f": {result['scored']} scored, {result['already']} already scored, "
                                      f"{result['errors']} could not be judged"))
