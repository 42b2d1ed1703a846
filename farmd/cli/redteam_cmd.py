"""``farmctl redteam``: adversaries through a live farm, as ordinary rollouts, and the host checked after.

For every environment asked (default: every built-in, and every approved contributed version), one run per
attack and family of its tasks (``farmd.intake.redteam.plan``): the exploit library's attempts at its kind
(``redteam:exploit:NAME``) at every family, on the family's first seeds (the same every run: a run holds or
breaches by what the farm does, not by the draw), and, where its attempts run as code, the escapes
(``redteam:escape:NAME``, carrying this run's nonce, the host canary's port and the farm's). They are queued,
leased to nodes, boxed, verified and stored like any rollout; an attempt is held when it earned nothing. The
report counts per exploit and family. Then the host is searched for what no verdict shows (``redteam_host``).
Exit 1 if anything was breached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import click
from rich.table import Table

from farmd.cli.common import EXIT_FAILED, CliState, console, emit_json, fail, json_option, progress_console
from farmd.cli.redteam_host import Breach, Canary, leftovers, secrets_in
from farmd.cli.remote_cmd import client, farm_client
from farmd.cli.shown import joined, text
from farmd.envs.catalog import CONTRIBUTED_PREFIX
from farmd.envs.registry import get, names
from farmd.flags import WITHDRAWN
from farmd.intake.redteam import NOT_AN_ATTACK, Attack, Family, contributed_family, families_of, plan
from farmd.verifier.secret import KEY_FILE


@click.command()
@click.option("--env", "envs", multiple=True, metavar="ENV",
              help="An environment to attack (repeatable; default: every built-in and approved contributed one).")
@click.option("--exploits", "max_exploits", type=click.IntRange(min=0), default=None,
              help="At most N of the exploit library's attempts per environment (default: all of them).")
@click.option("--exploit", "named", multiple=True, metavar="NAME",
              help="Only the exploit NAME (repeatable; default: the whole library).")
@click.option("--escapes/--no-escapes", "with_escapes", default=True, help="Try escapes from the boxes too.")
@click.option("--seeds", type=click.IntRange(1, 100), default=1,
              help="Tasks each attack is tried on in each family of tasks (its first N seeds).")
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The coordinator's data dir, when it is on this host: its verifier key is looked for in every "
                   "red-team trajectory and its files for leftovers.")
@click.option("--timeout", type=click.FloatRange(1, 86400), default=1800.0, help="Seconds to wait for the rollouts.")
@json_option
@click.pass_obj
def redteam(state: CliState, envs: tuple[str, ...], max_exploits: int | None, named: tuple[str, ...],
            with_escapes: bool, seeds: int, data_dir: Path | None, timeout: float, as_json: bool) -> None:
    """Attack a running farm through its own rollouts, every exploit at every family of tasks, and check the
    host after: exits 1 on any breach."""
    nonce = secrets.token_hex(8)
    canary = Canary()
    farm_port = int(state.addr.rsplit(":", 1)[1]) if ":" in state.addr else 0
    marker = {"nonce": nonce, "canary": canary.port, **({"farm": farm_port} if farm_port else {}),
              **({"data": str(data_dir.resolve())} if data_dir else {})}
    try:
        with client(state) as c:
            kinds = _kinds(c, state, envs)
            families = {env: _families(env, seeds) for env in kinds}
            attacks = plan(kinds, families, exploits=named, max_exploits=max_exploits, escapes=with_escapes,
                           marker=urlencode(marker))
            if not attacks:
                fail("nothing to attack: no exploit of that name for these environments", EXIT_FAILED,
                     kind="INVALID_ARGUMENT")
            runs = _queue(c, attacks)
            _wait(c, [r for r, _ in runs], timeout, quiet=as_json)
            rows, texts = _results(c, runs)
    finally:
        host = canary.close()
    host += leftovers(nonce, [data_dir] if data_dir else [])
    host += secrets_in(texts, _secrets(state, data_dir))
    _report(rows, host, as_json)
    if any(r["result"] == "breached" for r in rows) or host:
        sys.exit(EXIT_FAILED)


def _kinds(c: Any, state: CliState, asked: tuple[str, ...]) -> dict[str, str]:
    """Each environment to attack and the kind of attempt it takes (its exploit library's part)."""
    contributed = _contributed_kinds(state)
    wanted = list(asked) or [*names(), *sorted(contributed)]
    kinds: dict[str, str] = {}
    for env in wanted:
        if env.startswith(CONTRIBUTED_PREFIX):
            if env not in contributed:
                fail(f"{env} is not an approved contributed environment of this farm", EXIT_FAILED, kind="NOT_FOUND")
            kinds[env] = contributed[env]
        else:
            try:
                kinds[env] = get(env).exploit_kind
            except Exception as exc:  # an unknown name is the operator's typo: say which
                fail(str(exc), EXIT_FAILED, kind="INVALID_ARGUMENT")
    return kinds


def _contributed_kinds(state: CliState) -> dict[str, str]:
    """Approved contributed versions and their kinds; none when this credential may not list them."""
    import grpc
    from farm.v1 import intake_pb2

    from farmd.cli.intake_cmd import Intake

    try:
        with farm_client(state) as c:
            approved = Intake(c.channel, state.token).submissions(intake_pb2.SUBMISSION_STATE_APPROVED, "", 10_000)
    except grpc.RpcError:
        return {}
    return {s.env: s.kind for s in approved}


def _families(env: str, seeds: int) -> list[Family]:
    """The families of ``env``'s tasks and their seeds: a built-in's from its own code, here; a contributed
    one's tasks are made in its boxes, so they are one family."""
    if env.startswith(CONTRIBUTED_PREFIX):
        return [contributed_family(env, seeds)]
    return families_of(get(env), seeds)


def _queue(c: Any, attacks: list[Attack]) -> list[tuple[int, Attack]]:
    runs = []
    for attack in attacks:
        run = c.run(attack.env, attack.spec, group_size=1, seeds=list(attack.seeds), difficulty=attack.difficulty)
        runs.append((run["id"], attack))
    return runs


def _wait(c: Any, run_ids: list[int], timeout: float, quiet: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    with Progress(TextColumn("red team"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=quiet, console=progress_console()) as bar:
        task = bar.add_task("runs", total=len(run_ids))
        pending = set(run_ids)
        while pending:
            for run_id in list(pending):
                if c.get_run(run_id)["state"] != "running":
                    pending.discard(run_id)
            bar.update(task, completed=len(run_ids) - len(pending))
            if pending and time.monotonic() > deadline:
                fail(f"{len(pending)} red-team runs did not end within {timeout:g}s (are nodes connected?)",
                     EXIT_FAILED, kind="DEADLINE_EXCEEDED")
            if pending:
                time.sleep(0.25)


def _results(c: Any, runs: list[tuple[int, Attack]]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    rows: list[dict[str, Any]] = []
    texts: list[tuple[str, str]] = []
    for run_id, attack in runs:
        run = c.get_run(run_id)
        for t in c.trajectories(run_id=run_id, limit=1000, full=True, include_withdrawn=True):
            # A withdrawn one (its node was quarantined) is judged by the last verdict a verifier gave it: the
            # question is whether a verifier rewarded the exploit, not whether its reward was taken back.
            judged = next((s for s in reversed(t.scores) if WITHDRAWN not in s.flags), t)
            result = "breached" if judged.reward > 0 or judged.passed else "held"
            if t.agent_error == NOT_AN_ATTACK:
                result = "not an attack"  # the exploit's attempt was the task's right answer (a bare-answer task)
            rows.append({"attempt": t.id, "env": attack.env, "family": attack.family, "seed": t.seed,
                         "difficulty": t.difficulty, "tried": attack.tried, "agent": t.agent, "node": t.node,
                         "reward": judged.reward, "flags": list(t.flags), "result": result})
            texts.append((f"trajectory {t.id}", json.dumps(dataclasses.asdict(t), default=str)))
        for _ in range(run["failed"]):  # an infrastructure failure is no verdict: shown, neither held nor breached
            rows.append({"attempt": None, "env": attack.env, "family": attack.family, "seed": None,
                         "difficulty": attack.difficulty, "tried": attack.tried, "agent": attack.spec, "node": "",
                         "reward": None, "flags": [], "result": "failed"})
    return rows, texts


def _secrets(state: CliState, data_dir: Path | None) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    if data_dir is not None:
        with contextlib.suppress(OSError):
            found["the verifier key"] = (data_dir / KEY_FILE).read_bytes()
    if state.token:
        found["this command's token"] = state.token.encode()
    return found


def cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report per attempt tried and family of tasks: how many of its attempts were held, breached, failed."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        cell = out.setdefault((r["env"], r.get("family", ""), r["tried"]),
                              {"env": r["env"], "family": r.get("family", ""), "tried": r["tried"], "held": 0,
                               "breached": 0, "failed": 0, "not an attack": 0})
        cell[r["result"]] += 1
    return list(out.values())


def _report(rows: list[dict[str, Any]], host: list[Breach], as_json: bool) -> None:
    held = sum(r["result"] == "held" for r in rows)
    breached = sum(r["result"] == "breached" for r in rows) + len(host)
    failed = sum(r["result"] == "failed" for r in rows)
    moot = sum(r["result"] == "not an attack" for r in rows)
    attempts = held + breached
    summary = f"{attempts} attempts, {held} held, {breached} breached"
    per_cell = cells(rows)
    breached_cells = sum(c["breached"] > 0 for c in per_cell)
    if as_json:
        emit_json({"attempts": rows, "cells": per_cell, "host": [dataclasses.asdict(b) for b in host],
                   "summary": {"attempts": attempts, "held": held, "breached": breached, "failed": failed,
                               "not_attacks": moot, "cells": len(per_cell), "breached_cells": breached_cells}})
        return
    table = Table("attempt", "environment", "family", "tried", "reward", "flags", "result", box=None)
    for r in rows:
        style = {"held": "green", "breached": "bold red", "failed": "yellow", "not an attack": "dim"}[r["result"]]
        table.add_row(str(r["attempt"] or "-"), text(r["env"]), text(r.get("family", "")), text(r["tried"]),
                      "-" if r["reward"] is None else f"{r['reward']:g}", joined(r["flags"]),
                      text(r["result"], style))
    for b in host:
        table.add_row("host", "-", "-", text(b.what), "-", "", text("breached", "bold red"))
    out = console()
    out.print(table)
    for b in host:
        out.print(text(f"host breach ({b.what}): {b.evidence}", "red"))
    if failed:
        out.print(text(f"{failed} attempts failed for the farm's reasons (never a verdict): see farmctl runs list"))
    if moot:
        out.print(text(f"{moot} exploits were the right answer where answers are bare: no attack, not counted"))
    for c in per_cell:
        if c["breached"]:
            out.print(text(f"breached: {c['tried']} at {c['env']} ({c['family']}), {c['breached']} of "
                           f"{c['held'] + c['breached']} attempts", "bold red"))
    out.print(f"{len(per_cell)} attacks x families, {breached_cells} breached")
    out.print(summary)
