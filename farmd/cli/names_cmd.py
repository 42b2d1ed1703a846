"""``farmctl names``: which credential each name belongs to (node names, consumers, the Atropos trainer
registration and environment ids), and an operator giving one to another credential."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

import click
import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc
from rich.table import Table
from rich.text import Text

from farmd.cli.common import CliState, console, emit_json, json_option
from farmd.cli.remote_cmd import fail_rpc, farm_client
from farmd.cli.shown import text
from farmd.names import KINDS

CALL_TIMEOUT_S = 30.0


class _Names:
    def __init__(self, channel: grpc.Channel, token: str | None) -> None:
        self.stub = farm_pb2_grpc.FarmServiceStub(channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def listing(self, kind: str, limit: int) -> list[farm_pb2.BoundName]:
        out: list[farm_pb2.BoundName] = []
        token = ""
        while len(out) < limit:
            reply = self.stub.ListNames(farm_pb2.ListNamesRequest(kind=kind, page_size=min(limit - len(out), 1000),
                                                                  page_token=token),
                                        metadata=self.metadata, timeout=CALL_TIMEOUT_S)
            out.extend(reply.names)
            token = reply.next_page_token
            if not token or not reply.names:
                break
        return out[:limit]

    def reassign(self, kind: str, name: str, credential: str) -> farm_pb2.ReassignNameResponse:
        return self.stub.ReassignName(farm_pb2.ReassignNameRequest(kind=kind, name=name, credential=credential),
                                      metadata=self.metadata, timeout=CALL_TIMEOUT_S)


@contextlib.contextmanager
def _names(state: CliState) -> Iterator[_Names]:
    try:
        with farm_client(state) as c:
            yield _Names(c.channel, state.token)
    except grpc.RpcError as exc:
        fail_rpc(state, exc)


def _json(n: farm_pb2.BoundName) -> dict[str, Any]:
    return {"kind": n.kind, "name": n.name, "credential": n.credential,
            "claimed_at": n.claimed_at.ToNanoseconds() / 1e9, "assigned_by": n.assigned_by}


def _when(n: farm_pb2.BoundName) -> str:
    return datetime.datetime.fromtimestamp(n.claimed_at.seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


@click.group("names")
def names_group() -> None:
    """Names that belong to credentials: each is the credential's that first used it (an operator's)."""


@names_group.command("list")
@click.option("--kind", type=click.Choice(list(KINDS)), default=None, help="Only names of this kind.")
@click.option("--limit", type=click.IntRange(min=1, max=100_000), default=1000)
@json_option
@click.pass_obj
def names_list(state: CliState, kind: str | None, limit: int, as_json: bool) -> None:
    """Every name held, the credential holding it, and whether an operator gave it."""
    with _names(state) as farm:
        rows = farm.listing(kind or "", limit)
    if as_json:
        emit_json([_json(n) for n in rows])
        return
    table = Table("kind", "name", "credential", "since", "given by")
    for n in rows:
        table.add_row(n.kind, text(n.name), text(n.credential), _when(n), text(n.assigned_by or "its first use"))
    console().print(table)


@names_group.command("reassign")
@click.argument("kind", type=click.Choice(list(KINDS)))
@click.argument("name")
@click.argument("credential")
@json_option
@click.pass_obj
def names_reassign(state: CliState, kind: str, name: str, credential: str, as_json: bool) -> None:
    """Give NAME of KIND to CREDENTIAL (a credential in the farm's config): from now on only it may use the name.

    A node already connected under the name keeps its connection until it reconnects; a stream already open
    keeps streaming, but acks only from CREDENTIAL."""
    with _names(state) as farm:
        reply = farm.reassign(kind, name, credential)
    if as_json:
        emit_json({**_json(reply.name), "previous": reply.previous})
        return
    console().print(Text.assemble(f"{KINDS[kind]} ", text(name), " now belongs to credential ", text(credential),
                                  " (it was ", text(reply.previous) if reply.previous else "nobody's", ")"))
