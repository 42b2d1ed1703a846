"""``farmctl export``: the stored trajectories as a file a trainer or a notebook reads as it is; and
``farmctl withdrawn``: which of an export's trajectories were withdrawn or rescored since it was made.

Two sources, one record: from a running farmd (gRPC) or from a stopped farm's data directory, every
trajectory goes through the wire record (``farm.v1.Trajectory``), so both write the same bytes. Every row
holds its trajectory's current verdict; withdrawn ones are left out unless asked for (and then shown
withdrawn). Beside the file goes its manifest (``OUT.manifest.json``): the farm's verdict mark when the
export began and each exported trajectory's ``verdict_version``, which is all ``farmctl withdrawn`` needs to
say what changed since.

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
import tempfile
import types
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from farmd.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliState,
    console,
    emit_json,
    fail,
    json_option,
    progress_console,
    run_async,
)
from farmd.cli.remote_cmd import client, say_withdrawn_left_out
from farmd.cli.shown import text
from farmd.errors import StoreError
from farmd.records import Trajectory

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor

# pyarrow and the wire record are imported when an export runs: every other farmctl command would
# pay a third of a second for them.

STORE_PAGE = 256
"""Trajectories read from a data dir at a time: a page, not the farm, is ever in memory."""
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 1 << 30
"""A manifest lists two numbers per trajectory: a gigabyte is tens of millions of them."""

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


def manifest_path(path: Path) -> Path:
    """Where the manifest of an export written to ``path`` goes: beside it."""
    return path.with_name(path.name + MANIFEST_SUFFIX)


class Sink:
    """Writes pages of records as they come to a partial file, which becomes ``path`` only when every
    page is written: an export that stopped half way never looks like a whole one. Its manifest (what was
    exported, at which verdict) is written beside it the same way, after it."""

    def __init__(self, path: Path, fmt: str, view: str) -> None:
        self.path = path
        self.fmt = fmt
        self.view = view
        self.count = 0
        self.partial = path.with_name(f".{path.name}.partial")
        self.manifest = manifest_path(path)
        self.verdict_mark = 0
        """The farm's verdict mark when the export began (set by the source before its first page)."""
        self.withdrawn_left_out = 0
        self.exported: list[list[int]] = []
        """[id, verdict_version] of each row written."""
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
        self.exported.extend([t.id, t.verdict_version] for t in page)
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
            self._write_manifest()
        else:
            self.partial.unlink(missing_ok=True)

    def _write_manifest(self) -> None:
        partial = self.manifest.with_name(f".{self.manifest.name}.partial")
        with open(partial, "w", encoding="utf-8") as fh:
            json.dump({"farm_export_manifest": MANIFEST_FORMAT, "path": self.path.name, "format": self.fmt,
                       "view": self.view, "verdict_mark": self.verdict_mark,
                       "withdrawn_left_out": self.withdrawn_left_out, "trajectories": self.exported}, fh,
                      separators=(",", ":"))
        os.replace(partial, self.manifest)


@contextlib.contextmanager
def progress(total: int) -> Iterator[Callable[[int], None]]:
    """A bar on stderr, for a person (stdout may be a --json summary); yields ``advance(n)``. A farm
    still running may store more than ``total`` while it is exported."""
    with Progress(TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=progress_console()) as bar:
        task = bar.add_task("export", total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)
            done = bar.tasks[0].completed
            if done > total:
                bar.update(task, total=done)

        yield advance


def _total(pass_rates: list[tuple[str, int]], env: str) -> int:
    """Trajectories to export, from (env, trajectories) rows: the progress bar's total."""
    return sum(n for e, n in pass_rates if not env or e == env)


def export_farmd(state: CliState, sink: Sink, env: str, include_withdrawn: bool) -> None:
    with client(state) as c, progress(_total([(r["env"], int(r["trajectories"])) for r in c.status()["pass_rates"]], env)) as advance:
        for page in c.trajectory_pages(env=env, full=True, include_withdrawn=include_withdrawn):
            sink.verdict_mark, sink.withdrawn_left_out = page.verdict_mark, page.withdrawn_left_out
            sink.write(page)
            advance(len(page))


def served(t: Trajectory) -> Trajectory:
    """``t`` as farmd serves it: through the wire record and back (bounded, logprobs 32-bit, enums checked)."""
    from farm.v1 import trajectory_pb2
    from farm_client.convert import from_message

    from farmd.api.trajectories import trajectory_pb

    wire = trajectory_pb2.Trajectory.FromString(trajectory_pb(t).SerializeToString())
    return from_message(wire, Trajectory)


@dataclasses.dataclass(frozen=True, slots=True)
class StoreSource:
    """Where ``--data`` / ``--store`` say a farm's stored trajectories are, read without farmd."""

    data_dir: Path | None
    url: str | None

    @property
    def given(self) -> bool:
        return self.data_dir is not None or self.url is not None


def store_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--data`` and ``--store``: read the store itself, not farmd. Not FARM_STORE, which farmd serve takes: a
    variable set for farmd would quietly turn every farmctl export into a read of the database."""
    command = click.option("--store", "store_url", metavar="URL", callback=_postgresql_url,
                           help="Read the farm's PostgreSQL store (postgresql://USER@HOST/DB, as farmd serve --store) "
                                "instead of asking farmd; a running farm's too.")(command)
    return click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
                        help="Read a stopped farm's data directory (its SQLite farm.db) instead of asking "
                             "farmd.")(command)


def _postgresql_url(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("a postgresql://USER@HOST/DB address (a SQLite farm is read with --data)")
    return value


@contextlib.asynccontextmanager
async def opened_store(source: StoreSource) -> AsyncIterator[Any]:
    """The store a source names (opening it migrates an older one, as farmd would). On PostgreSQL the data
    directory holds nothing a reader needs, so without ``--data`` an empty one stands in."""
    from farmd.store import Store

    with contextlib.ExitStack() as stack:
        data_dir = source.data_dir
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="farmctl-store-")))
        path = data_dir / "farm.db"
        if source.url is None and not path.exists():
            fail(f"{data_dir} holds no farm.db", EXIT_FAILED)
        try:
            store = await Store.open(path, source.url)
        except StoreError as exc:
            fail(str(exc), EXIT_FAILED)
        try:
            yield store
        finally:
            await store.close()


_BY_EXTENSION = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


def format_for(out_path: Path, asked: str | None) -> str:
    """The format a file named ``out_path`` is written in: what was asked, else what its extension says, else
    jsonl. Asked for one its extension contradicts, it is refused: a reader (``datasets``, pyarrow) goes by the
    name, and would refuse the file."""
    named = _BY_EXTENSION.get(out_path.suffix.lower())
    if asked is None:
        return named or "jsonl"
    if named is not None and named != asked:
        raise click.UsageError(f"--out {out_path.name} names a {named} file but --format is {asked}: rename the "
                               f"file or drop --format (the extension decides)")
    return asked


async def export_store(source: StoreSource, sink: Sink, env: str, include_withdrawn: bool) -> None:
    async with opened_store(source) as store:
        # As farmd answers a listing: the mark before the first page, and what was left out.
        sink.verdict_mark = await store.verdicts.mark()
        if not include_withdrawn:
            sink.withdrawn_left_out = await store.withdrawn_count(env=env or None)
        with progress(_total([(r.env, r.trajectories) for r in await store.pass_rates()], env)) as advance:
            after = 0
            while page := await store.trajectories(after_seq=after, limit=STORE_PAGE, env=env or None,
                                                   withdrawn=include_withdrawn):
                sink.write([served(t) for t in page])
                advance(len(page))
                after = page[-1].seq


@click.command()
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl"]), default=None,
              help="Default: from --out's extension (.parquet, .pq; .jsonl, .ndjson, .json), else jsonl.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), required=True)
@store_options
@click.option("--env", "env_name", default="", help="Only this environment.")
@click.option("--view", type=click.Choice(["record", "flat"]), default="record", show_default=True,
              help="record: every field; flat: prompt/completion/reward rows for SFT and DPO tools.")
@click.option("--include-withdrawn", is_flag=True,
              help="Withdrawn trajectories too (a quarantine took them back): reward 0, passed false, flagged.")
@json_option
@click.pass_obj
def export(state: CliState, fmt: str | None, out_path: Path, data_dir: Path | None, store_url: str | None,
           env_name: str, view: str, include_withdrawn: bool, as_json: bool) -> None:
    """Write every stored trajectory to a file, a page at a time, the same from farmd, --data or --store.

    \b
    Every row holds its trajectory's current verdict: a rescore's, or a
    withdrawal's. Withdrawn trajectories are left out (stderr says how many)
    unless --include-withdrawn, which writes them with reward 0 and passed
    false, flagged withdrawn and quarantined. OUT.manifest.json goes beside
    the file: each exported id with its verdict_version, and the farm's
    verdict mark; `farmctl withdrawn --since OUT.manifest.json` lists those
    withdrawn or rescored since, to drop from a dataset made of the export.

    \b
    --view record (the default): one row per trajectory, every field of the
    record, nested as it is: task, sampling, usage and timings are structs;
    messages, turns, steps and scores lists of structs (token ids int64,
    logprobs float32). Durations (timings, latency, step duration) are float
    seconds; started_at, finished_at and scored_at are timestamp[us, UTC] in
    Parquet and RFC 3339 strings in jsonl, null when never set. Free-form
    fields (verdict_details, task.examples, task.metadata, sampling.extra)
    are JSON strings in both formats. scores holds every verdict it was
    given, the first included; verdict_version says which is current.

    \b
    --view flat: id, group_id, env, prompt, completion, reward, passed,
    status. prompt and completion are lists of {role, content} (TRL's
    conversational prompt-completion format): the conversation before the
    model's first reply, and from that reply on. A trajectory without a
    conversation gives the task's prompt and its final answer. reward and
    passed are null for an error verdict (the verifier could not judge it).
    """
    fmt = format_for(out_path, fmt)
    sink = Sink(out_path, fmt, view)
    source = StoreSource(data_dir, store_url)
    with sink:
        if source.given:
            run_async(export_store(source, sink, env_name, include_withdrawn))
        else:
            export_farmd(state, sink, env_name, include_withdrawn)
    say_withdrawn_left_out(sink.withdrawn_left_out, "--include-withdrawn exports them")
    if as_json:
        emit_json({"exported": sink.count, "path": str(out_path), "format": fmt, "view": view,
                   "withdrawn_left_out": sink.withdrawn_left_out, "manifest": str(sink.manifest),
                   "verdict_mark": sink.verdict_mark})
    else:
        console().print(Text.assemble(f"exported {sink.count} trajectories to ", text(out_path), " (manifest ",
                                      text(sink.manifest), ")"))


# -- after the fact: what changed since an export --------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Manifest:
    """What an export wrote: the farm's verdict mark when it began, and each row's id and verdict_version."""

    path: Path
    verdict_mark: int
    exported: dict[int, int]


def read_manifest(path: Path) -> Manifest:
    """A manifest ``farmctl export`` wrote, checked for its shape; what is not one is a usage error."""
    def bad(why: str) -> NoReturn:
        fail(f"{path} is not an export's manifest ({why}): give the OUT{MANIFEST_SUFFIX} farmctl export wrote "
             "beside its file", EXIT_USAGE, kind="USAGE_ERROR")

    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        bad(exc.strerror or type(exc).__name__)
    if len(raw) > MAX_MANIFEST_BYTES:
        bad(f"over {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        bad(f"not JSON: {str(exc)[:200]}")
    if not isinstance(data, dict) or data.get("farm_export_manifest") != MANIFEST_FORMAT:
        bad(f"no farm_export_manifest {MANIFEST_FORMAT}")
    mark, rows = data.get("verdict_mark"), data.get("trajectories")
    if not isinstance(mark, int) or not _count(mark) or not isinstance(rows, list):
        bad("no verdict_mark and trajectories")
    exported: dict[int, int] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 2 and _count(row[0]) and _count(row[1])):
            bad(f"a trajectory is [id, verdict_version], not {json.dumps(row)[:80]}")
        exported[row[0]] = row[1]
    return Manifest(path, mark, exported)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _verdict(score: Any) -> dict[str, Any] | None:
    if score is None:
        return None
    return {"verdict_version": score.verdict_version, "reward": score.reward, "passed": score.passed,
            "status": score.status, "flags": list(score.flags), "reasons": list(score.reasons),
            "verifier_version": score.verifier_version}


def change_entry(change: Any, exported_version: int) -> dict[str, Any]:
    """One exported trajectory whose verdict is no longer the one exported: what it was, what it is, why.
    ``change`` is a verdict change as the store or ``farm_client`` gives it (the same fields)."""
    was = next((s for s in change.scores if s.verdict_version == exported_version), None)
    now = next((s for s in change.scores if s.verdict_version == change.verdict_version), None)
    differs = change.withdrawn or was is None or now is None or \
        (was.reward, was.passed, was.status) != (now.reward, now.passed, now.status)
    why = change.withdrawal_reason if change.withdrawn else "; ".join(now.reasons if now is not None else [])
    return {"id": change.trajectory_id, "env": change.env, "withdrawn": change.withdrawn, "changed": differs,
            "was": _verdict(was), "now": _verdict(now), "why": why}


def changes_since(manifest: Manifest, changes: Iterator[Any]) -> list[dict[str, Any]]:
    """The exported trajectories among ``changes`` (everything changed after the manifest's mark) whose current
    verdict is not the one exported (one changed while the export ran may have been exported changed)."""
    out = []
    for change in changes:
        exported = manifest.exported.get(change.trajectory_id)
        if exported is not None and exported != change.verdict_version:
            out.append(change_entry(change, exported))
    return out


async def _store_changes(source: StoreSource, after: int) -> list[Any]:
    async with opened_store(source) as store:
        found: list[Any] = []
        while page := await store.verdicts.changed(after, STORE_PAGE):
            found += page
            after = page[-1].verdict_version
        return found


@click.command("withdrawn")
@click.option("--since", "since", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help=f"The manifest an export wrote beside its file (OUT{MANIFEST_SUFFIX}).")
@store_options
@json_option
@click.pass_obj
def withdrawn(state: CliState, since: Path, data_dir: Path | None, store_url: str | None, as_json: bool) -> None:
    """Which trajectories of an export were withdrawn or rescored since it was made: each one's id, the verdict
    exported, the verdict it holds now and why. Drop those rows from a dataset made of the export ("changed"
    false: a later verdict that gives the same reward, such as a node's verdict the farm checked)."""
    manifest = read_manifest(since)
    source = StoreSource(data_dir, store_url)
    if source.given:
        changes: Iterator[Any] = iter(run_async(_store_changes(source, manifest.verdict_mark)))
        entries = changes_since(manifest, changes)
    else:
        with client(state) as c:
            entries = changes_since(manifest, c.verdict_changes(manifest.verdict_mark))
    pulled = [e for e in entries if e["withdrawn"]]
    summary = {"since": str(since), "verdict_mark": manifest.verdict_mark, "exported": len(manifest.exported),
               "withdrawn": len(pulled), "rescored": len(entries) - len(pulled),
               "changed": sum(1 for e in entries if e["changed"]), "trajectories": entries}
    if as_json:
        emit_json(summary)
        return
    out = console()
    out.print(Text.assemble(f"of {len(manifest.exported)} trajectories exported (", text(since), f"), "
                            f"{len(pulled)} were withdrawn and {len(entries) - len(pulled)} rescored since"))
    if entries:
        table = Table("id", "env", "was", "now", "why")
        for e in entries:
            table.add_row(str(e["id"]), text(e["env"]), _shown_verdict(e["was"]),
                          "withdrawn" if e["withdrawn"] else _shown_verdict(e["now"]), text(e["why"]))
        out.print(table)


def _shown_verdict(v: dict[str, Any] | None) -> str:
    if v is None:
        return "?"
    if v["status"] == "error":
        return "error"
    return f"{v['reward']:.3f} {'pass' if v['passed'] else 'fail'}"
