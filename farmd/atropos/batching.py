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
    combination: the one a subset-sum table finds walking back from the newest group.
    """
    chosen, total = [], 0
    for i, size in enumerate(sizes):
        if total + size <= target:
            chosen.append(i)
            total += size
            if total == target:
                return chosen
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
