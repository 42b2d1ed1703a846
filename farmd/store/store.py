"""Every byte of SQL in farm: the durable job queue, trajectories, scores, consumers, policies.

One aiosqlite connection (its own thread) in WAL mode. Every write is one
``BEGIN IMMEDIATE`` transaction, so a crash at any instant leaves either all of an
operation or none of it: completing a job and storing its trajectory is one
transaction (a job's id is its trajectory's id, so a retried completion can never
store twice), and an accepted job is in the database before ``enqueue`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import re
import sqlite3
import sys
import time
import zlib
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from farmd import domain
from farmd.errors import CursorError, StoreError
from farmd.flags import UNREADABLE, WITHDRAWN
from farmd.private import create_file, make_dir
from farmd.records import (
    CANARY_PREFIX,
    RED_TEAM_PREFIX,
    VERIFIED_EXTERNAL,
    ChatMessage,
    Job,
    JobState,
    Policy,
    Score,
    Trajectory,
    Turn,
    from_plain,
)
from farmd.store.activity import ActivityRecords
from farmd.store.atropos import AtroposRecords
from farmd.store.filters import TrajectoryFilter
from farmd.store.intake import IntakeRecords, withdraw
from farmd.store.names import NameRecords
from farmd.store.nodes import Completion, NodeRecords, lease_identity
from farmd.store.policy_files import PolicyFiles, PolicyUpload
from farmd.store.retention import RetentionRecords
from farmd.store.schema import MIGRATIONS
from farmd.store.verdicts import FIRST, VerdictRecords, give
from farmd.text import valid_text, valid_tree

log = logging.getLogger("farmd.store")

_JOB_COLUMNS = "id, group_id, env, seed, difficulty, agent, state, attempts, lease_owner, lease_expires, " \
               "policy_version, source"
_POLICY_COLUMNS = "version, sha256, size, uri, created_at, name"
_TRAJ_COLUMNS = "id, seq, group_id, env, env_version, seed, difficulty, agent, policy_version, reward, passed, " \
                "status, reasons, flags, verifier_version, body, node, finished_at, run_id, verified_by, verdict_version"
_BODY_INDEX = [c.strip() for c in _TRAJ_COLUMNS.split(",")].index("body")
_COLUMN_INDEX = tuple(i for i, c in enumerate(_TRAJ_COLUMNS.split(",")) if c.strip() != "body")


_MAX_VARS = 10_000
CONTRIBUTED_ENV_PREFIX = "contrib:"
"""Only a contributed environment can be quarantined: only its trajectories are looked at for withdrawal."""


_WITHDRAWN = "EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = trajectories.id)"
"""A trajectory a quarantine took back: its current verdict is the withdrawn one, for good."""


CURSOR_KINDS = ("trajectories", "groups")
"""What a consumer's cursor counts: stored trajectories (``seq``) or finished groups (``done_seq``)."""


def _kind(kind: str) -> str:
    if kind not in CURSOR_KINDS:
        raise ValueError(f"a cursor counts {' or '.join(CURSOR_KINDS)}, not {kind!r}")
    return kind


def _consumer_rows(rows: list[Any]) -> list[dict[str, Any]]:
    return [{"name": n, "kind": k, "acked": int(a), "updated_at": float(t)} for n, k, a, t in rows]


def _subscribed(agent: str | None, envs: Sequence[str], *, streamed: bool = False, groups: bool = False
                ) -> tuple[str, list[object]]:
    """SQL (starting with AND, or empty) and its parameters keeping only ``agent``'s rows of ``envs``;
    ``streamed``: and none of a quarantined environment, nor one withdrawn alone (its node was quarantined), nor
    for ``groups`` (rows of ``groups``, not ``trajectories``) a group holding one (no trainer stream sends them),
    nor an intake canary's (a known-wrong attempt that checks a contributed verifier, never data)."""
    where, args = "", list[object]()
    if streamed:
        where = " AND env NOT IN (SELECT env FROM quarantined_envs) AND substr(agent, 1, ?) != ?"
        args += [len(CANARY_PREFIX), CANARY_PREFIX]
        where += (" AND withheld = 0" if groups else
                  " AND NOT EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = trajectories.id)")
    if agent:
        where += " AND agent = ?"
        args.append(agent)
    if envs:
        where += f" AND env IN ({','.join('?' * len(envs))})"
        args.extend(envs)
    return where, args


def _job(row: aiosqlite.Row) -> Job:
    return Job(id=row[0], group_id=row[1], env=row[2], seed=row[3], difficulty=row[4], agent=row[5],
               state=JobState(row[6]), attempts=row[7], lease_owner=row[8], lease_expires=row[9],
               policy_version=row[10], source=row[11])


_COLUMN_FIELDS = tuple(c.strip() for c in _TRAJ_COLUMNS.split(",") if c.strip() != "body")
_BODY_VERSION = 3
"""3: the JSON is followed by the turns' token ids and logprobs as arrays. 2: all of it JSON. Both are read."""
_UNSTORED = frozenset({"scores"})
"""Scores live in their own table (re-scoring adds rows); they are read with a trajectory, never packed in it."""
_PACKED_FIELDS = tuple(f.name for f in fields(Trajectory) if f.name not in {*_COLUMN_FIELDS, *_UNSTORED})
_TURN_FIELDS = tuple(f.name for f in fields(Turn))
_ARRAYS = (("prompt_token_ids", "u32", "I"), ("token_ids", "u32", "I"), ("logprobs", "f64", "d"))
"""A turn's long lists, kept after the compressed JSON as little-endian arrays, each marked in the JSON by
``{kind: length}``. As JSON text they were most of a body's bytes, and a float's shortest repr made them
most of the time spent packing and reading one; random-looking ids and logprobs gain little from zlib."""
_SWAP = sys.byteorder == "big"
assert array("I").itemsize == 4 and array("d").itemsize == 8, "the arrays' item sizes are the body format's"


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _as_json(value: Any) -> Any:
    """``json.dumps``'s ``default``: a nested record as its fields, as ``to_plain`` has it, but built by
    the encoder as it goes rather than by a walk of every list item first."""
    if is_dataclass(value) and not isinstance(value, type):
        return {name: getattr(value, name) for name in _field_names(type(value))}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _pack(traj: Trajectory) -> bytes:
    """Everything of a trajectory that is not a column: compressed JSON of the record's own field list,
    then the turns' arrays."""
    body: dict[str, Any] = {"v": _BODY_VERSION}
    for name in _PACKED_FIELDS:
        body[name] = getattr(traj, name)
    arrays = bytearray()
    body["turns"] = [_pack_turn(turn, traj.messages, arrays) for turn in traj.turns]
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=_as_json)
    return zlib.compress(_utf8(text), 1) + arrays


pack_body = _pack
"""For records made outside the store's own writes (``farmd.store.atropos``): packed off the event loop."""


def _checked_bodies(records: dict[int, Trajectory]) -> tuple[dict[int, bytes], dict[int, list[str]]]:
    """Each record's body, or what is out of its domain (``farmd.domain``), by id: in a thread."""
    bodies: dict[int, bytes] = {}
    refused: dict[int, list[str]] = {}
    for tid, t in records.items():
        found = domain.problems(t)
        if found:
            refused[tid] = found
        else:
            bodies[tid] = _pack(t)
    return bodies, refused


def _pack_turn(turn: Turn, messages: list[ChatMessage], arrays: bytearray) -> dict[str, Any]:
    plain = {name: getattr(turn, name) for name in _TURN_FIELDS}
    i = turn.message_index
    if i < len(messages) and messages[i].content == turn.completion:  # its assistant message's: kept once
        plain["completion"] = None
    for name, kind, code in _ARRAYS:
        try:
            packed = array(code, plain[name])
        except (TypeError, OverflowError):
            continue  # not what a model server sends (a negative id, a None): kept as given, in the JSON
        if _SWAP:
            packed.byteswap()
        arrays += packed
        plain[name] = {kind: len(packed)}
    return plain


def _unpack(raw: bytes) -> dict[str, Any]:
    inflate = zlib.decompressobj()
    text = inflate.decompress(raw)
    if not inflate.eof:
        raise zlib.error("a trajectory body ends inside its compressed JSON")
    body: dict[str, Any] = _read_json(text)
    version = body.get("v")
    if version not in (2, _BODY_VERSION):
        return _upgrade_body(body)
    del body["v"]
    arrays = inflate.unused_data if version == _BODY_VERSION else b""
    at = 0
    messages = body.get("messages", [])
    for turn in body.get("turns", []):
        if turn.get("completion") is None:
            i = turn["message_index"]
            turn["completion"] = messages[i]["content"] if i < len(messages) else ""
        for name, kind, code in _ARRAYS:
            marker = turn.get(name)
            if not isinstance(marker, dict):
                continue
            values = array(code)
            end = at + marker[kind] * values.itemsize
            if end > len(arrays):
                raise ValueError(f"a trajectory body's {name} runs past its end")
            values.frombytes(arrays[at:end])
            at = end
            if _SWAP:
                values.byteswap()
            turn[name] = values.tolist()
    return body


def _upgrade_body(old: dict[str, Any]) -> dict[str, Any]:
    """A body written before the typed record (schema 4 and earlier): steps, final, timings, details."""
    timings = old.get("timings") or {}
    details = old.get("details") or {}
    usage = details.get("usage") or {}
    return {
        "final": old.get("final") or "",
        "steps": [{"action": s.get("action") or "", "observation": s.get("observation") or "",
                   "exit_code": s.get("exit_code"), "duration": float(s.get("seconds") or 0.0)}
                  for s in old.get("steps") or []],
        "timings": {k: float(timings.get(f"{k}_s", 0.0)) for k in ("task", "agent", "verify", "total")},
        "verdict_details": details.get("verdict") or {},
        "usage": {k: int(usage[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens", "requests",
                                              "retries") if isinstance(usage.get(k), int)},
        "agent_error": details.get("agent_error") or "",
    }


_INSERT_TRAJECTORY = f"INSERT INTO trajectories({_TRAJ_COLUMNS}) VALUES ({','.join('?' * (len(_COLUMN_INDEX) + 1))})"


_ENDPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _endpoint_filter(endpoint: str | None, exclude: Sequence[str]) -> tuple[str, list[str]]:
    """SQL (``AND ...``, and its arguments) that keeps the jobs of ``endpoint``'s agents only, or none of
    ``exclude``'s. GLOB, not LIKE: an endpoint's name may hold ``_``, which LIKE reads as any character; a name
    holds none of GLOB's (``*?[``), and ``[?]`` is the query string's literal ``?``."""
    def of(name: str) -> tuple[str, list[str]]:
        if not _ENDPOINT_NAME.fullmatch(name):
            raise ValueError(f"not an endpoint name: {name!r}")
        return "(agent GLOB ? OR agent GLOB ?)", [f"openai:*@{name}", f"openai:*@{name}[?]*"]
    if endpoint is not None:
        sql, args = of(endpoint)
        return f"AND {sql} ", args
    parts = [of(name) for name in exclude]
    if not parts:
        return "", []
    return "".join(f"AND NOT {sql} " for sql, _ in parts), [a for _, args in parts for a in args]


def _traj_row(t: Trajectory, body: bytes) -> tuple[Any, ...]:
    """A stored trajectory's row, in ``_TRAJ_COLUMNS``' order (the body packed already)."""
    return (t.id, t.seq, t.group_id, t.env, t.env_version, t.seed, t.difficulty, t.agent, t.policy_version, t.reward,
            int(t.passed), t.status, _json(t.reasons), _json(t.flags), t.verifier_version, body, t.node, t.finished_at,
            t.run_id, t.verified_by, 0)  # the verdict it is stored with is verdict 0, whatever the record says


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Text reaches the store already made valid where it entered the farm (a trajectory is sealed
        # by the rollout runner); this is the store refusing to keep what no reader could decode.
        log.error("text that is not valid UTF-8 reached the store; it is kept repaired")
        return valid_text(text)[0].encode("utf-8")


def _read_json(raw: str | bytes) -> Any:
    value = json.loads(raw)
    # Rows written before text was repaired on the way in kept lone surrogates as JSON escapes
    # (``"\ud800"``), which decode to strings no encoder takes: repaired here, so an old row can
    # never break a stream or an export. Only escapes can carry one, so only they cost the walk.
    marks = (b"\\ud", b"\\uD") if isinstance(raw, bytes) else ("\\ud", "\\uD")
    if marks[0] in raw or marks[1] in raw:  # type: ignore[operator]
        value, _ = valid_tree(value)
    return value


def _trajectory(row: aiosqlite.Row) -> Trajectory:
    """A row as a record; a row read without its body (a summary) has NULL there.

    A row that does not read as a record with every number in its domain (``farmd.domain``) comes back as a
    stub that says so (``unreadable``), logged: one bad row must never fail the stream, listing or export
    that meets it. Rows are written checked; this is for what an older farmd, a bug or a hand with the
    database file left there."""
    columns = dict(zip(_COLUMN_FIELDS, (row[i] for i in _COLUMN_INDEX), strict=True))
    try:
        record = _record(columns, row[_BODY_INDEX])
        found = domain.problems(record)
    except Exception as exc:  # what a stored body can make a decoder raise is open-ended; each is this row's
        found = [f"{type(exc).__name__}: {str(exc)[:300]}"]
    if not found:
        return record
    _log_unreadable(columns.get("id"), found)
    return domain.unreadable(columns, "; ".join(found[:3]))


def _record(columns: dict[str, Any], body: bytes | None) -> Trajectory:
    plain = dict(columns)
    passed = plain["passed"]
    plain["passed"] = bool(passed) if passed in (0, 1) else passed  # anything else is out of its domain
    plain["reasons"] = _read_json(plain["reasons"])
    plain["flags"] = _read_json(plain["flags"])
    plain["run_id"] = plain["run_id"] or 0
    if body is not None:
        plain.update(_unpack(body))
    return from_plain(Trajectory, plain)


_LOGGED_UNREADABLE: dict[object, None] = {}
"""Rows logged as unreadable by this process (the last few thousand): every stream that passes one meets it
again, and one line per row says it."""


def _log_unreadable(traj_id: object, problems: list[str]) -> None:
    key = traj_id if isinstance(traj_id, int) else repr(traj_id)[:40]
    if key in _LOGGED_UNREADABLE:
        return
    _LOGGED_UNREADABLE[key] = None
    if len(_LOGGED_UNREADABLE) > 4096:
        _LOGGED_UNREADABLE.pop(next(iter(_LOGGED_UNREADABLE)))
    log.error("stored trajectory %s cannot be read (%s): served as an unreadable stub", key,
              "; ".join(problems[:3])[:1000], extra={"event": "unreadable_trajectory", "trajectory": key})


def verdict_score(version: Any, reward: Any, passed: Any, status: Any, reasons: Any, flags: Any, at: Any, kind: Any,
                  seq: Any) -> Score | None:
    """A score row (or a trajectory's verdict columns) as a ``Score``, its ``verdict_version`` 0 for the first
    verdict and its ``seq`` for a later one; None when it is not one in its domain (a score is left out, never the
    record it scores)."""
    try:
        score = Score(version if isinstance(version, str) else "", reward, passed in (1, True), status,
                      _read_json(reasons), _read_json(flags), at, 0 if kind == FIRST else int(seq))
    except Exception:  # a score's JSON columns that do not decode, as a trajectory's body (see _trajectory)
        return None
    if passed not in (0, 1) or domain.reward_problem(score.reward, score.passed, score.status) \
            or not isinstance(score.reasons, list) or not isinstance(score.flags, list) \
            or domain.time_problem(at, "scored_at"):
        return None
    return score


@dataclasses.dataclass(frozen=True, slots=True)
class JobFailure:
    """One failed attempt at a job: an infrastructure failure, never a score."""

    job_id: int
    run_id: int
    """0: a job production queued, not a run."""
    attempt: int
    final: bool
    """Its last attempt: the job failed for good."""
    error: str
    """What the worker said, ``Kind: message`` (``farmd.errors``' class names), bounded when it was stored."""
    at: float


def _trajectories(rows: list[Any]) -> list[Trajectory]:
    return [_trajectory(r) for r in rows]


def _blob_slice(db_path: Path, version: int, offset: int, size: int) -> bytes:
    """``size`` bytes of policy ``version``'s blob from ``offset`` (blocking: run it in a thread).

    SQLite's incremental blob I/O reads only those bytes, where a SELECT would load the whole blob.
    A connection of its own per slice: a read held open between slices would pin an old snapshot.
    """
    uri = f"{db_path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db, \
            db.blobopen("policies", "blob", version, readonly=True) as blob:
        if offset >= len(blob):
            return b""
        blob.seek(offset)
        return blob.read(size)


class Store:
    """Open with ``await Store.open(path)``; close with ``await store.close()``."""

    def __init__(self, db: aiosqlite.Connection, reader: aiosqlite.Connection, path: Path) -> None:
        self._wdb = db
        self._db = reader
        """Reads go through their own connection: in WAL mode it sees only committed transactions,
        never the middle of a write another coroutine has open on the writing connection."""
        self._write_lock = asyncio.Lock()
        self.path = path
        self._policies = PolicyFiles(path.parent)
        self.intake = IntakeRecords(self)
        self.activity = ActivityRecords(self)
        self.atropos = AtroposRecords(self)
        """The intake funnel's rows (submissions, reputation, bounties, quarantines)."""
        self.names = NameRecords(self)
        """Which credential each name (a node's, a consumer's, an Atropos id) belongs to."""
        self.nodes = NodeRecords(self)
        """Quarantined nodes, canary groups, and the checks of nodes' results."""
        self.verdicts = VerdictRecords(self)
        """Which verdicts changed since a mark, and what a trajectory's was at one."""
        self.retention = RetentionRecords(self)
        """Which policy versions still hold content, pins, removal, and the disk the store and policies take."""

    @classmethod
    async def open(cls, path: Path) -> Store:
        # The file exists, private, before SQLite opens it: SQLite gives the -wal and -shm files it
        # makes the database file's mode.
        await asyncio.to_thread(make_dir, path.parent)
        await asyncio.to_thread(create_file, path)
        db = await aiosqlite.connect(path, isolation_level=None)
        reader = None
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a committed transaction survives a process crash (kill -9);
            # only a power loss can take the last ones back.
            await db.execute("PRAGMA synchronous=NORMAL")
            await db.execute("PRAGMA foreign_keys=ON")
            await db.execute("PRAGMA busy_timeout=10000")
            reader = await aiosqlite.connect(path, isolation_level=None)
            await reader.execute("PRAGMA busy_timeout=10000")
            store = cls(db, reader, path)
            await store._migrate()
            await asyncio.to_thread(store._policies.sweep)
        except BaseException:
            await db.close()
            if reader is not None:
                await reader.close()
            raise
        return store

    async def close(self) -> None:
        await self._db.close()
        await self._wdb.close()

    async def _migrate(self) -> None:
        row = await self._one("PRAGMA user_version")
        current = int(row[0]) if row else 0
        if current > len(MIGRATIONS):
            raise StoreError(f"{self.path} has schema version {current}; this farmd knows up to {len(MIGRATIONS)}")
        for version in range(current, len(MIGRATIONS)):
            await self._wdb.executescript(f"BEGIN; {MIGRATIONS[version]}; PRAGMA user_version={version + 1}; COMMIT;")

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction at a time on the writing connection (aiosqlite runs statements
        in order, but would interleave two coroutines' transactions)."""
        async with self._write_lock:
            db = self._wdb
            try:
                await db.execute("BEGIN IMMEDIATE")
                yield db
            except BaseException:
                # Also when the caller was cancelled: a statement already handed to the
                # connection's thread runs anyway (a BEGIN included), so the transaction must
                # be ended here, or the next writer finds one open. The rollback is queued
                # behind it and shielded from a second cancellation.
                await asyncio.shield(self._rollback())
                raise
            await db.execute("COMMIT")

    async def _rollback(self) -> None:
        # OperationalError: the BEGIN itself failed, so there is nothing to end.
        with contextlib.suppress(sqlite3.OperationalError):
            await self._wdb.execute("ROLLBACK")

    async def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        """Rows of one read, in one call on the reader's thread: a cursor held open across awaits
        would pin every other coroutine's reads to its snapshot, which can predate a commit."""
        return list(await self._db.execute_fetchall(sql, params))

    async def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        rows = await self._all(sql, params)
        return rows[0] if rows else None

    # -- the job queue --------------------------------------------------------------------------

    async def enqueue(self, groups: Iterable[tuple[str, int, int, str, int]], source: str = "request") -> list[int]:
        """Add groups of (env, seed, difficulty, agent, size) jobs. Returns the group ids. Durable on return."""
        async with self._write() as db:
            return await self._insert_groups(db, groups, source, 0, time.time())

    async def enqueue_run(self, env: str, agent: str, rollouts: int, group_size: int,
                          groups: Iterable[tuple[str, int, int, str, int]]) -> tuple[int, list[int]]:
        """A run and its groups, in one transaction. Returns (run id, group ids)."""
        now = time.time()
        async with self._write() as db:
            cur = await db.execute("INSERT INTO runs(env, agent, rollouts, group_size, created_at) VALUES (?,?,?,?,?)",
                                   (env, agent, rollouts, group_size, now))
            run_id = int(cur.lastrowid or 0)
            return run_id, await self._insert_groups(db, groups, "request", run_id, now)

    async def _insert_groups(self, db: aiosqlite.Connection, groups: Iterable[tuple[str, int, int, str, int]],
                             source: str, run_id: int, now: float, *, canary_for: str | None = None) -> list[int]:
        """Groups and their queued jobs, inside the caller's transaction. ``canary_for``: a node's canary groups,
        their jobs leasable by that node alone (``farmd.store.nodes``)."""
        ids = []
        for env, seed, difficulty, agent, size in groups:
            cur = await db.execute(
                "INSERT INTO groups(env, seed, difficulty, agent, size, source, created_at, run_id, canary) "
                "VALUES (?,?,?,?,?,?,?,?,?)", (env, seed, difficulty, agent, size, source, now, run_id, canary_for))
            group_id = int(cur.lastrowid or 0)
            await db.executemany(
                "INSERT INTO jobs(group_id, env, seed, difficulty, agent, state, source, created_at, updated_at, "
                "for_node) VALUES (?,?,?,?,?,'queued',?,?,?,?)",
                [(group_id, env, seed, difficulty, agent, source, now, now, canary_for)] * size)
            ids.append(group_id)
        return ids

    # -- runs -----------------------------------------------------------------------------------

    async def run(self, run_id: int) -> dict[str, Any] | None:
        """A run as queued, and how far its jobs have come (``state``: running, succeeded, failed, cancelled)."""
        found = await self._runs([run_id])
        return found[0] if found else None

    async def runs(self, before_id: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        """Runs newest first, starting below ``before_id`` (0: from the newest)."""
        ids = await self._all("SELECT id FROM runs WHERE (? = 0 OR id < ?) ORDER BY id DESC LIMIT ?",
                              (before_id, before_id, limit))
        return await self._runs([int(r[0]) for r in ids])

    async def _runs(self, run_ids: list[int]) -> list[dict[str, Any]]:
        """``run`` for many runs in a handful of queries (a page of runs is not a query per run)."""
        out = []
        for start in range(0, len(run_ids), _MAX_VARS):
            chunk = run_ids[start:start + _MAX_VARS]
            marks = ",".join("?" * len(chunk))
            rows = await self._all(f"SELECT id, env, agent, rollouts, group_size, cancelled, created_at FROM runs "
                                   f"WHERE id IN ({marks})", chunk)
            groups: dict[int, list[int]] = {}
            for run_id, group_id in await self._all(
                    f"SELECT run_id, id FROM groups WHERE run_id IN ({marks}) ORDER BY id", chunk):
                groups.setdefault(int(run_id), []).append(int(group_id))
            counts: dict[int, dict[str, int]] = {}
            ended: dict[int, float] = {}
            for run_id, state, n, last in await self._all(
                    f"SELECT g.run_id, j.state, COUNT(*), MAX(j.updated_at) FROM jobs j JOIN groups g "
                    f"ON g.id = j.group_id WHERE g.run_id IN ({marks}) GROUP BY g.run_id, j.state", chunk):
                counts.setdefault(int(run_id), {})[state] = int(n)
                ended[int(run_id)] = max(ended.get(int(run_id), 0.0), float(last))
            passed = {int(r): int(n) for r, n in await self._all(
                f"SELECT run_id, COUNT(*) FROM trajectories WHERE run_id IN ({marks}) AND status='ok' AND passed=1 "
                f"GROUP BY run_id", chunk)}
            # SQLite gives the bare column of the row MAX chose: each run's newest job error.
            errors = {int(r): (str(e), float(at)) for r, e, at in await self._all(
                f"SELECT g.run_id, j.last_error, MAX(j.updated_at) FROM jobs j JOIN groups g ON g.id = j.group_id "
                f"WHERE g.run_id IN ({marks}) AND j.last_error IS NOT NULL GROUP BY g.run_id", chunk)}
            for run_id, env, agent, rollouts, group_size, cancelled, created_at in rows:
                jobs = counts.get(run_id, {})
                open_jobs = jobs.get("queued", 0) + jobs.get("leased", 0)
                if cancelled:
                    state = "cancelled"
                elif open_jobs:
                    state = "running"
                else:
                    state = "failed" if jobs.get("failed", 0) else "succeeded"
                out.append({"id": run_id, "env": env, "agent": agent, "rollouts": rollouts, "group_size": group_size,
                            "group_ids": groups.get(run_id, []), "state": state, "jobs": sum(jobs.values()),
                            "done": jobs.get("done", 0), "failed": jobs.get("failed", 0),
                            "cancelled": jobs.get("cancelled", 0), "passed": passed.get(run_id, 0),
                            "created_at": created_at,
                            "finished_at": ended.get(run_id, 0.0) if not open_jobs else 0.0,
                            "last_error": errors.get(run_id, ("", 0.0))[0]})
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        return sorted(out, key=lambda r: order[r["id"]])

    async def cancel_run(self, run_id: int) -> bool:
        """Drop a run's queued jobs (rollouts already leased finish and are stored). False: no such run."""
        now = time.time()
        async with self._write() as db:
            cur = await db.execute("UPDATE runs SET cancelled=1 WHERE id=?", (run_id,))
            if cur.rowcount == 0:
                return False
            await db.execute("UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND group_id IN "
                             "(SELECT id FROM groups WHERE run_id=?)", (now, run_id))
            groups = [int(g[0]) for g in await db.execute_fetchall("SELECT id FROM groups WHERE run_id=?", (run_id,))]
            await self._finish_groups(db, groups)
        return True

    async def lease(self, owner: str, n: int, lease_s: float, policy_version: int | Callable[[str], int], *,
                    endpoint: str | None = None, exclude: Sequence[str] = ()) -> list[Job]:
        """Lease up to ``n`` queued jobs (oldest first) whose backoff has passed to ``owner`` until now +
        ``lease_s``, each tagged with the policy version it runs: ``policy_version(its agent spec)``, or
        ``policy_version`` itself for every job (0: none). ``endpoint``: only jobs of agents ``openai:MODEL@`` that
        endpoint; ``exclude``: no jobs of these endpoints (a worker's endpoints each have their own cap)."""
        version_for = policy_version if callable(policy_version) else (lambda _agent, v=policy_version: v)
        now = time.time()
        node = owner.partition(":")[0]  # a canary's jobs go to the node it tests, and to no other
        which, args = _endpoint_filter(endpoint, exclude)
        async with self._write() as db:
            async with db.execute(
                f"UPDATE jobs SET state='leased', lease_owner=?, lease_expires=?, policy_version=0, "
                f"attempts=attempts+1, updated_at=? WHERE id IN "
                f"(SELECT id FROM jobs WHERE state='queued' AND not_before <= ? AND (for_node IS NULL OR for_node = ?) "
                f"{which}ORDER BY id LIMIT ?) RETURNING {_JOB_COLUMNS}",
                (owner, now + lease_s, now, now, node, *args, n),
            ) as cur:
                jobs = [_job(r) for r in await cur.fetchall()]
            versions = {agent: version_for(agent) for agent in {j.agent for j in jobs}}
            tagged: dict[int, list[int]] = {}
            for j in jobs:
                if versions[j.agent]:
                    tagged.setdefault(versions[j.agent], []).append(j.id)
            for version, ids in tagged.items():
                for start in range(0, len(ids), _MAX_VARS):
                    chunk = ids[start:start + _MAX_VARS]
                    await db.execute(f"UPDATE jobs SET policy_version=? WHERE id IN ({','.join('?' * len(chunk))})",
                                     (version, *chunk))
        return sorted((dataclasses.replace(j, policy_version=versions[j.agent]) for j in jobs), key=lambda j: j.id)

    async def extend(self, owner: str, job_ids: list[int], lease_s: float) -> int:
        """Extend ``owner``'s leases (a heartbeat). Returns how many are still its own."""
        if not job_ids:
            return 0
        marks = ",".join("?" * len(job_ids))
        async with self._write() as db:
            cur = await db.execute(
                f"UPDATE jobs SET lease_expires=? WHERE state='leased' AND lease_owner=? AND id IN ({marks})",
                (time.time() + lease_s, owner, *job_ids))
            return cur.rowcount

    async def expired_leases(self) -> dict[int, int]:
        """Jobs whose leases have run out, each with the attempts it has had: for the scheduler to
        decide which ``requeue_expired`` fails for good."""
        rows = await self._all("SELECT id, attempts FROM jobs WHERE state='leased' AND lease_expires < ?",
                               (time.time(),))
        return {int(job_id): int(attempts) for job_id, attempts in rows}

    async def requeue_expired(self, final: Mapping[int, bool]) -> tuple[int, int]:
        """End the expired leases of the jobs in ``final``: back to the queue, or, where ``final`` says so,
        failed for good. A job leased or heartbeaten since it was found expired is left alone. Returns
        (requeued, failed)."""
        now = time.time()
        async with self._write() as db:
            requeued: list[int] = []
            failed = 0
            for job_id, last in final.items():
                rows = await db.execute_fetchall(
                    "SELECT attempts FROM jobs WHERE id=? AND state='leased' AND lease_expires < ?", (job_id, now))
                if not rows:
                    continue
                if last:
                    attempts = int(next(iter(rows))[0])
                    await self._fail_job(db, job_id, attempts, "its lease expired (the worker died or hung)", now)
                    failed += 1
                else:
                    await db.execute("UPDATE jobs SET state='queued', lease_owner=NULL, lease_expires=NULL, "
                                     "last_error='lease expired', updated_at=? WHERE id=?", (now, job_id))
                    requeued.append(job_id)
            dropped = await self._drop_cancelled(db, requeued, now)
        return len(requeued) - dropped, failed

    async def _drop_cancelled(self, db: aiosqlite.Connection, job_ids: list[int], now: float) -> int:
        """Jobs just put back in the queue whose run was cancelled meanwhile end there, cancelled: a
        cancelled run never starts a rollout again. Returns how many."""
        if not job_ids:
            return 0
        dropped = 0
        for start in range(0, len(job_ids), _MAX_VARS):
            chunk = job_ids[start:start + _MAX_VARS]
            rows = await db.execute_fetchall(
                f"UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND id IN "
                f"({','.join('?' * len(chunk))}) AND group_id IN (SELECT g.id FROM groups g JOIN runs r "
                f"ON r.id = g.run_id WHERE r.cancelled = 1) RETURNING group_id", (now, *chunk))
            groups = sorted({int(r[0]) for r in rows})
            dropped += len(list(rows))
            await self._finish_groups(db, groups)
        return dropped

    async def expire_leases_of(self, owner_prefix: str, keep: str) -> int:
        """End every lease held under ``owner_prefix`` except ``keep``'s at once: a node that restarts
        knows its earlier incarnation's rollouts died with it, so they need not wait out their lease."""
        async with self._write() as db:
            cur = await db.execute(
                "UPDATE jobs SET lease_expires=0 WHERE state='leased' AND substr(lease_owner, 1, ?)=? "
                "AND lease_owner != ?", (len(owner_prefix), owner_prefix, keep))
            return cur.rowcount

    async def extend_all_leases(self, until: float) -> int:
        """Every lease runs at least until ``until``: a coordinator that was down cannot have heard its
        nodes' heartbeats, and their results, buffered meanwhile, must still find their leases held."""
        async with self._write() as db:
            cur = await db.execute("UPDATE jobs SET lease_expires=? WHERE state='leased' AND lease_expires < ?",
                                   (until, until))
            return cur.rowcount

    async def requeue_owner(self, owner: str) -> int:
        """Give back every lease of ``owner`` (a worker shutting down); the attempt is not counted."""
        now = time.time()
        async with self._write() as db:
            rows = await db.execute_fetchall(
                "UPDATE jobs SET state='queued', lease_owner=NULL, lease_expires=NULL, attempts=MAX(0, attempts-1), "
                "updated_at=? WHERE state='leased' AND lease_owner=? RETURNING id", (now, owner))
            ids = [int(r[0]) for r in rows]
            return len(ids) - await self._drop_cancelled(db, ids, now)

    async def complete(self, items: list[tuple[str, Trajectory]]) -> list[int]:
        """``complete_leases`` for a worker of the farm's own: the ids stored now (a canary's included)."""
        done = await self.complete_leases(items)
        return done.reported

    async def complete_leases(self, items: list[tuple[str, Trajectory]], *, refuse_mismatch: bool = False
                              ) -> Completion:
        """Store trajectories of jobs leased by their owners, and mark the jobs done; one transaction.

        A job whose lease its owner no longer holds (it expired and went elsewhere) or that is already done is
        skipped. What is stored is the job's own identity (group, run, environment, seed, level, agent, policy
        version), never what the record says: a record that says otherwise is stored as its lease's, or with
        ``refuse_mismatch`` (a joined node's) refused, its job back in the queue (the attempt not counted: the
        job did nothing wrong). A canary's result marks its job done and is not stored: the caller checks it.
        A batch costs a handful of statements, not a few per trajectory: each is a round trip to the
        connection's thread.
        """
        if not items:
            return Completion()
        latest = {traj.id: (owner, traj) for owner, traj in items}  # one job reported twice: once
        bodies, out_of_domain = await asyncio.to_thread(_checked_bodies, {tid: t for tid, (_, t) in latest.items()})
        for tid, found in out_of_domain.items():
            # Every entry checks its records first (a node's, a model's, an Atropos push); one that got here
            # anyway is not stored, so no reader meets it: its job stays leased until the lease runs out.
            log.error("trajectory %d is out of its domain and was not stored: %s", tid, "; ".join(found[:3])[:1000],
                      extra={"event": "refused_trajectory", "trajectory": tid})
            del latest[tid]
        now = time.time()
        by_owner: dict[str, list[int]] = {}
        for tid, (owner, _) in latest.items():
            by_owner.setdefault(owner, []).append(tid)
        refused: dict[int, str] = {}
        bound: dict[int, Trajectory] = {}
        canaries: dict[int, Trajectory] = {}
        async with self._write() as db:
            top = await db.execute_fetchall("SELECT COALESCE(MAX(version), 0) FROM policies")
            newest = int(next(iter(top))[0])
            for owner, ids in by_owner.items():  # one worker's batch: usually one statement
                for start in range(0, len(ids), _MAX_VARS):
                    chunk = ids[start:start + _MAX_VARS]
                    marks = ",".join("?" * len(chunk))
                    rows = await db.execute_fetchall(
                        f"SELECT j.id, j.group_id, g.run_id, j.env, j.seed, j.difficulty, j.agent, j.policy_version, "
                        f"j.for_node FROM jobs j JOIN groups g ON g.id = j.group_id WHERE j.state='leased' "
                        f"AND j.lease_owner=? AND j.id IN ({marks})", (owner, *chunk))
                    for job in rows:
                        tid = int(job[0])
                        traj, why = lease_identity(latest[tid][1], job, newest)
                        if why and refuse_mismatch:
                            refused[tid] = why
                            continue
                        if why:  # the farm's own worker: a bug, not a lie; its lease decides
                            log.error("job %d's record disagrees with its lease (%s): stored as its lease's", tid,
                                      why, extra={"event": "record_mismatch", "job": tid})
                        (canaries if job[8] is not None else bound)[tid] = traj
            done = sorted({*bound, *canaries})
            for start in range(0, len(done), _MAX_VARS):
                chunk = done[start:start + _MAX_VARS]
                await db.execute(f"UPDATE jobs SET state='done', lease_expires=NULL, updated_at=? "
                                 f"WHERE id IN ({','.join('?' * len(chunk))})", (now, *chunk))
            if refused:
                back = sorted(refused)
                await db.execute(
                    "UPDATE jobs SET state='queued', lease_owner=NULL, lease_expires=NULL, attempts=MAX(0, attempts-1), "
                    f"last_error='its result was refused', updated_at=? WHERE id IN ({','.join('?' * len(back))})",
                    (now, *back))
                await self._drop_cancelled(db, back, now)
            keep = [bound[tid] for tid in sorted(bound)]
            if keep:
                top = await db.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM trajectories")
                seq = int(next(iter(top))[0])
                for traj in keep:
                    seq += 1
                    traj.seq = seq
                    traj.finished_at = traj.finished_at or now
                await db.executemany(_INSERT_TRAJECTORY, [_traj_row(t, bodies[t.id]) for t in keep])
                late = [t.id for t in keep if t.env.startswith(CONTRIBUTED_ENV_PREFIX)]
                if late:  # running when its environment was quarantined: withdrawn as it is stored
                    await withdraw(db, f"t.id IN ({','.join('?' * len(late))})", late, now)
            await self._finish_groups(db, sorted({t.group_id for t in keep}))
        return Completion(stored=[t.id for t in keep], refused=refused, canaries=canaries)

    async def _insert_finished(self, db: aiosqlite.Connection, groups: list[list[Trajectory]], bodies: list[bytes],
                               *, source: str, now: float) -> None:
        """Groups that were never run here (pushed from outside, ``source`` says by what), stored as finished farm
        groups: their jobs done, their trajectories at the end of the stream, given ids, group ids and places
        here. Inside the caller's transaction; ``bodies`` are the trajectories' ``pack_body``, in order."""
        tops = await db.execute_fetchall("SELECT (SELECT COALESCE(MAX(id), 0) FROM groups), "
                                         "(SELECT COALESCE(MAX(id), 0) FROM jobs), "
                                         "(SELECT COALESCE(MAX(seq), 0) FROM trajectories)")
        group_id, job_id, seq = (int(v) for v in next(iter(tops)))
        group_rows, job_rows, traj_rows = [], [], []
        body = iter(bodies)
        for members in groups:
            group_id += 1
            head = members[0]
            group_rows.append((group_id, head.env, head.seed, head.difficulty, head.agent, len(members), source, now))
            for t in members:
                job_id += 1
                seq += 1
                t.id, t.group_id, t.seq, t.run_id = job_id, group_id, seq, 0
                t.finished_at = t.finished_at or now
                t.verified_by = VERIFIED_EXTERNAL
                job_rows.append((job_id, group_id, t.env, t.seed, t.difficulty, t.agent, source, now, now))
                traj_rows.append(_traj_row(t, next(body)))
        await db.executemany("INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at, run_id) "
                             "VALUES (?,?,?,?,?,?,?,?,0)", group_rows)
        await db.executemany("INSERT INTO jobs(id, group_id, env, seed, difficulty, agent, state, source, created_at, "
                             "updated_at) VALUES (?,?,?,?,?,?,'done',?,?,?)", job_rows)
        await db.executemany(_INSERT_TRAJECTORY, traj_rows)
        await self._finish_groups(db, [row[0] for row in group_rows])

    async def leased_attempts(self, owner: str, job_id: int) -> int | None:
        """The attempts a job ``owner`` holds the lease of has had; None: ``owner`` does not hold it."""
        row = await self._one("SELECT attempts FROM jobs WHERE id=? AND state='leased' AND lease_owner=?",
                              (job_id, owner))
        return None if row is None else int(row[0])

    async def fail(self, owner: str, job_id: int, error: str, *, final: bool, not_before: float = 0.0
                   ) -> JobState | None:
        """An infrastructure failure of a leased job, recorded apart from every score: failed for good
        when ``final``, else back in the queue, leased again no earlier than ``not_before`` (a time).
        The scheduler decides which. None: ``owner`` does not hold the lease."""
        now = time.time()
        async with self._write() as db:
            async with db.execute("SELECT attempts FROM jobs WHERE id=? AND state='leased' AND lease_owner=?",
                                  (job_id, owner)) as cur:
                row = await cur.fetchone()
            if row is None:
                return None
            attempts = int(row[0])
            await db.execute("INSERT INTO failures(job_id, attempt, error, final, at) VALUES (?,?,?,?,?)",
                             (job_id, attempts, error[:2000], int(final), now))
            if final:
                await self._fail_job(db, job_id, attempts, error, now, logged=True)
                return JobState.FAILED
            await db.execute("UPDATE jobs SET state='queued', lease_owner=NULL, lease_expires=NULL, last_error=?, "
                             "not_before=?, updated_at=? WHERE id=?", (error[:2000], not_before, now, job_id))
            if await self._drop_cancelled(db, [job_id], now):
                return JobState.CANCELLED
            return JobState.QUEUED

    async def _fail_job(self, db: aiosqlite.Connection, job_id: int, attempts: int, error: str, now: float,
                        logged: bool = False) -> None:
        if not logged:
            await db.execute("INSERT INTO failures(job_id, attempt, error, final, at) VALUES (?,?,?,1,?)",
                             (job_id, attempts, error[:2000], now))
        await db.execute("UPDATE jobs SET state='failed', lease_owner=NULL, lease_expires=NULL, last_error=?, "
                         "updated_at=? WHERE id=?", (error[:2000], now, job_id))
        await self._finish_group_of(db, job_id)

    async def _finish_group_of(self, db: aiosqlite.Connection, job_id: int) -> None:
        rows = await db.execute_fetchall("SELECT group_id FROM jobs WHERE id=?", (job_id,))
        await self._finish_groups(db, [int(r[0]) for r in rows])

    async def _finish_groups(self, db: aiosqlite.Connection, group_ids: list[int]) -> None:
        """Groups whose last job just ended get their places in the done order (whole-group streams),
        and the running total of trajectories in groups finished so far (how far a group cursor is)."""
        await db.executemany(
            "UPDATE groups SET done_seq = (SELECT COALESCE(MAX(done_seq), 0) + 1 FROM groups), "
            "done_total = COALESCE((SELECT done_total FROM groups WHERE done_seq = "
            "(SELECT MAX(done_seq) FROM groups)), 0) + (SELECT COUNT(*) FROM trajectories WHERE group_id = groups.id) "
            "WHERE id = ? AND done_seq IS NULL AND canary IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM jobs WHERE group_id = groups.id AND state IN ('queued', 'leased'))",
            [(g,) for g in group_ids])

    async def job_counts(self) -> dict[str, int]:
        """Jobs in every state: counts every job ever queued (for status, not for loops); a node's canaries are
        not the farm's work (each node's row counts its own)."""
        rows = await self._all("SELECT state, COUNT(*) FROM jobs WHERE for_node IS NULL GROUP BY state")
        return {state: n for state, n in rows}

    async def open_job_counts(self) -> dict[str, int]:
        """Queued and leased jobs only (canaries not: no trainer's demand waits on one): an index range as long
        as the queue, cheap every second."""
        rows = await self._all("SELECT state, COUNT(*) FROM jobs WHERE state IN ('queued', 'leased') "
                               "AND for_node IS NULL GROUP BY state")
        return {state: n for state, n in rows}

    async def group_progress(self, group_ids: list[int]) -> tuple[int, int, int, int]:
        """(jobs, done, failed, passed) over the given groups."""
        totals = [0, 0, 0, 0]
        for start in range(0, len(group_ids), _MAX_VARS):  # SQLite binds at most 32766 values per statement
            chunk = group_ids[start:start + _MAX_VARS]
            marks = ",".join("?" * len(chunk))
            row = await self._one(
                f"SELECT COUNT(*), SUM(state='done'), SUM(state='failed') FROM jobs WHERE group_id IN ({marks})", chunk)
            passed = await self._one(
                f"SELECT COUNT(*) FROM trajectories WHERE group_id IN ({marks}) AND status='ok' AND passed=1", chunk)
            for i, value in enumerate((*row, passed[0])):
                totals[i] += int(value or 0)
        return totals[0], totals[1], totals[2], totals[3]

    async def finished_groups(self, after: int, limit: int, *, agent: str | None = None,
                              envs: Sequence[str] = (), streamed: bool = False, as_of: int | None = None
                              ) -> list[dict[str, Any]]:
        """Groups that ended after done position ``after``, in the order they ended, with their rewards (of their
        current verdicts, none withdrawn; ``as_of`` a verdict mark: of the verdicts they held at that mark, what a
        reader keeping up with ``store.verdicts.changed`` from there must count); only ``agent``'s and only those of
        ``envs`` when given (a subscription); ``streamed``: no group holding one withdrawn."""
        where, args = _subscribed(agent, envs, streamed=streamed, groups=True)
        groups = await self._all(
            f"SELECT id, done_seq, env, seed, difficulty, agent, size FROM groups WHERE done_seq > ? {where} "
            "ORDER BY done_seq LIMIT ?", (after, *args, limit))
        if not groups:
            return []
        rewards: dict[int, list[tuple[float, int]]] = {}
        marks = ",".join("?" * len(groups))
        rows = await self._all(
            f"SELECT group_id, reward, policy_version, status, {_WITHDRAWN}, id, verdict_version FROM trajectories "
            f"WHERE group_id IN ({marks}) ORDER BY id", [g[0] for g in groups])
        then = {} if as_of is None else await self.verdicts.at([int(r[5]) for r in rows if r[6] > as_of], as_of)
        for gid, reward, version, status, withdrawn, tid, _ in rows:
            held = then.get(int(tid))
            if held is not None:
                reward, status, withdrawn = held.reward, held.status, WITHDRAWN in held.flags
            if status != "ok" or withdrawn:
                continue
            # A reward out of any domain (a NaN is stored as NULL) or a version that is not one counts for
            # nothing here; its record is served as unreadable (``_trajectory``).
            if domain.reward_problem(reward, False, "ok", external=True) is None and isinstance(version, int):
                rewards.setdefault(gid, []).append((float(reward), int(version)))
        return [{"id": gid, "done_seq": done, "env": env, "seed": seed, "difficulty": difficulty, "agent": agent,
                 "size": size, "rewards": [r for r, _ in rewards.get(gid, [])],
                 "policy_version": max((v for _, v in rewards.get(gid, [])), default=0)}
                for gid, done, env, seed, difficulty, agent, size in groups]

    # -- trajectories ---------------------------------------------------------------------------

    async def trajectory(self, traj_id: int) -> Trajectory | None:
        """One trajectory, whole, with its scores under every verifier version since."""
        row = await self._one(f"SELECT {_TRAJ_COLUMNS} FROM trajectories WHERE id=?", (traj_id,))
        if row is None:
            return None
        return (await self._with_scores([await asyncio.to_thread(_trajectory, row)]))[0]

    async def trajectories(self, *, after_seq: int = 0, limit: int = 100, env: str | None = None,
                           min_policy: int | None = None, newest_first: bool = False, body: bool = True,
                           before_seq: int | None = None, run_id: int = 0, agent: str | None = None,
                           envs: Sequence[str] = (), streamed: bool = False, where: TrajectoryFilter | None = None,
                           withdrawn: bool = True) -> list[Trajectory]:
        """Trajectories in stream order (or newest first), after ``after_seq`` and before ``before_seq``;
        ``body=False`` leaves out the bulk of the record (``BODY_FIELDS``: decompressing it is most of a
        read's cost). ``agent`` and ``envs``: only those (a subscription); ``streamed``: none withdrawn nor
        any a trainer is never sent; ``withdrawn`` False: none withdrawn; ``where``: what an operator looking for
        some narrows them to. Each holds its current verdict (``farmd.store.verdicts``)."""
        subscribed, sub_args = _subscribed(agent, envs, streamed=streamed)
        if not withdrawn:
            subscribed += f" AND NOT {_WITHDRAWN}"
        narrowed, narrow_args = where.sql() if where is not None else ("", [])
        args: list[object] = [after_seq, *sub_args, *narrow_args]
        where_sql: list[str] = [f"seq > ? {subscribed}{narrowed}"]
        if before_seq is not None:
            where_sql.append("seq < ?")
            args.append(before_seq)
        if run_id:
            where_sql.append("run_id = ?")
            args.append(run_id)
        if env is not None:
            where_sql.append("env = ?")
            args.append(env)
        if min_policy is not None:
            where_sql.append("policy_version >= ?")
            args.append(min_policy)
        order = "DESC" if newest_first else "ASC"
        columns = _TRAJ_COLUMNS if body else _TRAJ_COLUMNS.replace("body", "NULL")
        rows = await self._all(
            f"SELECT {columns} FROM trajectories WHERE {' AND '.join(where_sql)} ORDER BY seq {order} LIMIT ?",
            (*args, limit))
        if not body:
            return _trajectories(rows)
        # Decompressing and parsing bodies is the cost of a read: off the event loop.
        return await self._with_scores(await asyncio.to_thread(_trajectories, rows))

    async def _with_scores(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Whole records carry every verdict they were given, the first included: one query for a page. A
        trajectory never given a later one keeps its first in its row only, and reads it from there."""
        if not trajectories:
            return trajectories
        history = await self.score_history([t.id for t in trajectories])
        for t in trajectories:
            t.scores = history.get(t.id, [])
            if t.verdict_version == 0 and not any(s.verdict_version == 0 for s in t.scores) \
                    and UNREADABLE not in t.flags:  # a stub's error verdict is no verdict it was given
                t.scores.insert(0, Score(t.verifier_version, t.reward, t.passed, t.status, list(t.reasons),
                                         list(t.flags), t.finished_at, 0))
        return trajectories

    async def score_history(self, trajectory_ids: list[int]) -> dict[int, list[Score]]:
        """The scores table's verdicts of these trajectories, the first one first, then in the order given; one out
        of its domain is left out (logged), never the record it scores."""
        out: dict[int, list[Score]] = {}
        for start in range(0, len(trajectory_ids), _MAX_VARS):
            ids = trajectory_ids[start:start + _MAX_VARS]
            for tid, v, r, p, st, rs, fl, at, kind, seq in await self._all(
                    "SELECT trajectory_id, verifier_version, reward, passed, status, reasons, flags, scored_at, kind, "
                    f"seq FROM scores WHERE trajectory_id IN ({','.join('?' * len(ids))}) "
                    f"ORDER BY trajectory_id, kind != '{FIRST}', seq", ids):
                score = verdict_score(v, r, p, st, rs, fl, at, kind, seq)
                if score is not None:
                    out.setdefault(int(tid), []).append(score)
                else:
                    _log_unreadable(f"{tid} (a score under {str(v)[:60]})", ["a score out of its domain"])
        return out

    async def group_trajectories(self, group_ids: list[int], body: bool = True) -> list[Trajectory]:
        if not group_ids:
            return []
        marks = ",".join("?" * len(group_ids))
        columns = _TRAJ_COLUMNS if body else _TRAJ_COLUMNS.replace("body", "NULL")
        rows = await self._all(f"SELECT {columns} FROM trajectories WHERE group_id IN ({marks}) ORDER BY seq",
                               group_ids)
        return await self._with_scores(await asyncio.to_thread(_trajectories, rows)) if body else _trajectories(rows)

    async def withdrawn_count(self, *, env: str | None = None, run_id: int = 0,
                              where: TrajectoryFilter | None = None) -> int:
        """How many withdrawn trajectories match (of ``env``, of run ``run_id``, narrowed by ``where``): what a
        listing or an export that leaves them out says it left out. Read from the withdrawals, not the
        trajectories: as many rows as were withdrawn."""
        narrowed, narrow_args = where.sql() if where is not None else ("", [])
        sql = (f"SELECT COUNT(*) FROM trajectories WHERE id IN (SELECT trajectory_id FROM withdrawals){narrowed}")
        args: list[object] = [*narrow_args]
        if env is not None:
            sql += " AND env = ?"
            args.append(env)
        if run_id:
            sql += " AND run_id = ?"
            args.append(run_id)
        row = await self._one(sql, args)
        return int(row[0]) if row else 0

    async def last_seq(self) -> int:
        row = await self._one("SELECT COALESCE(MAX(seq), 0) FROM trajectories")
        return int(row[0]) if row else 0

    async def pass_rates(self) -> list[dict[str, Any]]:
        """Per environment and level, by each trajectory's current verdict: trajectories, passed, mean reward,
        errors (never scores); withdrawn ones left out (a quarantine took them back: their verdicts say nothing of
        the policy, and their withdrawn 0 would read as it failing), and a red team's attempts (wrong on purpose,
        they would read as a policy failing)."""
        # Only rewards in a reward's domain count in the mean: one stored out of it (an infinity, a text) would
        # make every status read show it (``farmd.domain``; its record is served as unreadable).
        bound = domain.EXTERNAL_SCORE_BOUND
        rows = await self._all(
            "SELECT env, difficulty, COUNT(*), SUM(status='ok' AND passed), AVG(CASE WHEN status='ok' AND "
            "typeof(reward) IN ('real', 'integer') AND reward BETWEEN ? AND ? THEN reward END), "
            f"SUM(status='error') FROM trajectories WHERE substr(agent, 1, ?) != ? AND NOT {_WITHDRAWN} "
            "GROUP BY env, difficulty ORDER BY env, difficulty",
            (-bound, bound, len(RED_TEAM_PREFIX), RED_TEAM_PREFIX))
        return [{"env": e, "difficulty": d, "trajectories": n, "passed": int(p or 0),
                 "mean_reward": float(r) if r is not None else None, "errors": int(err or 0)}
                for e, d, n, p, r, err in rows]

    async def finished_since(self, since: float) -> int:
        row = await self._one("SELECT COUNT(*) FROM trajectories WHERE finished_at >= ?", (since,))
        return int(row[0]) if row else 0

    async def failures(self, limit: int = 20) -> list[JobFailure]:
        """The newest ``limit`` job failures, newest first, each with its job's run (0: none)."""
        rows = await self._all("SELECT f.job_id, f.attempt, f.error, f.final, f.at, COALESCE(g.run_id, 0) FROM "
                               "(SELECT * FROM failures ORDER BY id DESC LIMIT ?) f LEFT JOIN jobs j ON j.id = "
                               "f.job_id LEFT JOIN groups g ON g.id = j.group_id ORDER BY f.id DESC", (limit,))
        return [JobFailure(int(j), int(r), int(a), bool(f), str(e), float(t)) for j, a, e, f, t, r in rows]

    # -- scores (re-scoring adds, never overwrites) ---------------------------------------------

    async def add_scores(self, rows: list[tuple[int, str, float, bool, str, list[str], list[str]]]) -> int:
        """(trajectory id, verifier version, reward, passed, status, reasons, flags) rows; a version that scored a
        trajectory already keeps its score. Each added becomes its trajectory's current verdict, the one every reader
        shows (its first kept in its scores), unless it was withdrawn or the verdict is an error: kept, never current
        (``farmd.store.verdicts.give``). A row whose verdict is out of its domain (``farmd.domain``) is not kept:
        logged, never read back. Returns how many were added."""
        now = time.time()
        kept: list[tuple[int, str, float, bool, str, list[str], list[str]]] = []
        for row in rows:
            problem = domain.reward_problem(row[2], row[3], row[4])
            if problem is None:
                kept.append(row)
            else:
                log.error("a score of trajectory %s out of its domain was not kept: %s", row[0], problem,
                          extra={"event": "refused_score", "trajectory": row[0]})
        rows = kept
        if not rows:
            return 0
        async with self._write() as db:
            return await give(db, now, rows=[(t, v, r, p, s, valid_tree(rs)[0], valid_tree(fl)[0])
                                             for t, v, r, p, s, rs, fl in rows])

    async def scores(self, traj_id: int) -> list[dict[str, Any]]:
        """Every verdict ``traj_id`` was given, the first included, as plain values."""
        found = await self.trajectory(traj_id)
        return [dataclasses.asdict(s) for s in found.scores] if found is not None else []

    async def scored_versions(self, env: str) -> dict[int, set[str]]:
        """Per trajectory of ``env``, the verifier versions a later verdict scored it under (the verdict it was
        stored with is not one: rescoring under its version adds that score, as it always did)."""
        rows = await self._all(
            "SELECT s.trajectory_id, s.verifier_version FROM scores s JOIN trajectories t ON t.id = s.trajectory_id "
            f"WHERE t.env = ? AND s.kind != '{FIRST}'", (env,))
        out: dict[int, set[str]] = {}
        for tid, version in rows:
            out.setdefault(int(tid), set()).add(str(version))
        return out

    # -- consumers ------------------------------------------------------------------------------

    async def cursor(self, consumer: str, kind: str) -> int:
        """Where ``consumer``'s cursor of ``kind`` (``trajectories`` or ``groups``) stands; 0 if it never acked."""
        row = await self._one("SELECT acked_seq FROM consumers WHERE name=? AND kind=?", (consumer, _kind(kind)))
        return int(row[0]) if row else 0

    async def ack(self, consumer: str, kind: str, up_to: int) -> int:
        """Move ``consumer``'s cursor of ``kind`` to ``up_to`` (never backwards). Returns the cursor.

        ``up_to`` counts trajectories (``seq``), or finished groups (``done_seq``) for ``groups``; a
        cursor past the last one would silently skip what comes next, so it is refused.
        """
        column, table = ("done_seq", "groups") if _kind(kind) == "groups" else ("seq", "trajectories")
        async with self._write() as db:
            async with db.execute(f"SELECT COALESCE(MAX({column}), 0) FROM {table}") as cur:
                row = await cur.fetchone()
            high = int(row[0]) if row else 0
            if not 0 <= up_to <= high:
                raise CursorError(f"cannot ack up to {up_to}: the stream has only reached {high}")
            cur = await db.execute(
                "INSERT INTO consumers(name, kind, acked_seq, updated_at) VALUES (?,?,?,?) ON CONFLICT(name, kind) "
                "DO UPDATE SET acked_seq=MAX(acked_seq, excluded.acked_seq), updated_at=excluded.updated_at "
                "RETURNING acked_seq", (consumer, kind, up_to, time.time()))
            row = await cur.fetchone()
        return int(row[0]) if row else up_to

    async def consumers(self, limit: int = -1) -> list[dict[str, Any]]:
        """Cursors that were acked (the ``limit`` that moved last; -1: all): name, kind, position, when it moved."""
        return _consumer_rows(await self._all("SELECT name, kind, acked_seq, updated_at FROM consumers "
                                              "ORDER BY updated_at DESC, name, kind LIMIT ?", (limit,)))

    async def consumers_named(self, name: str, kind: str) -> list[dict[str, Any]]:
        """``consumers()``'s row for one cursor, if it was ever acked."""
        return _consumer_rows(await self._all(
            "SELECT name, kind, acked_seq, updated_at FROM consumers WHERE name=? AND kind=?", (name, _kind(kind))))

    async def consumed(self, kind: str, position: int) -> int:
        """Trajectories a cursor of ``kind`` at ``position`` has passed: for ``groups``, every trajectory of
        the groups that finished at or before it (kept as a running total, so this is one lookup)."""
        if _kind(kind) == "trajectories" or position <= 0:
            return max(0, position)
        row = await self._one("SELECT done_total FROM groups WHERE done_seq=?", (position,))
        return int(row[0] or 0) if row else 0

    async def unconsumed(self, kind: str, position: int, agent: str | None, envs: Sequence[str]) -> int:
        """Stored trajectories of ``agent`` in ``envs`` past a cursor of ``kind`` at ``position`` (for
        ``groups``: the sizes of matching groups that finished after it). A scan of what lies past the
        cursor: a subscribed consumer's backlog, which a trainer keeps short (withdrawn ones never come)."""
        if _kind(kind) == "trajectories":
            where, args = _subscribed(agent, envs, streamed=True)
            row = await self._one(f"SELECT COUNT(*) FROM trajectories WHERE seq > ? {where}", (position, *args))
        else:
            where, args = _subscribed(agent, envs, streamed=True, groups=True)
            row = await self._one(f"SELECT COALESCE(SUM(size), 0) FROM groups WHERE done_seq > ? {where}",
                                  (position, *args))
        return int(row[0] or 0)

    # -- policies -------------------------------------------------------------------------------

    async def policy_upload(self) -> PolicyUpload:
        """Somewhere to write a policy's content as it arrives; ``add_policy`` keeps it, ``discard`` drops it."""
        return await self._policies.upload()

    async def add_policy(self, sha256: str, content: PolicyUpload | bytes | None, uri: str | None,
                         name: str = "") -> Policy:
        """Publish a policy to line ``name``: its content (an upload that hashed to ``sha256``, or bytes)
        and/or a uri. The same content twice is the same version (and the same file), published again:
        the line's current version once more."""
        if isinstance(content, bytes):
            upload = await self._policies.upload()
            try:
                await upload.write(content)
                return await self.add_policy(sha256, upload, uri, name)
            finally:
                await upload.discard()
        file = None
        if content is not None:
            if content.sha256 != sha256:
                raise ValueError(f"the content hashes to {content.sha256}, not {sha256}")
            known = await self._one(f"SELECT {_POLICY_COLUMNS}, file, removed_at FROM policies WHERE sha256=?",
                                    (sha256,))
            if known is not None and known[6] is None and known[7] is None:  # in an older farmd's blob: no copy
                return await self._republish(Policy(*known[:6]), name)
            file = await content.keep()  # before the row: a row never names a file that is not there
        now = time.time()
        size = content.size if content is not None else 0
        async with self._write() as db:
            async with db.execute(f"SELECT {_POLICY_COLUMNS} FROM policies WHERE sha256=?", (sha256,)) as cur:
                row = await cur.fetchone()
            if row is None:
                async with db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM policies") as cur:
                    next_version = await cur.fetchone()
                version = int(next_version[0]) if next_version else 1
                await db.execute("INSERT INTO policies(version, sha256, size, blob, uri, created_at, file, name) "
                                 "VALUES (?,?,?,NULL,?,?,?,?)", (version, sha256, size, uri, now, file, name))
                policy = Policy(version, sha256, size, uri, now, name)
            else:
                policy = Policy(*row)
                if file is not None:  # its content was removed (``store.retention``): published again, it is back
                    await db.execute("UPDATE policies SET file=?, removed_at=NULL, removed_why=NULL "
                                     "WHERE version=? AND removed_at IS NOT NULL", (file, policy.version))
            await db.execute("INSERT INTO publications(name, version, at) VALUES (?,?,?)", (name, policy.version, now))
        return policy

    async def _republish(self, policy: Policy, name: str) -> Policy:
        async with self._write() as db:
            await db.execute("INSERT INTO publications(name, version, at) VALUES (?,?,?)",
                             (name, policy.version, time.time()))
        return policy

    async def policy_by_hash(self, sha256: str) -> Policy | None:
        row = await self._one(f"SELECT {_POLICY_COLUMNS} FROM policies WHERE sha256=?", (sha256,))
        return Policy(*row) if row else None

    async def policy_by_version(self, version: int) -> Policy | None:
        row = await self._one(f"SELECT {_POLICY_COLUMNS} FROM policies WHERE version=?", (version,))
        return Policy(*row) if row else None

    async def publications(self) -> list[tuple[str, int]]:
        """Every publication, (line, version), in the order they were made (one per trainer step: small
        enough to hold)."""
        return [(str(name), int(version)) for name, version in
                await self._all("SELECT name, version FROM publications ORDER BY seq")]

    async def policy_content(self, sha256: str, chunk_bytes: int) -> AsyncGenerator[bytes, None]:
        """A policy's content, ``chunk_bytes`` at a time, never read whole: from its file, or from the
        blob an older farmd stored it in. Nothing for a policy that is only a uri (or none at all);
        ``StoreError`` for one whose content was removed."""
        row = await self._one("SELECT version, file, blob IS NOT NULL, removed_at FROM policies WHERE sha256=?",
                              (sha256,))
        if row is None:
            return
        version, name, in_blob, removed_at = row
        if removed_at is not None:  # not "nothing": a caller must never take no bytes for the content
            raise StoreError(f"the content of policy {version} was removed")
        if name is not None:
            try:
                async for chunk in self._policies.read(name, chunk_bytes):
                    yield chunk
            except FileNotFoundError as exc:
                raise StoreError(f"the content of policy {version} ({name}) is missing from the data directory"
                                 ) from exc
            return
        offset = 0
        while in_blob:
            chunk = await asyncio.to_thread(_blob_slice, self.path, int(version), offset, chunk_bytes)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    async def latest_policy(self, name: str | None = None) -> Policy | None:
        """The policy published last (to line ``name``, when given)."""
        where, args = ("", ()) if name is None else ("WHERE p.name = ?", (name,))
        row = await self._one(
            f"SELECT {', '.join('v.' + c.strip() for c in _POLICY_COLUMNS.split(','))} FROM publications p "
            f"JOIN policies v ON v.version = p.version {where} ORDER BY p.seq DESC LIMIT 1", args)
        return Policy(*row) if row else None

    # -- small state (the task bank's) ----------------------------------------------------------

    async def get_state(self, key: str) -> Any:
        row = await self._one("SELECT value FROM state WHERE key=?", (key,))
        return json.loads(row[0]) if row else None

    async def put_state(self, key: str, value: Any) -> None:
        async with self._write() as db:
            await db.execute("INSERT INTO state(key, value) VALUES (?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                             (key, json.dumps(value)))
