"""Commands that talk to a running farmd over gRPC."""

from __future__ import annotations

import sys

import click
import grpc

from farmd.cli.common import EXIT_FAILED, CliState, console, emit_json, fail


def _client(state: CliState):  # type: ignore[no-untyped-def]
    from farm_client import FarmClient

    return FarmClient(state.addr, token=state.token)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(state: CliState, as_json: bool) -> None:
    """Show the node: version, uptime, workers and whether it can isolate untrusted code."""
    try:
        with _client(state) as client:
            info = client.status()
    except grpc.RpcError as exc:
        fail(f"{state.addr}: {exc.code().name}: {exc.details()}", EXIT_FAILED)
    if as_json:
        emit_json(info)
        return
    out = console()
    iso = "[green]yes[/green]" if info["isolation_ok"] else "[red]NO: it refuses to run untrusted code[/red]"
    out.print(f"[bold]farmd {info['version']}[/bold] on {info['node']} at {state.addr}, up {info['uptime_s']:.0f}s")
    out.print(f"workers: {info['workers']}   boxes at once: {info['max_boxes']}   isolation: {iso}")
    for c in info["isolation"]:
        if not c["ok"]:
            out.print(f"  missing {c['name']}: {c['detail']}")
    sys.stdout.flush()
