"""``farmctl policy``: published policy versions, which of them the farm still holds, and an operator's pins.

A version's content is kept while a job is queued or leased for it, while it is among the newest of its line
(``[scheduler] policy_keep_newest``), or while it is pinned; then it is removed and its hash and metadata stay.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from farmd.cli.common import CliState, console, emit_json, json_option
from farmd.cli.remote_cmd import client
from farmd.cli.shown import text
from farmd.cli.status_view import human_bytes


@click.group("policy")
def policy_group() -> None:
    """Policy versions: which are kept, pinned or removed, and pinning one so its content is kept."""


@policy_group.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="The newest this many.")
@json_option
@click.pass_obj
def policy_list(state: CliState, limit: int, as_json: bool) -> None:
    """The newest policy versions: line, size, kept, pinned, or removed and why."""
    with client(state) as c:
        rows = c.policies(limit)
    if as_json:
        emit_json(rows)
        return
    table = Table("version", "line", "size", "sha256", "content", "published", title_justify="left",
                  title="policy versions (newest first)")
    for p in rows:
        table.add_row(str(p["version"]), text(p["name"]), human_bytes(p["size"]), text(p["sha256"][:12]),
                      _content(p), _when(p["created_at"]))
    console().print(table)
    for p in rows:
        if p["removed"]:
            console().print(Text.assemble(f"  {p['version']} removed: ", text(p["removed_reason"])))


@policy_group.command("pin")
@click.argument("version", type=click.IntRange(min=1))
@json_option
@click.pass_obj
def policy_pin(state: CliState, version: int, as_json: bool) -> None:
    """Keep VERSION's content whatever else holds, until it is unpinned."""
    _pin(state, version, True, as_json)


@policy_group.command("unpin")
@click.argument("version", type=click.IntRange(min=1))
@json_option
@click.pass_obj
def policy_unpin(state: CliState, version: int, as_json: bool) -> None:
    """Stop keeping VERSION's content for its pin: it goes once nothing else uses it (no job queued or leased for
    it, not among the newest of its line)."""
    _pin(state, version, False, as_json)


def _pin(state: CliState, version: int, pinned: bool, as_json: bool) -> None:
    with client(state) as c:
        row = c.pin_policy(version, pinned)
    if as_json:
        emit_json(row)
        return
    console().print(Text.assemble(f"policy version {row['version']} (line ", text(row["name"]), "): ",
                                  "pinned: its content is kept until it is unpinned" if pinned else
                                  "unpinned: its content goes once nothing uses it"))


def _content(p: dict[str, Any]) -> Text:
    if p["removed"]:
        return Text(f"removed {_when(p['removed_at'])}", "yellow")
    if p["pinned"]:
        return Text("kept (pinned)", "green")
    return Text("kept" if p["kept"] else "uri only")


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"
