"""``farmctl export``: the stored trajectories as a file a trainer or a notebook reads as it is.

Two sources, one record: from a running farmd (gRPC) or from a stopped farm's data directory, every
trajectory goes through the wire record (``farm.v1.Trajectory``), so both write the same bytes.

The Parquet schema is derived, never listed: names and Python types from the record's dataclasses
(``farmd/records.py``), and from the wire descriptor what a ``float`` means there (a ``Timestamp``
becomes ``timestamp[us, tz=UTC]``, a 32-bit ``float`` stays 32 bits, a ``Duration`` stays seconds).
A field added to the record is exported without touching this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from farmd.cli.common import EXIT_FAILED, CliState, console, emit_json, fail, json_option, run_async
from farmd.cli.remote_cmd import client
from farmd.cli.shown import text
from farmd.records import Trajectory

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor

# pyarrow and the wire record are imported when an export runs: every other farmctl command would
# pay a third of a second for them.

STORE_PAGE = 256
"""Trajectories read from a data dir at a time: a page, not the farm, is ever in memory."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


# -- the schema, derived from the record -----------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    """One exported field: what its cells are, and how a record's value becomes one."""

    name: str
    kind: str
    """``value`` (as it is), ``list`` (of values), ``json`` (free-form: a JSON string), ``time`` (epoch
    seconds: a timestamp), ``struct`` (a nested record) or ``structs`` (a list of them)."""
    scalar: str = ""
    """Of ``value`` and ``list``: the pyarrow type's factory (``int64``, ``float32``, ``string``, ...)."""
    children: tuple[Column, ...] = ()


def columns(cls: type, descriptor: Descriptor) -> tuple[Column, ...]:
    """The columns of record ``cls``, whose wire message is ``descriptor``, field for field."""
    hints = typing.get_type_hints(cls)
    return tuple(_column(f.name, hints[f.name], descriptor.fields_by_name[f.name])
                 for f in dataclasses.fields(cls))


def _column(name: str, hint: Any, fd: FieldDescriptor) -> Column:
    args = typing.get_args(hint)
    if Any in args:  # dict[str, Any], list[Any]: free-form, no two records need share a shape
        return Column(name, "json")
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: a nullable X
        (hint,) = (a for a in args if a is not type(None))
    if typing.get_origin(hint) is list:
        (item,) = args
        if dataclasses.is_dataclass(item):
            return Column(name, "structs", children=columns(typing.cast(type, item), _message(fd)))
        return Column(name, "list", _scalar(item, fd))
    if dataclasses.is_dataclass(hint):
        return Column(name, "struct", children=columns(typing.cast(type, hint), _message(fd)))
    if fd.message_type is not None and fd.message_type.full_name == "google.protobuf.Timestamp":
        return Column(name, "time")
    return Column(name, "value", _scalar(hint, fd))


def _message(fd: FieldDescriptor) -> Descriptor:
    if fd.message_type is None:
        raise TypeError(f"{fd.full_name} is a record on one side and a scalar on the other")
    return fd.message_type


def _scalar(hint: Any, fd: FieldDescriptor) -> str:
    from google.protobuf.descriptor import FieldDescriptor

    if hint is float:
        # Logprobs travel as 32-bit floats: exporting them as such loses nothing and halves the bulk.
        return "float32" if fd.type == FieldDescriptor.TYPE_FLOAT else "float64"
    names = {bool: "bool_", int: "int64", str: "string"}
    if hint not in names:
        raise TypeError(f"{fd.full_name}: no Arrow type for the record's {hint!r}")
    return names[hint]


def arrow_type(column: Column) -> Any:
    import pyarrow as pa

    if column.kind == "json":
        return pa.string()
    if column.kind == "time":
        return pa.timestamp("us", tz="UTC")
    if column.kind in ("struct", "structs"):
        struct = pa.struct([pa.field(c.name, arrow_type(c)) for c in column.children])
        return struct if column.kind == "struct" else pa.list_(struct)
    scalar = getattr(pa, column.scalar)()
    return pa.list_(scalar) if column.kind == "list" else scalar


@functools.cache
def record_columns() -> tuple[Column, ...]:
    from farm.v1 import trajectory_pb2

    return columns(Trajectory, trajectory_pb2.Trajectory.DESCRIPTOR)


@functools.cache
def schema(view: str) -> Any:
    """The Arrow schema of ``view`` (``record`` or ``flat``)."""
    import pyarrow as pa

    record = pa.schema([pa.field(c.name, arrow_type(c)) for c in record_columns()])
    if view == "record":
        return record
    # TRL's conversational prompt-completion format, plus what a trainer filters and pairs rows by.
    chat = record.field("messages").type.value_type
    message = pa.list_(pa.struct([chat.field("role"), chat.field("content")]))
    return pa.schema([record.field("id"), record.field("group_id"), record.field("env"),
                      pa.field("prompt", message), pa.field("completion", message),
                      record.field("reward"), record.field("passed"), record.field("status")])


def micros(seconds: float) -> int | None:
    """Epoch seconds as whole microseconds; 0.0 is the wire's "never set", exported as null."""
    return round(seconds * 1e6) if seconds else None


def rfc3339(us: int) -> str:
    return (_EPOCH + datetime.timedelta(microseconds=us)).isoformat(timespec="microseconds").replace("+00:00", "Z")


def cell(column: Column, value: Any, stamp: Callable[[int], Any]) -> Any:
    """``value`` of ``column`` as exported; ``stamp`` turns a time (microseconds) into its cell."""
    kind = column.kind
    if kind in ("value", "list"):
        return value
    if kind == "time":
        us = micros(value)
        return None if us is None else stamp(us)
    if kind == "json":
        # Sorted: a Struct's key order is not kept on the wire, and an export should not depend on it.
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    if kind == "struct":
        return row(column.children, value, stamp)
    return [row(column.children, v, stamp) for v in value]


def row(cols: tuple[Column, ...], record: Any, stamp: Callable[[int], Any]) -> dict[str, Any]:
    return {c.name: cell(c, getattr(record, c.name), stamp) for c in cols}


# -- the flat view ---------------------------------------------------------------------------------


def flat_row(t: Any) -> dict[str, Any]:
    """``prompt``: the conversation before the model's first reply; ``completion``: from that reply on.

    A record with no conversation (a scripted agent's) is the task's prompt as the user's message and
    ``final`` as the assistant's. An error verdict has a null ``reward`` and ``passed``: the verifier
    could not judge it, and a tool that reads only ``reward`` must not take it for a 0.
    """
    talk = [{"role": m.role, "content": m.content} for m in t.messages]
    if not talk:
        talk = [{"role": "user", "content": t.task.prompt}, {"role": "assistant", "content": t.final}]
    first = next((i for i, m in enumerate(talk) if m["role"] == "assistant"), len(talk))
    judged = t.status != "error"
    return {"id": t.id, "group_id": t.group_id, "env": t.env, "prompt": talk[:first], "completion": talk[first:],
            "reward": t.reward if judged else None, "passed": t.passed if judged else None, "status": t.status}


# -- writing -----------------------------------------------------------------------------------------


class Sink:
    """Writes pages of records as they come to a partial file, which becomes ``path`` only when every
    page is written: an export that stopped half way never looks like a whole one."""

    def __init__(self, path: Path, fmt: str, view: str) -> None:
        self.path = path
        self.fmt = fmt
        self.view = view
        self.count = 0
        self.partial = path.with_name(f".{path.name}.partial")
        self._schema = schema(view)
        self._jsonl: Any = None
        self._parquet: Any = None

    def __enter__(self) -> Sink:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.fmt == "jsonl":
            self._jsonl = open(self.partial, "w", encoding="utf-8")
        else:
            import pyarrow.parquet as pq

            self._parquet = pq.ParquetWriter(self.partial, self._schema)
        return self

    def write(self, page: list[Any]) -> None:
        if self.fmt == "jsonl":
            rows = self._rows(page, rfc3339)
            self._jsonl.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        else:
            import pyarrow as pa

            self._parquet.write_table(pa.Table.from_pylist(self._rows(page, int), schema=self._schema))
        self.count += len(page)

    def _rows(self, page: list[Any], stamp: Callable[[int], Any]) -> list[dict[str, Any]]:
        if self.view == "flat":
            return [flat_row(t) for t in page]
        return [row(record_columns(), t, stamp) for t in page]

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._parquet is not None:
            self._parquet.close()  # with no page written, still a valid file: the schema and no rows
        if exc_type is None:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)


@contextlib.contextmanager
def progress(total: int) -> Iterator[Callable[[int], None]]:
    """A bar on stderr, for a person (stdout may be a --json summary); yields ``advance(n)``. A farm
    still running may store more than ``total`` while it is exported."""
    with Progress(TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as bar:
        task = bar.add_task("export", total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)
            done = bar.tasks[0].completed
            if done > total:
                bar.update(task, total=done)

        yield advance


def _total(pass_rates: list[dict[str, Any]], env: str) -> int:
    return sum(int(r["trajectories"]) for r in pass_rates if not env or r["env"] == env)


def export_farmd(state: CliState, sink: Sink, env: str) -> None:
    with client(state) as c, progress(_total(c.status()["pass_rates"], env)) as advance:
        for page in c.trajectory_pages(env=env, full=True):
            sink.write(page)
            advance(len(page))


def served(t: Trajectory) -> Trajectory:
    """``t`` as farmd serves it: through the wire record and back (bounded, logprobs 32-bit, enums checked)."""
    from farm.v1 import trajectory_pb2
    from farm_client.convert import from_message

    from farmd.api.trajectories import trajectory_pb

    wire = trajectory_pb2.Trajectory.FromString(trajectory_pb(t).SerializeToString())
    return from_message(wire, Trajectory)


async def export_store(data_dir: Path, sink: Sink, env: str) -> None:
    from farmd.store import Store

    path = data_dir / "farm.db"
    if not path.exists():
        fail(f"{data_dir} holds no farm.db", EXIT_FAILED)
    store = await Store.open(path)
    try:
        with progress(_total(await store.pass_rates(), env)) as advance:
            after = 0
            while page := await store.trajectories(after_seq=after, limit=STORE_PAGE, env=env or None):
                sink.write([served(t) for t in page])
                advance(len(page))
                after = page[-1].seq
    finally:
        await store.close()


@click.command()
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default="jsonl", show_default=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Read a stopped farm's data directory instead of asking farmd.")
@click.option("--env", "env_name", default="", help="Only this environment.")
@click.option("--view", type=click.Choice(["record", "flat"]), default="record", show_default=True,
              help="record: every field; flat: prompt/completion/reward rows for SFT and DPO tools.")
@json_option
@click.pass_obj
def export(state: CliState, fmt: str, out_path: Path, data_dir: Path | None, env_name: str, view: str,
           as_json: bool) -> None:
    """Write every stored trajectory to a file, a page at a time, the same from farmd or from --data.

    \b
    --view record (the default): one row per trajectory, every field of the
    record, nested as it is: task, sampling, usage and timings are structs;
    messages, turns, steps and scores lists of structs (token ids int64,
    logprobs float32). Durations (timings, latency, step duration) are float
    seconds; started_at, finished_at and scored_at are timestamp[us, UTC] in
    Parquet and RFC 3339 strings in jsonl, null when never set. Free-form
    fields (verdict_details, task.examples, task.metadata, sampling.extra)
    are JSON strings in both formats. scores stays empty: a listing carries
    no later verdicts (trajectories show ID has them).

    \b
    --view flat: id, group_id, env, prompt, completion, reward, passed,
    status. prompt and completion are lists of {role, content} (TRL's
    conversational prompt-completion format): the conversation before the
    model's first reply, and from that reply on. A trajectory without a
    conversation gives the task's prompt and its final answer. reward and
    passed are null for an error verdict (the verifier could not judge it).
    """
    sink = Sink(out_path, fmt, view)
    with sink:
        if data_dir is not None:
            run_async(export_store(data_dir, sink, env_name))
        else:
            export_farmd(state, sink, env_name)
    if as_json:
        emit_json({"exported": sink.count, "path": str(out_path), "format": fmt, "view": view})
    else:
        console().print(Text.assemble(f"exported {sink.count} trajectories to ", text(out_path)))
