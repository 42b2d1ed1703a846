"""``farmctl nodes``: the fleet's joined nodes as the coordinator sees them, and letting a quarantined one back."""

from __future__ import annotations

import click

from farmd.cli.common import CliState, console, emit_json, json_option
from farmd.cli.remote_cmd import client
from farmd.cli.shown import text
from farmd.cli.status_view import nodes_table, quarantine_lines


@click.group("nodes")
def nodes_group() -> None:
    """Joined nodes: what each ran, what the coordinator checked of it, and quarantines."""


@nodes_group.command("list")
@json_option
@click.pass_obj
def nodes_list(state: CliState, as_json: bool) -> None:
    """Every node: state, capacity, results, checks, refusals; why a quarantined one is."""
    with client(state) as c:
        info = c.status()
    if as_json:
        emit_json(info["nodes"])
        return
    out = console()
    out.print(nodes_table(info))
    for line in quarantine_lines(info):
        out.print(line)


@nodes_group.command("clear")
@click.argument("name")
@json_option
@click.pass_obj
def nodes_clear(state: CliState, name: str, as_json: bool) -> None:
    """Let quarantined node NAME join again. What was withdrawn of its results stays withdrawn; its first results
    after it joins are all verified again."""
    with client(state) as c:
        result = c.clear_node(name)
    if as_json:
        emit_json(result)
        return
    console().print("cleared ", text(name), ": it may join again (it was quarantined: ", text(result["reason"]), ")",
                    sep="")
