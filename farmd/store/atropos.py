"""The Atropos queue's rows: the trainer's registration, registered environments, and every scored group
an Atropos environment pushed, as it was pushed.

Atropos's own server keeps all of this in memory; here each change is one transaction, so a restart
finds the queue, the buffers, the batches already cut and the step counter as they were. A group's
``state`` says where it is: ``buffered`` (waiting for others of its environment to make up the group
size), ``queued``, ``formed`` (cut into a batch not yet handed out), ``served`` or ``dropped`` (by a
reset: kept, never served). Payloads are the groups as pushed: compressed JSON, or (``pack_group``) compressed
MessagePack of the same value, which ``unpack`` gives back as the JSON orjson writes of it.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
from isal import isal_zlib

from farmd import jsonio
from farmd.records import Trajectory
from farmd.store.codec import deflate, pack_body
from farmd.store.database import Database
from farmd.store.groups import insert_finished
from farmd.store.names import assign_in, forget_in

LIVE_STATES = ("buffered", "queued", "formed")
_STATE_KEY = "atropos"


@dataclass
class AtroposGroupRow:
    id: int
    env_id: int | None
    size: int
    state: str
    batch: int | None
    """The batch it was cut into (``formed`` and ``served``): batches are numbered in the order they were cut."""
    source: str = "pushed"
    """``pushed`` by an Atropos environment, or ``farm``: made from farm's own rollouts."""


@dataclass
class GroupChange:
    """A group to add (``new``) or one whose state moves. Ids are the queue's to give (one farmd writes them)."""

    state: str
    id: int
    env_id: int | None = None
    size: int = 0
    payload: bytes = b""
    """A new group's JSON, ``pack``ed (off the event loop, by whoever parsed it)."""
    batch: int | None = None
    new: bool = False
    source: str = "pushed"
    records: list[Trajectory] = field(default_factory=list)
    """A new pushed group's sequences as farm trajectories (``farmd.atropos.records``): stored with it, as a
    finished farm group of agent ``atropos``."""
    bodies: list[bytes] = field(default_factory=list)
    """``records``' stored bodies (``pack_records``, off the event loop, by whoever made them)."""


def pack(payload: bytes) -> bytes:
    """A group's JSON as stored: a zlib stream (``unpack``), written by ISA-L (``codec.deflate``)."""
    return deflate(payload)


_MSGPACK = b"\x00"
"""The first byte of a payload that is MessagePack: a zlib stream's first byte is never 0 (its method, 8, is
in the low bits), so payloads stored before it read as they always did."""
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


def pack_group(group: Any, *, exact: bool) -> bytes:
    """A checked group as stored. ``exact``: the group came from orjson's or msgspec's parse, so orjson writes it
    back unchanged (``jsonio.dump``); it is then kept as MessagePack, which holds the same values (64-bit integers,
    doubles to the bit, text, lists, objects in their order), and JSON is written only when a batch is served.
    Writing the JSON and deflating it was a quarter of a push's work, MessagePack and its deflate a third of that,
    and smaller: a pushed group is stored at every push, read once when a batch is cut. Anything else (a value
    MessagePack refuses: an integer past 64 bits, a lone surrogate) is stored as its JSON, as before."""
    if exact:
        try:
            return _MSGPACK + deflate(_ENCODER.encode(group))
        except (TypeError, OverflowError, UnicodeEncodeError, msgspec.EncodeError):
            pass
    return pack(jsonio.dump(group, exact=exact))


def pack_records(records: list[Trajectory]) -> list[bytes]:
    """Trajectories' stored bodies: everything but their columns (ids, env, seed, reward, ...), which may still
    be set after this. Made from a checked group (``farmd.atropos.groups``: every number in its domain, every float
    finite), so orjson writes them (``pack_body``'s ``finite``)."""
    return [pack_body(t, finite=True) for t in records]


class AtroposRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def load(self) -> tuple[dict[str, Any] | None, list[AtroposGroupRow], int]:
        """The saved state (trainer, environments, step, ...; None: never saved), the live groups in arrival
        order, and the next group id."""
        row = await self._db.one("SELECT value FROM state WHERE key=?", (_STATE_KEY,))
        top = await self._db.one("SELECT COALESCE(MAX(id), 0) FROM atropos_groups")
        rows = await self._db.all(
            f"SELECT id, env_id, size, state, batch, source FROM atropos_groups WHERE state IN ({','.join('?' * len(LIVE_STATES))}) "
            "ORDER BY id", LIVE_STATES)
        return (json.loads(row[0]) if row else None,
                [AtroposGroupRow(int(i), None if e is None else int(e), int(n), str(s), None if b is None else int(b),
                                 str(src)) for i, e, n, s, b, src in rows], int(top[0]) + 1)

    async def apply(self, state: dict[str, Any], changes: list[GroupChange],
                    owned: tuple[str, str, str] | None = None) -> None:
        """Save ``state`` and ``changes`` in one transaction: new groups' trajectories too, and ``owned`` (a kind,
        a name, a credential: what ``state`` registers now is that credential's)."""
        now = time.time()
        added = [(c.id, c.env_id, c.size, c.state, c.batch, c.payload, now, c.source) for c in changes if c.new]
        moved = [(c.state, c.batch, c.id) for c in changes if not c.new]
        finished = [c.records for c in changes if c.new and c.records]
        bodies = [b for c in changes if c.new and c.records for b in c.bodies]
        async with self._db.write() as db:
            if finished:
                await insert_finished(db, finished, bodies, source="atropos", now=now)
            await db.executemany_each([
                ("INSERT INTO state(key, value) VALUES (?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                 [(_STATE_KEY, json.dumps(state))]),
                ("INSERT INTO atropos_groups(id, env_id, size, state, batch, payload, pushed_at, source) "
                 "VALUES (?,?,?,?,?,?,?,?)", added),
                ("UPDATE atropos_groups SET state=?, batch=? WHERE id=?", moved)])
            if owned is not None:
                await assign_in(db, *owned)

    async def drop_all(self, state: dict[str, Any], forget: tuple[str, ...] = ()) -> int:
        """A reset: every live group dropped (kept, never served again); ``state`` saved; the names of kinds
        ``forget`` held by nobody again. Returns how many groups."""
        async with self._db.write() as db:
            if forget:
                await forget_in(db, forget)
            await db.execute("INSERT INTO state(key, value) VALUES (?,?) ON CONFLICT(key) DO UPDATE SET "
                             "value=excluded.value", (_STATE_KEY, json.dumps(state)))
            return await db.execute(
                f"UPDATE atropos_groups SET state='dropped' WHERE state IN ({','.join('?' * len(LIVE_STATES))})",
                LIVE_STATES)

    async def payloads(self, ids: list[int]) -> dict[int, bytes]:
        """The groups as stored (``unpack`` gives their JSON: off the event loop, a batch is megabytes), by id."""
        if not ids:
            return {}
        rows = await self._db.all(
            f"SELECT id, payload FROM atropos_groups WHERE id IN ({','.join('?' * len(ids))})", ids)
        return {int(i): bytes(p) for i, p in rows}


def unpack(stored: bytes) -> bytes:
    """A stored group's JSON."""
    if stored[:1] == _MSGPACK:
        return orjson.dumps(_DECODER.decode(isal_zlib.decompress(memoryview(stored)[1:])))
    return zlib.decompress(stored)
