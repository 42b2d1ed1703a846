"""The Atropos queue: what atroposlib 0.4.0's server keeps in memory, kept in farm's store.

A trainer registers (its batch size and run settings), environments register and push scored groups, and
the trainer takes batches cut from the queue (``farmd.atropos.batching``). Every answer here is the answer
atroposlib's server gives for the same calls in the same order: same fields, same statuses, the same
batches in the same order (including its habit of cutting every batch the queue allows at once and
handing the last one cut first). What differs is what happens around it: each change is saved before it
is answered, so a restarted farmd serves the same queue, buffers, batches already cut and step counter.

With credentials, what one credential makes is its own (``owner``: the calling credential's name; None on a
farm without credentials, and for farm's own feed): the trainer registration is the registrant's, so only it
takes batches and resets; each environment id is the registering credential's, so only it pushes under the id,
disconnects it or reads its status. A push naming an id nobody registered is refused: taken before it exists,
an id would hand its groups to whoever registers it next. A reset forgets both with everything else. And an
environment's name is the first registrant's for good: its groups are stored as farm environment
``atropos:NAME``, which a farm trainer subscribes to, so another credential registering the same name (any
spelling of it that ``records.env_name`` makes the same) would slip its groups into that stream.

Groups are handled as opaque JSON once validated (``farmd.atropos.groups``): their payloads stay in the
store, and only their sizes and environments are held here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from farmd import names
from farmd.atropos import records
from farmd.atropos.batching import EnvShare, Queued, cut_all, filling
from farmd.atropos.groups import Checked
from farmd.errors import BadRequest, NotFound
from farmd.names import ATROPOS_ENV, ATROPOS_NAME, ATROPOS_TRAINER, TRAINER
from farmd.store import Store
from farmd.store.atropos import GroupChange, unpack

MIN_ENV_WEIGHT = 0.01
"""An environment's weight never reads below this: a small one is slowed, never starved (as Atropos)."""
EMPTY_EXAMPLE: dict[str, list[Any]] = {"tokens": [], "masks": [], "scores": [], "advantages": [], "ref_logprobs": [],
                 "generation_params": [], "inference_logprobs": [], "messages": [], "images": []}
_SCHEMA = 1
MAX_BUFFERED_GROUPS = 1024
"""Groups of a size other than their environment's that one environment's buffer holds waiting to add up: the
buffer is searched for an exact sum on every push, so it is bounded, and a push past it is refused."""
MAX_BUFFERED_SEQUENCES = 1 << 16
"""Their sequences, all together (the width of that search)."""
MAX_ENVS = 1024
"""Environments registered at once (until a reset): every change saves them all, every batch with shares
reads them all, so their number is bounded, not each caller's to grow."""


@dataclass
class _Group:
    id: int
    size: int
    env_id: int | None
    farm: bool = False
    """Made from farm's own rollouts (``farmd.api.atropos_feed``), not pushed."""


@dataclass
class _State:
    trainer: dict[str, Any] | None = None
    """The registration (wandb group and project, batch size, token length, checkpointing, steps), the step
    counter and whether the trainer has started taking batches. None: no trainer registered."""
    envs: list[dict[str, Any]] = field(default_factory=list)
    latest: int | None = None
    """The group last queued (``/latest_example``)."""
    next_batch: int = 1
    farm_cursor: int = 0
    """How far farm's delivery has been taken into the queue (saved with the groups it added)."""

    def to_json(self) -> dict[str, Any]:
        return {"schema": _SCHEMA, "trainer": self.trainer, "envs": self.envs, "latest": self.latest,
                "next_batch": self.next_batch, "farm_cursor": self.farm_cursor}


class AtroposQueue:
    def __init__(self, store: Store, stored: Callable[[], None] | None = None) -> None:
        self._store = store
        self._stored = stored
        """Called once pushed groups' trajectories are committed (farm's streams wake for them)."""
        self._state = _State()
        self._queued: list[_Group] = []
        self._buffers: dict[int, list[_Group]] = {}
        self._formed: list[tuple[int, list[_Group]]] = []
        """Batches cut and not yet handed out (numbered), handed out last first (as Atropos does)."""
        self._lock = asyncio.Lock()
        """One change at a time: each is a read of the queue, a decision and a transaction."""
        self._taken = asyncio.Event()
        """Set when groups leave the queue (a batch, a reset): what a feed waiting for room waits on."""
        self._next_id = 1
        """Groups are numbered here (one farmd writes them), so one transaction can add and move them."""

    async def open(self) -> None:
        saved, rows, self._next_id = await self._store.atropos.load()
        if saved is not None:
            self._state = _State(trainer=saved.get("trainer"), envs=list(saved.get("envs") or []),
                                 latest=saved.get("latest"), next_batch=int(saved.get("next_batch") or 1),
                                 farm_cursor=int(saved.get("farm_cursor") or 0))
        formed: dict[int, list[_Group]] = {}
        for row in rows:
            group = _Group(row.id, row.size, row.env_id, row.source == "farm")
            if row.state == "queued":
                self._queued.append(group)
            elif row.state == "buffered" and row.env_id is not None:
                self._buffers.setdefault(row.env_id, []).append(group)
            elif row.state == "formed" and row.batch is not None:
                formed.setdefault(row.batch, []).append(group)
        self._formed = [(b, formed[b]) for b in sorted(formed)]

    # -- the trainer's side --------------------------------------------------------------------------

    async def register(self, registration: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
        """A trainer (or another process of it) registers; the first one's settings hold until a reset."""
        async with self._lock, self._changing():
            await self._held(ATROPOS_TRAINER, TRAINER, owner, claim=True)
            if self._state.trainer is None:
                self._state.trainer = {**registration, "step": int(registration["starting_step"]), "started": False}
                self._state.envs = []
                await self._save([])
            return {"uuid": uuid.uuid4().int}

    async def batch(self, owner: str | None = None) -> dict[str, Any] | bytes:
        """Atropos's answer: an error or no batch, or a batch as the JSON it goes out as (its groups' stored
        JSON joined, never parsed and written again). Only the registered trainer's credential takes them."""
        async with self._lock, self._changing():
            trainer = self._state.trainer
            await self._held(ATROPOS_TRAINER, TRAINER, owner, claim=trainer is not None)
            if trainer is None:
                return {"status": "error", "message": "Trainer not registered. Call /register first.", "batch": []}
            trainer["started"] = True
            changes: list[GroupChange] = []
            if not self._formed:
                # A queue is up to its whole depth of groups: cut, and its changes made, off the event loop (the
                # queue is this call's while it holds the lock).
                cut, self._queued, formed = await asyncio.to_thread(
                    _cut, self._queued, int(trainer["batch_size"]), self._state.envs, self._state.next_batch)
                if not cut:
                    await self._save([])
                    return {"batch": None}
                trainer["step"] = int(trainer["step"]) + len(cut)
                changes += formed
                for groups in cut:
                    self._formed.append((self._state.next_batch, groups))
                    self._state.next_batch += 1
            number, served = self._formed.pop()
            self._taken.set()
            changes += [GroupChange("served", id=g.id, batch=number) for g in served]
            await self._save(changes)
            stored = await self._store.atropos.payloads([g.id for g in served])
        return await asyncio.to_thread(_joined, [stored[g.id] for g in served])

    async def reset(self, owner: str | None = None) -> int:
        """Everything forgotten, as Atropos's reset: the groups are kept in the store, dropped; the trainer
        registration and environment ids are nobody's again. Only the registered trainer's credential resets."""
        async with self._lock, self._changing():
            await self._held(ATROPOS_TRAINER, TRAINER, owner, claim=False)
            self._state = _State(next_batch=self._state.next_batch, farm_cursor=self._state.farm_cursor)
            self._queued, self._buffers, self._formed = [], {}, []
            self._taken.set()
            return await self._store.atropos.drop_all(self._state.to_json(), forget=(ATROPOS_TRAINER, ATROPOS_ENV))

    # -- the environments' side ----------------------------------------------------------------------

    async def register_env(self, request: dict[str, Any], owner: str | None = None) -> dict[str, Any]:
        """A new environment id, the registering credential's (saved with it: an id is never registered unowned)."""
        async with self._lock, self._changing():
            trainer = self._state.trainer
            if trainer is None or not trainer.get("started"):
                return {"status": "wait for trainer to start"}
            envs = self._state.envs
            if len(envs) >= MAX_ENVS:
                raise BadRequest(f"{len(envs)} environments are registered, the most there may be until a reset "
                                 "(/reset_data)")
            name = request["desired_name"]
            if records.env_name(name) != records.env_name(None):  # a group of no environment is nobody's
                await self._held(ATROPOS_NAME, records.env_name(name), owner, claim=True)
            env_id = len(envs)
            envs.append({"max_context_len": request["max_token_length"],
                         "weight": request["weight"] if request["weight"] is not None else 1.0,
                         "desired_name": name,
                         "real_name": f"{name}_{sum(1 for e in envs if e['desired_name'] == name)}",
                         "registered_id": env_id, "connected": True,
                         "min_batch_allocation": request.get("min_batch_allocation"),
                         "group_size": request["group_size"]})
            await self._save([], owned=(ATROPOS_ENV, str(env_id), owner) if owner is not None else None)
            return {"status": "success", "env_id": env_id, "wandb_name": envs[-1]["real_name"],
                    "checkpoint_dir": trainer.get("checkpoint_dir", ""), "starting_step": trainer["step"],
                    "checkpoint_interval": trainer["save_checkpoint_interval"], "num_steps": trainer["num_steps"]}

    async def disconnect_env(self, env_id: int, owner: str | None = None) -> dict[str, Any]:
        async with self._lock, self._changing():
            if not 0 <= env_id < len(self._state.envs):
                return {"status": "failure", "error": "list index out of range"}
            await self._held(ATROPOS_ENV, str(env_id), owner, claim=True)
            self._state.envs[env_id]["connected"] = False
            await self._save([])
            return {"status": "success"}

    async def push(self, groups: list[Checked], *, farm_cursor: int | None = None,
                   owner: str | None = None) -> list[dict[str, Any]]:
        """Checked groups into the queue, or into their environment's buffer when their size is not the one it
        registered; one answer per group, all saved in one transaction (with their trajectories).
        ``farm_cursor``: they were made from farm's rollouts up to there, which is saved with them. ``owner``:
        every environment id they name is its (none of them is kept otherwise)."""
        source = "pushed" if farm_cursor is None else "farm"
        async with self._lock, self._changing(nested=False):
            for env_id in sorted({c.group["env_id"] for c in groups if c.group.get("env_id") is not None}):
                if owner is not None and self._env(env_id) is None:
                    raise NotFound(f"no environment {env_id} is registered ({len(self._state.envs)} are): an "
                                   "environment id is given by /register-env, to the credential that registers it")
                await self._held(ATROPOS_ENV, str(env_id), owner, claim=True)
            if farm_cursor is not None:
                self._state.farm_cursor = max(self._state.farm_cursor, farm_cursor)
            answers: list[dict[str, Any]] = []
            added: dict[int, GroupChange] = {}
            moved: list[GroupChange] = []
            for checked in groups:
                group = checked.group
                made = _Group(self._next_id, len(group["tokens"]), group.get("env_id"), farm_cursor is not None)
                self._next_id += 1
                env = self._env(made.env_id)
                records.name(checked.records, env=records.env_name(env["desired_name"] if env else None),
                             group=made.id)
                wanted = int(env.get("group_size") or 1) if env is not None else made.size
                change = GroupChange("queued", id=made.id, env_id=made.env_id, size=made.size, payload=checked.stored,
                                     new=True, source=source, records=checked.records,
                                     bodies=checked.bodies)
                added[made.id] = change
                if made.size == wanted:
                    self._queued.append(made)
                    self._state.latest = made.id
                    answers.append({"status": "received"})
                    continue
                assert made.env_id is not None
                change.state = "buffered"
                buffer = self._buffers.setdefault(made.env_id, [])
                if len(buffer) >= MAX_BUFFERED_GROUPS or sum(g.size for g in buffer) + made.size > MAX_BUFFERED_SEQUENCES:
                    raise BadRequest(f"environment {made.env_id}'s buffer holds {len(buffer)} groups of a size other than "
                                     f"its group_size ({wanted}), at most {MAX_BUFFERED_GROUPS} groups and "
                                     f"{MAX_BUFFERED_SEQUENCES} sequences: push groups of {wanted} sequences")
                buffer.append(made)
                ready = filling([g.size for g in buffer], wanted)
                for i in ready:  # they join the queue in arrival order
                    self._queued.append(buffer[i])
                    self._state.latest = buffer[i].id
                    if buffer[i].id in added:
                        added[buffer[i].id].state = "queued"
                    else:
                        moved.append(GroupChange("queued", id=buffer[i].id))
                left = [g for i, g in enumerate(buffer) if i not in set(ready)]
                self._buffers[made.env_id] = left
                answers.append({"status": "buffered", "buffer_size": sum(g.size for g in left)})
            await self._save([*added.values(), *moved])
            if self._stored is not None and any(c.records for c in added.values()):
                self._stored()
            return answers

    @property
    def farm_cursor(self) -> int:
        return self._state.farm_cursor

    async def until_farm_room(self, limit: int) -> None:
        """Until fewer than ``limit`` groups made from farm's rollouts wait for a trainer."""
        while self.farm_groups_waiting() >= limit:
            self._taken.clear()
            await self._taken.wait()

    def farm_groups_waiting(self) -> int:
        """Groups made from farm's rollouts that no trainer has taken yet (queued, or in a batch cut)."""
        return sum(g.farm for g in self._queued) + sum(g.farm for _, batch in self._formed for g in batch)

    def _env(self, env_id: int | None) -> dict[str, Any] | None:
        envs = self._state.envs
        return envs[env_id] if env_id is not None and 0 <= env_id < len(envs) else None

    async def latest_example(self) -> dict[str, Any] | bytes:
        latest = self._state.latest
        if latest is None or latest < 0:
            return dict(EMPTY_EXAMPLE)
        stored = await self._store.atropos.payloads([latest])
        if latest not in stored:
            return dict(EMPTY_EXAMPLE)
        return await asyncio.to_thread(unpack, stored[latest])

    # -- what either side reads ----------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        trainer = self._state.trainer
        if trainer is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {"batch_size": trainer["batch_size"], "max_token_len": trainer["max_token_len"]}

    def wandb_info(self) -> dict[str, Any]:
        trainer = self._state.trainer
        if trainer is None:
            return {"group": None, "project": None}
        return {"group": trainer["wandb_group"], "project": trainer["wandb_project"]}

    def status(self) -> dict[str, Any]:
        trainer = self._state.trainer
        if trainer is None:
            return {"current_step": 0, "queue_size": 0}
        return {"current_step": trainer["step"], "queue_size": len(self._queued)}

    async def status_env(self, env_id: int, owner: str | None = None) -> dict[str, Any]:
        """How much of the queue an environment should count as ahead of it (its off-policy limit is checked
        against this by the environment), and its share of the sampling weight."""
        async with self._lock:
            envs = self._state.envs
            if not 0 <= env_id < len(envs):
                raise NotFound(f"no environment {env_id} is registered ({len(envs)} are)")
            await self._held(ATROPOS_ENV, str(env_id), owner, claim=True)
            return self._status_env(env_id)

    def _status_env(self, env_id: int) -> dict[str, Any]:
        envs = self._state.envs
        me = envs[env_id]
        total = sum(e["max_context_len"] * max(0.0, e["weight"]) for e in envs if e["connected"])
        if total <= 0:
            raise BadRequest("no connected environment has a positive weight")
        weight = max(MIN_ENV_WEIGHT, me["max_context_len"] * me["weight"] / total)
        least = sum(e["min_batch_allocation"] for e in envs
                    if e.get("connected") and e.get("min_batch_allocation") is not None)
        largest = max([1, *(g.size for g in self._queued)])
        own_size = int(me["group_size"])
        mine = 0
        others: dict[int | None, int] = {}
        for g in self._queued:
            if g.env_id == env_id:
                own_size = max(own_size, g.size)
                mine += g.size
            else:
                others[g.env_id] = others.get(g.env_id, 0) + g.size
        me["group_size"] = own_size  # a group size that grows in the queue is the env's from now on (as Atropos)
        batch_size = int(self._state.trainer["batch_size"]) if self._state.trainer else 0
        reserved = {e["registered_id"]: int(batch_size * e["min_batch_allocation"]) for e in envs
                    if e.get("connected") and e.get("min_batch_allocation") is not None}
        spare = 0
        if largest > 1:
            for other, sequences in others.items():
                packed = -(-sequences // largest) * largest
                spare += max(0, packed - (reserved.get(other, 0) if other is not None else 0))
        if self._state.trainer is None:
            return {"current_step": 0, "queue_size": 0, "unallocated_fraction": 1.0,
                    "num_self_sequences_in_queue": 0, "env_weight": weight}
        return {"current_step": self._state.trainer["step"], "queue_size": (mine + spare) // own_size,
                "unallocated_fraction": 1.0 - min(least, 1.0), "self_queue_size": mine // own_size,
                "max_group_size": largest, "env_weight": weight}

    # -- saving --------------------------------------------------------------------------------------

    async def _held(self, kind: str, name: str, owner: str | None, *, claim: bool) -> None:
        """``owner`` may act under ``name``: it holds it, or (``claim``) nobody does and now it does. NameHeld
        when another credential holds it. No owner (no credentials, or farm's own feed): nothing is bound."""
        if owner is None:
            return
        if claim:
            await names.bind(self._store.names, kind, name, owner)
            return
        row = await self._store.names.holder(kind, name)
        if row is not None and row.credential != owner:
            raise names.held(kind, name, row.credential, owner)

    async def _save(self, changes: list[GroupChange], owned: tuple[str, str, str] | None = None) -> None:
        await self._store.atropos.apply(self._state.to_json(), changes, owned=owned)

    @contextlib.asynccontextmanager
    async def _changing(self, *, nested: bool = True) -> AsyncIterator[None]:
        """A change made in memory first and then saved: if the save fails, memory goes back to what the
        store holds (the caller gets the error; nothing half-done is served). ``nested=False``: the change
        leaves the trainer's and the environments' dicts as they are (a push), so they are not copied: a deep
        copy of them was a fiftieth of a push's time."""
        state = copy.deepcopy(self._state) if nested else dataclasses.replace(self._state)
        saved = (state, list(self._queued), {k: list(v) for k, v in self._buffers.items()},
                 [(n, list(b)) for n, b in self._formed], self._next_id)
        try:
            yield
        except BaseException:
            self._state, self._queued, self._buffers, self._formed, self._next_id = saved
            raise


def _cut(queued: list[_Group], batch_size: int, envs: list[dict[str, Any]], first: int
         ) -> tuple[list[list[_Group]], list[_Group], list[GroupChange]]:
    """Every batch the queue makes now (``batching.cut_all``), in the order they are cut, numbered from ``first``;
    the groups left queued; and the changes that form them."""
    shares = [EnvShare(i, bool(e.get("connected")), e.get("min_batch_allocation")) for i, e in enumerate(envs)]
    positions = cut_all([Queued(g.size, g.env_id) for g in queued], batch_size, shares)
    cut = [[queued[i] for i in batch] for batch in positions]
    taken = {i for batch in positions for i in batch}
    changes = [GroupChange("formed", id=g.id, batch=first + n) for n, groups in enumerate(cut) for g in groups]
    return cut, [g for i, g in enumerate(queued) if i not in taken], changes


def _joined(stored: list[bytes]) -> bytes:
    return b'{"batch":[' + b",".join(unpack(s) for s in stored) + b"]}"
