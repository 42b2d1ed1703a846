"""The trajectory record codec: a record as a stored row (its columns and its packed body) and back.

A body is everything of a trajectory that is not a column: compressed JSON of the record's own fields, then
the turns' token ids and logprobs as arrays. Pure functions, no database: packing and reading bodies is the
cost of a write and of a read, so callers run them off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import struct
import sys
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import orjson
from isal import isal_zlib

from farmd import domain
from farmd.records import ChatMessage, Trajectory, Turn, evolve, from_plain
from farmd.text import valid_text, valid_tree

log = logging.getLogger("farmd.store")

TRAJ_COLUMNS = "id, seq, group_id, env, env_version, seed, difficulty, agent, policy_version, reward, passed, " \
               "status, reasons, flags, verifier_version, body, node, finished_at, run_id, verified_by, verdict_version"
_BODY_INDEX = [c.strip() for c in TRAJ_COLUMNS.split(",")].index("body")
_COLUMN_INDEX = tuple(i for i, c in enumerate(TRAJ_COLUMNS.split(",")) if c.strip() != "body")

_COLUMN_FIELDS = tuple(c.strip() for c in TRAJ_COLUMNS.split(",") if c.strip() != "body")
_VERDICT_INDEX = [c.strip() for c in TRAJ_COLUMNS.split(",")].index("verdict_version")
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
_DEFLATE_LEVEL = 1
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


def pack_body(traj: Trajectory, *, finite: bool = False) -> bytes:
    """Everything of a trajectory that is not a column: compressed JSON of the record's own field list,
    then the turns' arrays.

    ``finite``: the caller found every number of ``traj`` in its domain and every float finite, so orjson writes
    the JSON: several times faster than ``json`` where details hold per-token rows (an Atropos group's advantages),
    and it reads back the same. orjson would write a NaN or an infinity as ``null``, silently, so anything else is
    written by ``json`` (a NaN as ``NaN``, as details may hold one). orjson refuses what it cannot write exactly (a
    lone surrogate, an integer past 64 bits, a key that is not text); that record is written by ``json`` too."""
    body: dict[str, Any] = {"v": _BODY_VERSION}
    for name in _PACKED_FIELDS:
        body[name] = getattr(traj, name)
    arrays = bytearray()
    body["turns"] = [_pack_turn(turn, traj.messages, arrays) for turn in traj.turns]
    if finite:
        try:
            return deflate(orjson.dumps(body, default=_as_json)) + arrays
        except (orjson.JSONEncodeError, TypeError):
            pass
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=_as_json)
    return deflate(_utf8(text)) + arrays


def deflate(data: bytes) -> bytes:
    """``data`` as a zlib stream, as ``zlib.compress(data, 1)`` makes one (any zlib reads it back: bodies stored
    before and after read alike), by ISA-L: about four times faster than zlib's fastest level, and no larger.
    Compressing a body was a fifth of an Atropos push's time."""
    return isal_zlib.compress(data, _DEFLATE_LEVEL)


def checked_bodies(records: dict[int, Trajectory], *, checked: bool = False
                   ) -> tuple[dict[int, bytes], dict[int, list[str]]]:
    """Each record's body, or what is out of its domain (``farmd.domain``), by id: in a thread. ``checked``: the
    caller's own code found every record in its domain just now, and they are not checked again."""
    bodies: dict[int, bytes] = {}
    refused: dict[int, list[str]] = {}
    for tid, t in records.items():
        found = [] if checked else domain.problems(t)
        if found:
            refused[tid] = found
        else:  # details are the one tree the domain lets hold a NaN or an infinity
            bodies[tid] = pack_body(t, finite=domain.tree_problem(t.verdict_details, "") is None)
    return bodies, refused


def _pack_turn(turn: Turn, messages: list[ChatMessage], arrays: bytearray) -> dict[str, Any]:
    plain = {name: getattr(turn, name) for name in _TURN_FIELDS}
    i = turn.message_index
    if i < len(messages) and messages[i].content == turn.completion:  # its assistant message's: kept once
        plain["completion"] = None
    for name, kind, code in _ARRAYS:
        values = plain[name]
        try:
            arrays += _little_endian(code, values)
        except (TypeError, OverflowError, struct.error):
            continue  # not what a model server sends (a negative id, a None): kept as given, in the JSON
        plain[name] = {kind: len(values)}
    return plain


def _little_endian(code: str, values: list[Any]) -> bytes | array[Any]:
    """``values`` as little-endian items of ``code`` (``array``'s codes), or an error when one does not fit."""
    if code == "d":  # struct takes floats two to three times faster than array("d") does
        return struct.pack(f"<{len(values)}d", *values)
    packed = array(code, values)
    if _SWAP:
        packed.byteswap()
    return packed


def _unpack(raw: bytes) -> dict[str, Any]:
    inflate = zlib.decompressobj()
    text = inflate.decompress(raw)
    if not inflate.eof:
        raise zlib.error("a trajectory body ends inside its compressed JSON")
    body: dict[str, Any] = read_json(text)
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


INSERT_TRAJECTORY = f"INSERT INTO trajectories({TRAJ_COLUMNS}) VALUES ({','.join('?' * (len(_COLUMN_INDEX) + 1))})"


def traj_row(t: Trajectory, body: bytes) -> tuple[Any, ...]:
    """A stored trajectory's row, in ``TRAJ_COLUMNS``' order (the body packed already)."""
    return (t.id, t.seq, t.group_id, t.env, t.env_version, t.seed, t.difficulty, t.agent, t.policy_version, t.reward,
            int(t.passed), t.status, _json(t.reasons), _json(t.flags), t.verifier_version, body, t.node, t.finished_at,
            t.run_id, t.verified_by, 0)  # the verdict it is stored with is verdict 0, whatever the record says


def _json(value: Any) -> str:
    """A column's JSON (a record's reasons or flags), by orjson: ``json.dumps`` with options makes an encoder
    per call, and a stored trajectory has two of these. Both are lists of text (``domain``), which orjson writes
    exactly; what it refuses (a lone surrogate) is written by ``json``."""
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, ensure_ascii=False)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Text reaches the store already made valid where it entered the farm (a trajectory is sealed
        # by the rollout runner); this is the store refusing to keep what no reader could decode.
        log.error("text that is not valid UTF-8 reached the store; it is kept repaired")
        return valid_text(text)[0].encode("utf-8")


def read_json(raw: str | bytes) -> Any:
    value = json.loads(raw)
    # Rows written before text was repaired on the way in kept lone surrogates as JSON escapes
    # (``"\ud800"``), which decode to strings no encoder takes: repaired here, so an old row can
    # never break a stream or an export. Only escapes can carry one, so only they cost the walk.
    marks = (b"\\ud", b"\\uD") if isinstance(raw, bytes) else ("\\ud", "\\uD")
    if marks[0] in raw or marks[1] in raw:  # type: ignore[operator]
        value, _ = valid_tree(value)
    return value


def read_trajectory(row: Sequence[Any]) -> Trajectory:
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
    log_unreadable(columns.get("id"), found)
    return domain.unreadable(columns, "; ".join(found[:3]))


def _record(columns: dict[str, Any], body: bytes | None) -> Trajectory:
    plain = dict(columns)
    passed = plain["passed"]
    plain["passed"] = bool(passed) if passed in (0, 1) else passed  # anything else is out of its domain
    plain["reasons"] = read_json(plain["reasons"])
    plain["flags"] = read_json(plain["flags"])
    plain["run_id"] = plain["run_id"] or 0
    if body is not None:
        plain.update(_unpack(body))
    return from_plain(Trajectory, plain)


_LOGGED_UNREADABLE: OrderedDict[object, None] = OrderedDict()
"""Rows logged as unreadable by this process (the last few thousand): every stream that passes one meets it
again, and one line per row says it."""


def log_unreadable(traj_id: object, problems: list[str]) -> None:
    key = traj_id if isinstance(traj_id, int) else repr(traj_id)[:40]
    if key in _LOGGED_UNREADABLE:
        return
    _LOGGED_UNREADABLE[key] = None
    if len(_LOGGED_UNREADABLE) > 4096:
        _LOGGED_UNREADABLE.popitem(last=False)
    log.error("stored trajectory %s cannot be read (%s): served as an unreadable stub", key,
              "; ".join(problems[:3])[:1000], extra={"event": "unreadable_trajectory", "trajectory": key})



def read_trajectories(rows: list[Any]) -> list[Trajectory]:
    return [read_trajectory(r) for r in rows]


RECENT_KEPT = 16_384
"""Records ``Recent`` keeps at most: a few seconds of a large fleet's output, which is how far behind a trainer
that keeps up reads; one further behind reads its records from their rows."""
RECENT_BODY_BYTES = 16 << 20
"""And at most this many bytes of their bodies (a model's records, their token ids and logprobs, are large)."""


class Recent:
    """Records this process stored lately, each with the row it was stored as: a stream that reads one back soon
    after (a trainer keeping up reads every record once, within seconds) gets it without its body being
    unpacked, parsed and checked again, which was most of what serving a record cost.

    A kept record is served only for a row exactly as it was stored, its body's bytes included; a row changed
    since (a verdict given later, ``verified_by`` when the coordinator confirms a node's) is read from itself.
    ``remember`` runs on the event loop once a commit is done, ``read`` in a thread: each touches the mapping
    one operation at a time."""

    def __init__(self, keep: int = RECENT_KEPT, body_bytes: int = RECENT_BODY_BYTES) -> None:
        self._keep = keep
        self._body_bytes = body_bytes
        self._bytes = 0
        # Oldest first, dropped from the front: a plain dict's first item, after thousands dropped before it, is
        # found by skipping every emptied slot (17 us a record at 16k kept, measured), an OrderedDict's at once.
        self._kept: OrderedDict[int, tuple[tuple[Any, ...], Trajectory]] = OrderedDict()

    def remember(self, rows: Sequence[tuple[Any, ...]], records: Sequence[Trajectory]) -> None:
        """``records`` were just committed as ``rows`` (``traj_row``'s)."""
        for row, record in zip(rows, records, strict=True):
            # As ``read_trajectory`` gives it back: the verdict it was stored with is verdict 0; scores live apart.
            old = self._kept.pop(int(row[0]), None)
            self._bytes += len(row[_BODY_INDEX]) - (len(old[0][_BODY_INDEX]) if old is not None else 0)
            self._kept[int(row[0])] = (row, evolve(record, verdict_version=int(row[_VERDICT_INDEX]), scores=[]))
        while self._kept and (len(self._kept) > self._keep or self._bytes > self._body_bytes):
            _, (gone, _) = self._kept.popitem(last=False)
            self._bytes -= len(gone[_BODY_INDEX])

    def kept(self) -> list[int]:
        """The ids kept, oldest first."""
        return list(self._kept)

    def read(self, rows: list[Any], for_loss: bool = False) -> list[Trajectory]:
        """``read_trajectories``, served from what was kept where a row is as it was stored; ``for_loss``: each
        as ``Trajectory.for_loss`` (the ``tokens`` view)."""
        out = []
        for row in rows:
            kept = self._kept.get(row[0])
            if kept is not None and kept[0] == tuple(row):
                # A new record either way: a reader sets its own scores on it, and the kept one stays whole.
                out.append(kept[1].for_loss() if for_loss else copy.copy(kept[1]))
            else:
                record = read_trajectory(row)
                out.append(record.for_loss() if for_loss else record)
        return out

