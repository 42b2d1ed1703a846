"""The delivery service: what each trainer has been sent and has taken, and what that asks of production.

One place owns a consumer's cursors (by name and by what they count: trajectories, or
finished groups for whole-group streams), waking streams when trajectories are stored,
staleness, whole-group batching, and the demand that consumption implies: how many
stored trajectories the slowest *consuming* trainer has not yet taken.

Who counts as consuming: a consumer with a stream open that is not stalled. A consumer is
stalled when a batch it was sent has gone unacknowledged for ``stall_s``: a client that opens a
stream under a new name and never acks holds nobody back for longer than that. An operator
who knows the trainers can name them (``consumers``): then only those are followed.
Delivery is at least once: a batch is acknowledged by its ``up_to``, and a stream reopened
after a restart resumes just after the consumer's last ack.

A stream may subscribe (``Subscription``): to one agent spec and some environments. A trainer
subscribes to its own policy (``torch:tiny`` on ``arith``), so trajectories of every other agent —
scripted controls, another lab's endpoint, a red team, its own greedy evaluations — never reach it,
and its staleness is counted in versions of its own policy line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from farmd.records import Trajectory, View
from farmd.store import FinishedGroup, Store

TRAJECTORIES = "trajectories"
GROUPS = "groups"
_CLOSED_KEPT = 4096
"""Closed consumers still holding a batch unacknowledged whose stall clock is kept (names come from
clients: bounded)."""
_POLL_S = 1.0
"""A stream with nothing new looks again at least this often (a commit wakes it at once)."""


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """One consumer as operators see it (``Delivery.status``)."""

    name: str
    whole_groups: bool
    """It streams whole groups (its cursor counts groups' completions), not single trajectories."""
    cursor: int
    """The sequence number it acked up to (0: never acked)."""
    lag: int
    """Stored trajectories it has not taken."""
    streams: int
    """Its streams open now."""
    state: str
    """``consuming``, ``stalled`` (sent more than it acked, for longer than the stall time) or ``closed``."""
    acked_at: float | None
    """When it last acked (None: never)."""
    staleness: float | None
    """Mean policy versions behind, of the trajectories its last batch carried (None: none yet)."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """What one stream carries: ``agent``'s trajectories (the spec exactly as queued; "" any agent) of
    ``envs`` (empty: any environment)."""

    agent: str = ""
    envs: tuple[str, ...] = ()


EVERYTHING = Subscription()


@dataclass(frozen=True, slots=True)
class Delivered:
    """One batch for one stream: the trajectories to send (stale ones left out) and the position an ack of
    it moves the consumer's cursor to. ``trajectories`` may be empty when all were stale."""

    trajectories: list[Trajectory]
    up_to: int


@dataclass(slots=True)
class _Consumer:
    """What this farmd knows of a consumer beyond its stored cursor: its open streams and whether it keeps up."""

    streams: int = 0
    sent_up_to: int = 0
    """How far its streams have sent, empty batches of stale trajectories included (demand counts from it)."""
    asked_up_to: int = 0
    """The end of the last batch that held trajectories: what it must ack to wait on nobody."""
    waiting_since: float | None = None
    """Since when it has held a batch without acknowledging it; None when it has acked everything sent."""
    subscription: Subscription | None = None
    """What its latest stream subscribed to (None: everything)."""
    staleness: float | None = None
    """Mean policy versions behind, of the trajectories its last batch carried (None: none yet)."""


class Delivery:
    """``stall_s``: a consumer that leaves a batch unacknowledged this long stops counting for demand until
    it acks. ``consumers``: the consumers demand follows (empty: every consumer that is consuming)."""

    def __init__(self, store: Store, behind: Callable[[str | None, int], int], *, stall_s: float = 300.0,
                 consumers: tuple[str, ...] = (), line_for: Callable[[str], str | None] = lambda _spec: None
                 ) -> None:
        self.store = store
        self._behind = behind
        """(policy line or None for any, version) -> versions of that line published since."""
        self._line_for = line_for
        """An agent spec's policy line, or None."""
        self.stall_s = stall_s
        self.followed = consumers
        self._consumers: dict[tuple[str, str], _Consumer] = {}
        """Consumers with a stream open now, and closed ones that left a batch unacknowledged; what the
        store keeps of the others is their cursor."""
        self.generation = 0
        """Counts commits that stored trajectories: a stream notes it before it reads."""
        self._stored = asyncio.Event()
        """Set (and replaced) at each such commit: wakes every stream waiting for more."""
        store.db.on_stored(self.stored)  # commits by another coordinator on the same database (PostgreSQL)

    # -- production's side ------------------------------------------------------------------------

    def stored(self) -> None:
        """Trajectories were just committed: wake every stream waiting for more."""
        self.generation += 1
        stored_now, self._stored = self._stored, asyncio.Event()
        stored_now.set()

    async def wait_for_more(self, seen_generation: int, timeout_s: float) -> None:
        """Return once trajectories were stored after ``generation`` was ``seen_generation`` (at once if
        they already were), or after ``timeout_s``. One stream's wait never swallows another's wake-up:
        each commit sets its own event."""
        if self.generation != seen_generation:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stored.wait(), timeout_s)

    async def backlog(self) -> int | None:
        """Stored trajectories the slowest consuming trainer has not been sent; None when no trainer is
        consuming (then there is no one to produce ahead of).

        Counted from what a stream has sent, not from the last ack: a trainer acks when it checkpoints,
        every several seconds, and production must not wait for that. What it was sent and never acks
        comes again after a restart; nothing needs producing for it.
        """
        now = time.monotonic()
        keys = [key for key, c in self._consumers.items() if self._consuming(key, c, now)]
        if not keys:
            return None
        stored = await self.store.last_seq()
        behind = []
        for name, kind in keys:
            state = self._consumers[(name, kind)]
            cursor = max(await self.store.cursor(name, kind), state.sent_up_to)
            sub = state.subscription
            if sub is None or sub == EVERYTHING:
                behind.append(stored - await self.store.consumed(kind, cursor))
            else:  # what others' trajectories fill the store with is nothing this trainer waits for
                behind.append(await self.store.unconsumed(kind, cursor, sub.agent or None, sub.envs))
        return max(behind)

    def _consuming(self, key: tuple[str, str], c: _Consumer, now: float) -> bool:
        if c.streams <= 0 or (self.followed and key[0] not in self.followed):
            return False
        return c.waiting_since is None or now - c.waiting_since <= self.stall_s

    # -- the trainer's side -----------------------------------------------------------------------

    async def batches(self, consumer: str, *, whole_groups: bool, batch_size: int, max_staleness: int,
                      view: View, subscription: Subscription = EVERYTHING) -> AsyncIterator[Delivered]:
        """Batches for one stream, from just after ``consumer``'s last ack, forever (the caller closes it).

        ``whole_groups``: only groups whose every job has ended, never split across batches (at least
        one group per batch, however big). ``max_staleness``: trajectories more than that many policy
        versions old are left out, a whole group with them (a group-relative advantage never sees half
        a group), and a batch of only those still comes, empty, so the cursor moves past them. Versions
        are counted in the subscribed agent's policy line (any line without one). ``subscription``: only
        those trajectories; the others are passed over (an ack past them moves the cursor as usual). ``view``: how
        much of each record (``farmd.records.View``).
        """
        line = self._line_for(subscription.agent) if subscription.agent else None
        agent, envs = subscription.agent or None, subscription.envs
        kind = GROUPS if whole_groups else TRAJECTORIES
        key = (consumer, kind)
        size = max(1, batch_size)
        sent = await self.store.cursor(consumer, kind)
        state = self._consumers.setdefault(key, _Consumer())
        state.streams += 1
        state.subscription = subscription
        try:
            while True:
                seen = self.generation  # before reading: a commit after it wakes the wait
                if whole_groups:
                    trajectories, up_to = await self._whole_groups(sent, size, view, agent, envs)
                else:
                    trajectories = await self.store.trajectories(after_seq=sent, limit=size, view=view, agent=agent,
                                                                 envs=envs, streamed=True)
                    up_to = trajectories[-1].seq if trajectories else sent
                if up_to == sent:
                    await self.wait_for_more(seen, _POLL_S)
                    continue
                fresh = trajectories if not max_staleness else _fresh(
                    trajectories, lambda v: self._behind(line, v) > max_staleness, whole_groups)
                sent = up_to
                if fresh or max_staleness:
                    state.sent_up_to = max(state.sent_up_to, up_to)
                    if fresh:  # an empty batch asks nothing of the trainer: it starts no stall clock
                        state.asked_up_to = max(state.asked_up_to, up_to)
                        state.staleness = sum(self._behind(line, t.policy_version) for t in fresh) / len(fresh)
                        self._start_clock(state)
                    yield Delivered(fresh, up_to)
        finally:
            state.streams -= 1
            if state.streams <= 0 and state.waiting_since is None:
                self._consumers.pop(key, None)
            elif state.streams <= 0:
                # Its clock survives the stream: reconnecting must not be a way to sit on a batch for ever.
                self._forget_closed(keep=_CLOSED_KEPT)

    def _forget_closed(self, keep: int) -> None:
        closed = [key for key, c in self._consumers.items() if c.streams <= 0]
        for key in closed[: max(0, len(closed) - keep)]:  # oldest first: dicts keep insertion order
            del self._consumers[key]

    async def _whole_groups(self, after: int, size: int, view: View, agent: str | None, envs: tuple[str, ...]
                            ) -> tuple[list[Trajectory], int]:
        groups = await self.store.finished_groups(after, max(1, size // 2), agent=agent, envs=envs,
                                                   streamed=True)
        picked: list[FinishedGroup] = []
        total = 0
        for g in groups:  # whole groups only: stop before one would overflow the batch (but take at least one)
            if picked and total + g.size > size:
                break
            picked.append(g)
            total += g.size
        if not picked:
            return [], after
        trajectories = await self.store.group_trajectories([g.id for g in picked], view)
        return trajectories, picked[-1].done_seq

    @staticmethod
    def _start_clock(state: _Consumer) -> None:
        if state.waiting_since is None:
            state.waiting_since = time.monotonic()

    async def ack(self, consumer: str, up_to: int, *, whole_groups: bool) -> int:
        """Move ``consumer``'s cursor (never backwards); returns it. Refused past the end of the stream."""
        kind = GROUPS if whole_groups else TRAJECTORIES
        cursor = await self.store.ack(consumer, kind, up_to)
        state = self._consumers.get((consumer, kind))
        if state is not None:
            # Acked all it was sent: it waits on nobody. Acked part of it: it is moving, so its clock restarts.
            state.waiting_since = None if cursor >= state.asked_up_to else time.monotonic()
            if state.streams <= 0 and state.waiting_since is None:
                del self._consumers[(consumer, kind)]
        return cursor

    # -- what operators see -----------------------------------------------------------------------

    def open_streams(self) -> int:
        return sum(c.streams for c in self._consumers.values())

    async def status(self, limit: int = 200) -> list[ConsumerStatus]:
        """Consumers: every one streaming now and the ``limit`` that acked last (names come from clients, so
        there may be any number), each with its cursor, how many stored trajectories it has not taken
        (``lag``), its open streams, and whether it is ``consuming``, ``stalled`` or ``closed``."""
        now = time.monotonic()
        stored = await self.store.last_seq()
        out: list[ConsumerStatus] = []
        rows = await self.store.consumers(limit)
        listed = {(r.name, r.kind) for r in rows}
        rows += [r for key in self._consumers if key not in listed
                 for r in await self.store.consumers_named(*key)]
        for row in rows:
            key = (row.name, row.kind)
            state = self._consumers.get(key, _Consumer())
            if state.streams <= 0:
                condition = "closed"
            elif state.waiting_since is not None and now - state.waiting_since > self.stall_s:
                condition = "stalled"
            else:
                condition = "consuming"
            out.append(ConsumerStatus(
                name=row.name, whole_groups=row.kind == GROUPS, cursor=row.acked,
                lag=stored - await self.store.consumed(row.kind, row.acked), streams=state.streams,
                state=condition, acked_at=row.updated_at, staleness=state.staleness))
        known = {(c.name, GROUPS if c.whole_groups else TRAJECTORIES) for c in out}
        for (name, kind), state in self._consumers.items():  # streaming, but never acked yet
            if (name, kind) not in known and state.streams > 0:
                stalled = state.waiting_since is not None and now - state.waiting_since > self.stall_s
                out.append(ConsumerStatus(name=name, whole_groups=kind == GROUPS, cursor=0, lag=stored,
                                          streams=state.streams, state="stalled" if stalled else "consuming",
                                          acked_at=None, staleness=state.staleness))
        return sorted(out, key=lambda c: (c.name, c.whole_groups))


def _fresh(trajectories: list[Trajectory], stale: Callable[[int], bool], whole_groups: bool) -> list[Trajectory]:
    """Trajectories whose policy version is not ``stale``; with ``whole_groups``, whole groups whose every
    attempt is not (a group's jobs may be leased under different versions: it is kept or passed over as one)."""
    stale_versions = {v for v in {t.policy_version for t in trajectories} if stale(v)}
    if not whole_groups:
        return [t for t in trajectories if t.policy_version not in stale_versions]
    stale_groups = {t.group_id for t in trajectories if t.policy_version in stale_versions}
    return [t for t in trajectories if t.group_id not in stale_groups]
