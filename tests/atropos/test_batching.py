"""Batches cut as atroposlib 0.4.0 cuts them: whole groups, packs of the largest size, exact batch sizes,
environments' minimum shares, and buffers of odd-sized groups that join the queue once they add up."""

from __future__ import annotations

import random
import time

from farmd.atropos.batching import EnvShare, Queued, batch_with_shares, cut_all, exact_batch, filling


def q(*sizes: int, env: int | None = None) -> list[Queued]:
    return [Queued(size, env) for size in sizes]


def test_a_buffer_fills_in_arrival_order_when_it_can_and_by_any_exact_sum_when_not() -> None:
    assert filling([2, 2, 4], 4) == [0, 1]
    assert filling([3, 2, 2], 4) == [1, 2], "the greedy pass takes 3 and then nothing fits: any exact sum"
    assert filling([3, 3], 4) == []
    assert filling([], 4) == []
    assert filling([5, 1, 3], 4) == [1, 2]


def test_a_batch_is_whole_packs_of_the_largest_group_size_in_the_order_they_completed() -> None:
    assert exact_batch(q(4, 4, 4), 8) == [0, 1]
    assert exact_batch(q(2, 4, 2, 4), 8) == [1, 0, 2], "the 2s pack when the second arrives, after the first 4"
    assert exact_batch(q(4, 4), 12) is None, "not enough sequences"
    assert exact_batch(q(3, 4, 3, 3), 8) is None, "3s never add up to 4: they never pack"
    assert exact_batch(q(8, 4), 4) is None, "the pack of 4s is still half open"
    assert exact_batch(q(), 4) is None


def test_minimum_shares_are_filled_first_then_the_rest_in_queue_order() -> None:
    queue = q(4, 4, 4, env=0) + q(4, 4, env=1)
    shares = [EnvShare(0, True, None), EnvShare(1, True, 0.5)]
    assert batch_with_shares(queue, 8, shares) == [3, 0], "env 1's half first, then the queue in order"
    assert batch_with_shares(queue, 12, shares) == [3, 4, 0], "half of 12 is 6: two of env 1's groups"
    assert batch_with_shares(q(4, env=0), 4, [EnvShare(1, True, 0.5)]) is None, "env 1 has nothing queued"
    disconnected = [EnvShare(1, False, 0.5)]
    assert batch_with_shares(queue, 8, disconnected) == [0, 1], "a disconnected env's share does not count"
    unnamed = q(4, 4) + q(4, env=1)
    assert batch_with_shares(unnamed, 8, shares) is None, "groups that name no env are never taken then"


def test_shares_over_the_whole_batch_are_scaled_down_keeping_a_group_each() -> None:
    queue = q(2, 2, 2, 2, env=0) + q(2, 2, 2, 2, env=1)
    shares = [EnvShare(0, True, 0.75), EnvShare(1, True, 0.75)]
    taken = batch_with_shares(queue, 4, shares)
    assert taken is not None and sorted(taken) == [0, 4], "one group from each"


def one_at_a_time(queue: list[Queued], batch_size: int, envs: list[EnvShare]) -> list[list[int]]:
    """The batches the single-batch rules cut, the queue shortened after each: what ``cut_all`` must give."""
    left = list(range(len(queue)))
    with_shares = any(e.min_batch_allocation is not None for e in envs)
    out = []
    while True:
        current = [queue[i] for i in left]
        positions = batch_with_shares(current, batch_size, envs) if with_shares else exact_batch(current, batch_size)
        if positions is None:
            return out
        out.append([left[p] for p in positions])
        taken = set(positions)
        left = [x for j, x in enumerate(left) if j not in taken]


def test_cutting_every_batch_at_once_is_cutting_them_one_at_a_time() -> None:
    rng = random.Random(23)
    for case in range(4000):
        sizes = rng.choice([[1, 2, 4, 8], [1, 2, 3, 4, 6, 12], [2, 4, 8, 16], [1, 3, 5]])
        queue = [Queued(rng.choice(sizes), rng.choice([None, 0, 1, 2, 3]) if rng.random() < 0.7 else None)
                 for _ in range(rng.randrange(0, 80))]
        envs = [EnvShare(i, rng.random() < 0.8, rng.choice([None, None, 0.0, 0.1, 0.25, 0.5, 0.75, 1.0]))
                for i in range(rng.randrange(0, 4))]
        batch_size = rng.randrange(1, 48)
        assert cut_all(queue, batch_size, envs) == one_at_a_time(queue, batch_size, envs), (case, queue, envs,
                                                                                         batch_size)


def test_a_deep_queue_cut_into_batches_of_one_group_takes_time_linear_in_it() -> None:
    """50,000 groups of 2 and a batch of 2: a batch per group. Cut from the top each time, that was 50,000 passes
    over the queue (about 10^9 steps); kept as packs between batches it is a pass and a heap."""
    queue = [Queued(2, i % 3) for i in range(50_000)]
    for envs in ([], [EnvShare(0, True, 0.5)]):
        started = time.monotonic()
        batches = cut_all(queue, 2, envs)
        took = time.monotonic() - started
        assert len(batches) == (50_000 if not envs else 16_667), "with a share, until env 0 has no group left"
        assert took < 10, f"cutting took {took:.1f} s"
