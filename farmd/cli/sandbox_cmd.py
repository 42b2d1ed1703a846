"""``farmctl sandbox ...`` and ``farmctl doctor``: local commands that use the sandbox in process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from farmd.cli.common import console, emit_json, json_option, run_async
from farmd.cli.shown import text
from farmd.errors import FarmError
from farmd.sandbox import NAMED_POLICIES, Sandbox, SandboxPolicy, check_host
from farmd.sandbox.config import SandboxConfig


@click.group("sandbox")
def sandbox_group() -> None:
    """Run programs in farm's boxes, right here, without a daemon."""


@sandbox_group.command(
    "run",
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option("--policy", "policy_name", type=click.Choice(sorted(NAMED_POLICIES)), default="default",
              show_default=True, help="Named policy the bounds below override.")
@click.option("--wall-time", type=float, help="Wall-clock seconds before the box is killed.")
@click.option("--cpu-time", type=float, help="CPU seconds of the whole box.")
@click.option("--cpus", type=float, help="CPU bandwidth cap, in cores.")
@click.option("--memory-mb", type=int, help="Memory of the whole box, tmpfs included.")
@click.option("--pids", type=int, help="Processes and threads alive at once.")
@click.option("--disk-mb", type=int, help="Size of the scratch working directory.")
@click.option("--tmp-mb", type=int, help="Size of the box's /tmp.")
@click.option("--open-files", type=int, help="Open descriptors per process.")
@click.option("--output-kb", type=int, help="Captured bytes per stream; more kills the box.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment variable for the program.")
@click.option("--files", "files", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Copy this directory's files into the working directory first.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              help="Copy the working directory's regular files here afterwards (links skipped).")
@json_option
@click.argument("cmd", nargs=-1, required=True)
@click.pass_context
def sandbox_run(ctx: click.Context, policy_name: str, wall_time: float | None, cpu_time: float | None,
                cpus: float | None, memory_mb: int | None, pids: int | None, disk_mb: int | None,
                tmp_mb: int | None, open_files: int | None, output_kb: int | None, env: tuple[str, ...],
                files: Path | None, out: Path | None, as_json: bool, cmd: tuple[str, ...]) -> None:
    """Run CMD in a fresh box and print its result as one JSON object.

    Exits 0 whenever the box ran, whatever the program did; 2 for bad input;
    3 when this host cannot isolate a box (see `farmctl doctor`); 4 when the
    sandbox itself failed. The result is JSON with or without --json; with it, so are errors.
    """
    env_pairs: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--env")
        env_pairs[name] = value
    try:
        policy = NAMED_POLICIES[policy_name][1].with_overrides(
            wall_time_s=wall_time, cpu_time_s=cpu_time, cpus=cpus, memory_mb=memory_mb, pids=pids,
            disk_mb=disk_mb, tmp_mb=tmp_mb, open_files=open_files, output_kb=output_kb,
            env=env_pairs or None,
        )
    except FarmError as exc:
        raise click.UsageError(str(exc)) from exc
    sandbox_config: SandboxConfig = ctx.obj.config.sandbox
    result = run_async(_run_once(sandbox_config, list(cmd), policy, files, out))
    emit_json(result)


async def _run_once(config: SandboxConfig, cmd: list[str], policy: SandboxPolicy, files: Path | None,
                    out: Path | None) -> dict[str, Any]:
    async with Sandbox(config) as sandbox:
        result = await sandbox.run(cmd, policy, files=files, keep=out)
    return result.to_json()


@sandbox_group.command("policies")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def sandbox_policies(as_json: bool) -> None:
    """List the named policies and their bounds."""
    data = {name: {"description": desc, **pol.to_dict()} for name, (desc, pol) in NAMED_POLICIES.items()}
    if as_json:
        emit_json(data)
        return
    from rich.table import Table

    table = Table("policy", "wall s", "cpu s", "cpus", "memory MiB", "pids", "disk MiB", "tmp MiB", "output KiB",
                  "what for")
    for name, d in data.items():
        table.add_row(name, f"{d['wall_time_s']:g}", f"{d['cpu_time_s']:g}", f"{d['cpus']:g}", str(d["memory_mb"]),
                      str(d["pids"]), str(d["disk_mb"]), str(d["tmp_mb"]), str(d["output_kb"]), text(d["description"]))
    console().print(table)


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--no-trial", is_flag=True, help="Skip running a trial box.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, no_trial: bool) -> None:
    """Check every isolation feature this host must give a box. Exits 0 only if all are there."""
    config: SandboxConfig = ctx.obj.config.sandbox
    checks = [c.to_json() for c in check_host(config)]
    if all(c["ok"] for c in checks) and not no_trial:
        checks.append(run_async(_trial(config)))
    ok = all(c["ok"] for c in checks)
    if as_json:
        emit_json({"ok": ok, "checks": checks})
    else:
        _print_checks(checks, ok)
    sys.exit(0 if ok else 1)


def _print_checks(checks: list[dict[str, Any]], ok: bool) -> None:
    from rich.text import Text

    out = console()
    for c in checks:
        # A detail quotes configured paths and, for the trial box, what the box printed.
        mark = Text.assemble(("ok", "green"), "  ") if c["ok"] else Text("MISSING", "red")
        out.print(Text.assemble(mark, " ", text(c["name"], "bold"), ": ", text(c["detail"])))
        if c["fix"] and not c["ok"]:
            out.print(Text.assemble("         fix: ", text(c["fix"])))
    out.print("[green]every isolation feature is available[/green]" if ok else
              "[red]farmd will refuse to run untrusted code on this host[/red]")


_TRIAL = """
import os, socket, numpy
assert os.getuid() != 0
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    print("network reachable")
except OSError:
    pass
print("ok", numpy.arange(4).sum())
"""


async def _trial(config: SandboxConfig) -> dict[str, Any]:
    try:
        async with Sandbox(config) as sandbox:
            res = await sandbox.run(["python3", "-c", _TRIAL], SandboxPolicy(wall_time_s=20, cpu_time_s=20))
    except FarmError as exc:
        return {"name": "trial box", "ok": False, "detail": str(exc), "fix": "see the checks above"}
    ok = res.exit_code == 0 and res.stdout.strip() == b"ok 6"
    detail = (f"python3 with numpy ran as a non-root uid with no network in {res.wall_s * 1000:.0f} ms"
              if ok else f"trial program failed: {json.dumps(res.to_json())[:400]}")
    return {"name": "trial box", "ok": ok, "detail": detail, "fix": "" if ok else "report this as a bug"}


@sandbox_group.command("demo")
def sandbox_demo() -> None:
    """Box a fork bomb, a memory bomb, an output flood and more, and show each box held."""
    from farmd.cli.sandbox_demo import main

    main()
