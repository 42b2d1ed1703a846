"""Batches cut as atroposlib 0.4.0 cuts them: whole groups, packs of the largest size, exact batch sizes,
environments' minimum shares, and buffers of odd-sized groups that join the queue once they add up."""

from __future__ import annotations

from farmd.atropos.batching import EnvShare, Queued, batch_with_shares, exact_batch, filling


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
