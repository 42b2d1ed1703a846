"""How an Atropos trainer's batches are cut from the queue of scored groups, as atroposlib 0.4.0 cuts them.

A drop-in server must hand a trainer exactly the batches Atropos's own would: the same groups, in the same
order, under the same conditions. The rules (learned from atroposlib's ``api/utils.py``, written here
in farm's words):

- A batch holds exactly ``batch_size`` sequences, made of whole groups.
- Groups are packed first: a group of the largest size in the queue is a pack by itself; smaller groups
  of one size become a pack once enough of them (in queue order) add up to exactly the largest size.
  A size that never adds up to it exactly never packs, and waits.
- A batch takes whole packs in the order they completed, until it holds ``batch_size`` sequences.
- With minimum allocations (an environment asking for a share of every batch), each such environment's
  packs (counted within that environment) fill its share first, then packs of any environment fill the
  rest in queue order; groups that name no environment are then never taken.
- A group pushed with a size other than its environment's registered one waits in that environment's
  buffer until some of the buffered groups add up to the registered size exactly; those then join the
  queue (first in, first chosen, when several combinations would do).

Everything here is pure: sizes in, positions out. The queue's durability is ``farmd.atropos.queue``'s.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Queued:
    """One queued group as batching sees it: how many sequences, and the environment that pushed it."""

    size: int
    env_id: int | None = None


@dataclass(frozen=True)
class EnvShare:
    """A registered environment's claim on every batch."""

    env_id: int
    connected: bool
    min_batch_allocation: float | None


def filling(sizes: Sequence[int], target: int) -> list[int]:
    """Positions of buffered groups whose sizes add up to ``target`` exactly; [] when none do.

    Greedy in arrival order first (each group taken if it still fits). Failing that, any exact
    combination: the one a subset-sum table finds walking back from the newest group. The table is as wide as
    the buffer's sequences, never the target (``AtroposQueue`` bounds a buffer: ``MAX_BUFFERED_*``).
    """
    chosen, total = [], 0
    for i, size in enumerate(sizes):
        if total + size <= target:
            chosen.append(i)
            total += size
            if total == target:
                return chosen
    # No exact sum can exceed what the buffer holds, nor miss a common divisor: a target declared in the
    # billions, or odd against even sizes, is answered here, not by a table of the target's width.
    if sum(sizes) < target or target % math.gcd(*sizes):
        return []
    # reachable[i]: the sums the first i groups can make, as a bit set (bit s: sum s).
    full = (1 << (target + 1)) - 1
    reachable = [1]
    for size in sizes:
        reachable.append((reachable[-1] | (reachable[-1] << size)) & full)
    if not reachable[-1] >> target & 1:
        return []
    picked, remaining = [], target
    for i in range(len(sizes), 0, -1):
        size = sizes[i - 1]
        if size <= remaining and reachable[i - 1] >> (remaining - size) & 1:
            picked.append(i - 1)
            remaining -= size
    return sorted(picked)


def _packs(queue: Sequence[Queued], largest: int, keyed_by_env: bool) -> dict[int | None, list[int]]:
    """Positions of packable groups, in the order their packs completed; by environment when
    ``keyed_by_env`` (groups naming none are left out), else all under None."""
    waiting: dict[tuple[int | None, int], list[int]] = {}
    packed: dict[int | None, list[int]] = {}
    for i, group in enumerate(queue):
        if keyed_by_env and group.env_id is None:
            continue
        env = group.env_id if keyed_by_env else None
        if keyed_by_env:
            packed.setdefault(env, [])
        pending = waiting.setdefault((env, group.size), [])
        pending.append(i)
        if len(pending) * group.size == largest:
            packed.setdefault(env, []).extend(pending)
            pending.clear()
    return packed


def exact_batch(queue: Sequence[Queued], batch_size: int) -> list[int] | None:
    """Positions of the groups making the next batch of exactly ``batch_size`` sequences, or None."""
    if not queue or sum(g.size for g in queue) < batch_size:
        return None
    packable = _packs(queue, max(g.size for g in queue), keyed_by_env=False).get(None, [])
    taken, total = [], 0
    for i in packable:
        taken.append(i)
        total += queue[i].size
        if total >= batch_size:
            break
    return taken if total == batch_size else None


def batch_with_shares(queue: Sequence[Queued], batch_size: int, envs: Sequence[EnvShare]) -> list[int] | None:
    """``exact_batch``, with each connected environment's minimum share of the batch filled first."""
    if not queue:
        return None
    shares = {e.env_id: e.min_batch_allocation for e in envs if e.connected and e.min_batch_allocation is not None}
    if not shares:
        return exact_batch(queue, batch_size)
    by_env = _packs(queue, max(g.size for g in queue), keyed_by_env=True)
    wanted: dict[int, int] = {}
    for env_id, share in shares.items():
        least = int(batch_size * share)
        if least <= 0:
            continue
        if not by_env.get(env_id):  # nothing queued, or nothing packable yet: its share cannot be met
            return None
        wanted[env_id] = least
    asked = sum(wanted.values())
    if asked > batch_size:  # shares over the whole batch: scaled down, each keeping at least a group
        for env_id in wanted:
            smallest = min(queue[i].size for i in by_env[env_id])
            wanted[env_id] = max(smallest, int(wanted[env_id] * batch_size / asked))
    taken: list[int] = []
    total = 0
    for env_id, least in wanted.items():
        got = 0
        for i in by_env[env_id]:
            if got >= least:
                break
            if total + queue[i].size <= batch_size:
                taken.append(i)
                got += queue[i].size
                total += queue[i].size
    if total < batch_size:
        packable = {i for positions in by_env.values() for i in positions}
        chosen = set(taken)
        for i in range(len(queue)):
            if i in chosen or i not in packable:
                continue
            if total + queue[i].size <= batch_size:
                taken.append(i)
                total += queue[i].size
            if total == batch_size:
                break
    return taken if total == batch_size else None


def cut_all(queue: Sequence[Queued], batch_size: int, envs: Sequence[EnvShare] = ()) -> list[list[int]]:
    """Every batch the queue makes now, in the order they are cut: what ``exact_batch`` (or, with a connected
    environment's share, ``batch_with_shares``) gives applied to the queue, the batch taken out, and again until
    none is made. Positions are in ``queue``, each batch's in the order it took them.

    Cutting batch after batch from the top costs the queue's length per batch: a deep queue and a batch of a
    few sequences made that tens of thousands of times the queue. Here the packs are kept between batches: a
    batch takes a prefix of each (environment, size) class's groups, so each class is its groups and how many
    of them are gone, a pack is its next ``largest // size`` groups, and the next pack to complete is a heap's
    top. Without shares the work is about the queue's length (times a log); with shares, each batch also
    looks once at each class (environment and group size) still queued.
    """
    if batch_size < 1 or not queue:
        return []
    if any(e.connected and e.min_batch_allocation is not None for e in envs):
        return _cut_with_shares(queue, batch_size, envs)
    return _cut_exact(queue, batch_size)


class _Classes:
    """The queue's groups by class (environment or None, size), in queue order, and how many of each are gone."""

    def __init__(self, queue: Sequence[Queued], keyed_by_env: bool) -> None:
        self.members: dict[tuple[int | None, int], list[int]] = {}
        self.left: dict[int, int] = {}
        """Groups left of each size, every group counted (the largest size is over all of them)."""
        for i, group in enumerate(queue):
            self.left[group.size] = self.left.get(group.size, 0) + 1
            if keyed_by_env and group.env_id is None:
                continue  # never packed, never taken: it still counts for the largest size
            self.members.setdefault((group.env_id if keyed_by_env else None, group.size), []).append(i)
        self.gone = dict.fromkeys(self.members, 0)

    def largest(self) -> int:
        return max((size for size, n in self.left.items() if n), default=0)

    def take(self, key: tuple[int | None, int], n: int) -> None:
        self.gone[key] += n
        self.left[key[1]] -= n

    def completes(self, key: tuple[int | None, int], largest: int, chunk: int = 0) -> int | None:
        """The queue position at which pack ``chunk`` (from the first group left) of ``key`` completes."""
        size = key[1]
        if largest % size:
            return None  # a size that never adds up to the largest never packs
        last = self.gone[key] + (chunk + 1) * (largest // size) - 1
        members = self.members[key]
        return members[last] if last < len(members) else None


def _cut_exact(queue: Sequence[Queued], batch_size: int) -> list[list[int]]:
    classes = _Classes(queue, keyed_by_env=False)
    sequences = sum(g.size for g in queue)
    batches: list[list[int]] = []
    largest = 0
    heap: list[tuple[int, tuple[int | None, int]]] = []
    while sequences >= batch_size:
        if not largest or not classes.left.get(largest):
            largest = classes.largest()
            heap = [(at, key) for key in classes.members if (at := classes.completes(key, largest)) is not None]
            heapq.heapify(heap)
        taken: list[int] = []
        total = 0
        while total < batch_size and heap:
            _, key = heapq.heappop(heap)
            members, start = classes.members[key], classes.gone[key]
            used = 0
            for i in members[start:start + largest // key[1]]:
                taken.append(i)
                used += 1
                total += key[1]
                if total >= batch_size:
                    break
            classes.take(key, used)
            sequences -= used * key[1]
            if (at := classes.completes(key, largest)) is not None:
                heapq.heappush(heap, (at, key))
        if total != batch_size:
            break  # this batch is not made, and so no later one is
        batches.append(taken)
    return batches


def _cut_with_shares(queue: Sequence[Queued], batch_size: int, envs: Sequence[EnvShare]) -> list[list[int]]:
    classes = _Classes(queue, keyed_by_env=True)
    shares = {e.env_id: e.min_batch_allocation for e in envs if e.connected and e.min_batch_allocation is not None}
    batches: list[list[int]] = []
    while True:
        largest = classes.largest()
        packs = {key: (len(classes.members[key]) - classes.gone[key]) // (largest // key[1])
                 for key in classes.members if largest and not largest % key[1]}
        packs = {key: n for key, n in packs.items() if n}
        by_env: dict[int | None, list[tuple[int | None, int]]] = {}
        for key in packs:
            by_env.setdefault(key[0], []).append(key)
        wanted: dict[int, int] = {}
        for env_id, share in shares.items():
            least = int(batch_size * share)
            if least <= 0:
                continue
            if not by_env.get(env_id):
                return batches
            wanted[env_id] = least
        asked = sum(wanted.values())
        if asked > batch_size:
            for env_id in wanted:
                smallest = min(key[1] for key in by_env[env_id])
                wanted[env_id] = max(smallest, int(wanted[env_id] * batch_size / asked))
        taken: list[int] = []
        took: dict[tuple[int | None, int], int] = {}
        total = 0
        for env_id, least in wanted.items():  # each share from its environment's packs, in the order they completed
            got = 0
            heap = [(classes.completes(key, largest), 0, key) for key in by_env[env_id]]
            heapq.heapify(heap)
            while heap and got < least:
                _, chunk, key = heapq.heappop(heap)
                size, k = key[1], largest // key[1]
                start = classes.gone[key] + chunk * k
                fits = True
                for i in classes.members[key][start:start + k]:
                    if got >= least:
                        break
                    if total + size > batch_size:
                        fits = False  # nor will any later group of its class: the total only grows
                        break
                    taken.append(i)
                    took[key] = took.get(key, 0) + 1
                    got += size
                    total += size
                if fits and chunk + 1 < packs[key]:
                    heapq.heappush(heap, (classes.completes(key, largest, chunk + 1), chunk + 1, key))
        # Then the rest in queue order: every packable group not taken yet that still fits.
        rest = []
        for key, n in packs.items():
            first = classes.gone[key] + took.get(key, 0)
            if first < classes.gone[key] + n * (largest // key[1]):
                rest.append((classes.members[key][first], key))
        heapq.heapify(rest)
        while rest and total < batch_size:
            i, key = heapq.heappop(rest)
            if total + key[1] > batch_size:
                continue  # nor will its class's later groups
            taken.append(i)
            took[key] = took.get(key, 0) + 1
            total += key[1]
            nxt = classes.gone[key] + took[key]
            if nxt < classes.gone[key] + packs[key] * (largest // key[1]):
                heapq.heappush(rest, (classes.members[key][nxt], key))
        if total != batch_size:
            return batches
        for key, n in took.items():
            classes.take(key, n)
        batches.append(taken)
