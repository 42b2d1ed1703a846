"""Commands that talk to a running farmd over gRPC (through farm_client, like any client)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import click
import grpc
from rich.table import Table
from rich.text import Text

from farmd import flags
from farmd.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliState,
    console,
    emit_json,
    fail,
    json_option,
    progress_console,
    wants_json,
)
from farmd.cli.shown import joined, text
from farmd.cli.status_view import error_line, status_view
from farmd.records import SUMMARY_FIELDS


def farm_client(state: CliState) -> Any:
    """A ``FarmClient`` to the farmd farmctl was pointed at, with its token and TLS files."""
    from farm_client import FarmClient

    return FarmClient(state.addr, token=state.token, tls_ca=state.tls_ca, tls_cert=state.tls_cert,
                      tls_key=state.tls_key)


def connect_hint(state: CliState, details: str) -> str:
    """What to check when farmd at ``state.addr`` could not be reached, read from gRPC's reason ("" if nothing
    useful can be said)."""
    addr, tls = state.addr, state.tls_ca is not None
    if "Connection refused" in details:
        return (f"nothing listens at {addr}: is farmd running there? (farmd serve --listen HOST:PORT; a local "
                "farm's address is in DATA/farmd.json)")
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return "farmd's certificate is not signed by the CA given in --tls-ca (or FARM_TLS_CA): check which CA it is"
    if "Tls handshake" in details or "WRONG_VERSION_NUMBER" in details or "ssl" in details.lower():
        return (f"TLS failed at {addr}: a farmd without --tls-cert speaks in the clear (drop --tls-ca), or its "
                "certificate does not name the host in --addr") if tls else ""
    if "Socket closed" in details or "Connection reset" in details:
        return ("" if tls else f"{addr} closed the connection: if farmd there serves TLS (--tls-cert), pass "
                "--tls-ca CA.pem (or set FARM_TLS_CA)")
    if "lookup failed" in details or "Domain name not found" in details:
        return f"the host in {addr} does not resolve: give HOST[:PORT] of the machine farmd runs on"
    return ""


def fail_rpc(state: CliState, exc: grpc.RpcError, details: str | None = None) -> NoReturn:
    """End the command for a failed call: ``ADDR: CODE: details`` on stderr (with ``--json``, the code in the
    error's own field) and what to check when farmd could not be reached; exit 1."""
    code = exc.code().name
    details = (exc.details() or "") if details is None else details
    if exc.code() == grpc.StatusCode.UNAVAILABLE and (hint := connect_hint(state, details)):
        details = f"{details}\n{hint}"
    # JSON carries the code as a field of its own; a person reads it in the line.
    where = f"{state.addr}:" if wants_json() else f"{state.addr}: {code}:"
    fail(f"{where} {details}", EXIT_FAILED, kind=code)


@contextlib.contextmanager
def client(state: CliState) -> Iterator[Any]:
    try:
        with farm_client(state) as c:
            yield c
    except grpc.RpcError as exc:
        fail_rpc(state, exc)


@click.command()
@json_option
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
@click.option("--rollouts", type=click.IntRange(min=0), default=0,
              help="Rollouts in all (required unless --seeds names the tasks).")
@click.option("--group-size", type=click.IntRange(min=0), default=0, help="Attempts per task (0: the farm's default).")
@click.option("--seeds", default="", help="Run exactly these tasks, e.g. 0-299 or 3,7,11 (with --difficulty), "
              "one group each, instead of the task bank's picks.")
@click.option("--difficulty", type=click.IntRange(min=0), default=0, help="The level of the --seeds tasks.")
@click.option("--wait", is_flag=True, help="Wait, with a progress bar, until every rollout has ended.")
@json_option
@click.pass_obj
def run(state: CliState, env_name: str, agent: str, rollouts: int, group_size: int, seeds: str, difficulty: int,
        wait: bool, as_json: bool) -> None:
    """Queue a run of rollouts (returns at once unless --wait; with --wait, exits 1 if any rollout failed)."""
    seed_list = _seeds(seeds)
    if not seed_list and not rollouts:
        fail("say how many rollouts (--rollouts N), or which tasks (--seeds and --difficulty)", EXIT_USAGE,
             kind="INVALID_ARGUMENT")
    with client(state) as c:
        if wait and not _has_workers(c.status()):
            fail(f"{state.addr} runs no rollout workers (--workers 0) and no node has joined it, so nothing would "
                 "take these jobs; queue them without --wait, join a node (farmd serve --join), or start farmd "
                 "with workers", EXIT_FAILED, kind="FAILED_PRECONDITION")
        queued = c.run(env_name, agent, rollouts, group_size, difficulty=difficulty, seeds=seed_list)
        if not wait:
            emit_json(queued) if as_json else console().print(
                f"run {queued['id']}: queued {queued['jobs']} rollouts in {len(queued['group_ids'])} groups")
            return
        ended = _wait(c, queued["id"], quiet=as_json)
    if as_json:
        emit_json(ended)
    else:
        console().print(f"run {ended['id']} {ended['state']}: {ended['done']} done ({ended['passed']} passed), "
                        f"{ended['failed']} failed")
    if ended["failed"] or ended["state"] != "succeeded":
        if ended.get("last_error") and not as_json:  # the cause, where a person reads errors (JSON holds it)
            progress_console().print(Text.assemble("last error: ", error_line(ended["last_error"])))
        sys.exit(EXIT_FAILED)


def _wait(c: Any, run_id: int, quiet: bool) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), disable=quiet, transient=False, console=progress_console()) as bar:
        task = None
        while True:
            r: dict[str, Any] = c.get_run(run_id)
            if task is None:
                task = bar.add_task("run", total=r["jobs"], note="")
            ended = r["done"] + r["failed"] + r["cancelled"]
            bar.update(task, completed=ended, note=f"{r['passed']} passed, {r['failed']} failed")
            if r["state"] != "running":
                return r
            time.sleep(0.25)


def _seeds(text: str) -> list[int]:
    """``0-299`` or ``3,7,11`` (or both, comma-separated) as a list of seeds; a usage error otherwise."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            fail(f"--seeds: {part[:40]!r} is not a seed or a range like 0-299", EXIT_USAGE, kind="INVALID_ARGUMENT")
        if last < first or last - first > 100_000 or first < 0:
            fail(f"--seeds: {part[:40]!r} is not a range of at most 100000 non-negative seeds", EXIT_USAGE,
                 kind="INVALID_ARGUMENT")
        out.extend(range(first, last + 1))
    return out


@click.group("runs")
def runs_group() -> None:
    """Runs: what `farmctl run` queued, and how far each has come."""


@runs_group.command("list")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=20)
@json_option
@click.pass_obj
def runs_list(state: CliState, limit: int, as_json: bool) -> None:
    """The newest runs."""
    with client(state) as c:
        rows = c.runs(limit=limit)
    if as_json:
        emit_json(rows)
        return
    table = Table("run", "env", "agent", "state", "jobs", "done", "passed", "failed", "cancelled")
    for r in rows:
        table.add_row(str(r["id"]), text(r["env"]), text(r["agent"]), r["state"], str(r["jobs"]), str(r["done"]),
                      str(r["passed"]), str(r["failed"]), str(r["cancelled"]))
    console().print(table)


@runs_group.command("show")
@click.argument("run_id", type=int)
@json_option
@click.pass_obj
def runs_show(state: CliState, run_id: int, as_json: bool) -> None:
    """One run: its state and counts."""
    with client(state) as c:
        _print_run(c.get_run(run_id), as_json)


@runs_group.command("cancel")
@click.argument("run_id", type=int)
@json_option
@click.pass_obj
def runs_cancel(state: CliState, run_id: int, as_json: bool) -> None:
    """Drop a run's queued jobs; rollouts already running finish and are stored."""
    with client(state) as c:
        _print_run(c.cancel_run(run_id), as_json)


def _print_run(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(r)
        return
    console().print(Text.assemble(f"run {r['id']} ", (r["state"], "bold"), ": ", text(r["env"]), " by ",
                                  text(r["agent"]), f", {r['jobs']} jobs: {r['done']} done ({r['passed']} passed), "
                                  f"{r['failed']} failed, {r['cancelled']} cancelled"))
    if r.get("last_error"):
        console().print(Text.assemble("last error: ", error_line(r["last_error"])))


@click.group("trajectories")
def trajectories_group() -> None:
    """Look at stored trajectories."""


@trajectories_group.command("list")
@click.option("--env", "env_name", default="", help="Only this environment.")
@click.option("--agent", default=None, help="Only this agent's (the spec exactly as queued).")
@click.option("--policy-version", type=click.IntRange(min=0), default=None, help="Only those this version produced.")
@click.option("--min-reward", type=float, default=None, help="Only those scored at least this.")
@click.option("--max-reward", type=float, default=None, help="Only those scored at most this.")
@click.option("--flag", type=click.Choice(flags.ALL), default=None,
              help="Only those whose current verdict carries this flag (withdrawn, quarantined: the withdrawn ones).")
@click.option("--node", default=None, help="Only those run on this node.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=20)
@click.option("--include-withdrawn", is_flag=True,
              help="Withdrawn ones too (a quarantine took them back): reward 0, flagged withdrawn.")
@json_option
@click.pass_obj
def trajectories_list(state: CliState, env_name: str, agent: str | None, policy_version: int | None,
                      min_reward: float | None, max_reward: float | None, flag: str | None, node: str | None,
                      limit: int, include_withdrawn: bool, as_json: bool) -> None:
    """The newest trajectories, narrowed by any of the options, each with its current verdict (a rescore's, a
    withdrawal's). Withdrawn ones are left out unless asked for; stderr says how many were."""
    with client(state) as c:
        listing = c.trajectories(env=env_name, limit=limit, newest_first=True, agent=agent,
                                 policy_version=policy_version, min_reward=min_reward, max_reward=max_reward,
                                 flag=flag, node=node, include_withdrawn=include_withdrawn)
    rows = [{name: getattr(t, name) for name in SUMMARY_FIELDS} for t in listing]
    # On stderr, so the --json list on stdout stays what it was; a script reads it from there too.
    say_withdrawn_left_out(listing.withdrawn_left_out, "--include-withdrawn lists them")
    if as_json:
        emit_json(rows)
        return
    console().print(trajectory_table(rows))


def say_withdrawn_left_out(n: int, how: str) -> None:
    """Tell stderr how many withdrawn trajectories a listing or an export left out (nothing when none were)."""
    if n:
        click.echo(f"{n} withdrawn trajector{'y was' if n == 1 else 'ies were'} left out ({how}, flagged "
                   "withdrawn, reward 0)", err=True)


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
@json_option
@click.pass_obj
def trajectories_show(state: CliState, traj_id: int, as_json: bool) -> None:
    """One trajectory: the task, the conversation turn by turn, steps, final, verdict, every later score."""
    from farmd.cli.trajectory_view import trajectory_view

    with client(state) as c:
        record = c.trajectory(traj_id)
    if as_json:
        emit_json(dataclasses.asdict(record))
    else:
        console().print(trajectory_view(record))


@click.command()
@click.option("--env", "env_name", required=True)
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most this many (0: all).")
@json_option
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


def _has_workers(info: dict[str, Any]) -> bool:
    """Whether anything would run a queued job: the node's own workers, or a connected node of its fleet."""
    return bool(info["workers"]) or any(n["state"] == "connected" for n in info.get("nodes", []))
