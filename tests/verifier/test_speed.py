"""The speed statistic: parity when the two sides cannot be told apart, credit when they clearly can."""

from __future__ import annotations

import math
import random

import pytest

from farmd.verifier.speed import log_ratios, paired_speed, sign_test_rank


def noisy(base: float, n: int, rng: random.Random, spread: float = 0.15) -> list[float]:
    """``n`` timings around ``base``: log-normal noise, as on a shared machine."""
    return [base * math.exp(rng.gauss(0.0, spread)) for _ in range(n)]


def test_equal_samples_are_parity() -> None:
    times = [1e-3, 1.2e-3, 0.9e-3, 1.1e-3] * 3
    speed = paired_speed(times, list(times))
    assert speed.credited == 1.0 and speed.ratio == 1.0 and not speed.significant
    assert speed.low == pytest.approx(1.0) and speed.high == pytest.approx(1.0)  # no difference at all: not credited


def test_the_same_kernel_timed_twice_is_parity_in_almost_every_run() -> None:
    """Equal kernels under noise: credit (a speedup other than 1) comes only by chance, about 5% of
    runs at 95% confidence, and then stays close to 1."""
    rng = random.Random(1)
    runs = [paired_speed(noisy(1e-3, 12, rng), noisy(1e-3, 12, rng)) for _ in range(400)]
    credited = [r for r in runs if r.credited != 1.0]
    assert len(credited) <= 0.06 * len(runs)
    assert all(0.8 < r.credited < 1.25 for r in runs)


def test_a_clear_difference_is_credited_as_measured() -> None:
    rng = random.Random(2)
    faster = paired_speed(noisy(2e-3, 12, rng), noisy(1e-3, 12, rng))
    assert faster.significant and faster.low > 1.0
    assert faster.credited == faster.ratio == pytest.approx(2.0, rel=0.15)
    slower = paired_speed(noisy(1e-3, 12, rng), noisy(2e-3, 12, rng))
    assert slower.significant and slower.high < 1.0
    assert slower.credited == pytest.approx(0.5, rel=0.15)


def test_stalled_rounds_do_not_move_it() -> None:
    """Three rounds of twelve in which the submission was stalled tenfold (a neighbour's burst): still parity."""
    rng = random.Random(3)
    ref, sub = noisy(1e-3, 12, rng, 0.05), noisy(1e-3, 12, rng, 0.05)
    for i in (2, 5, 9):
        sub[i] *= 10
    speed = paired_speed(ref, sub)
    assert speed.credited == 1.0 and 0.9 < speed.ratio < 1.1


def test_the_overhead_comes_off_both_sides() -> None:
    """Calls that cost 1 ms besides the function: 3 ms against 2 ms is a function twice as fast."""
    ref, sub = [3e-3] * 12, [2e-3] * 12
    assert paired_speed(ref, sub).credited == pytest.approx(1.5)
    assert paired_speed(ref, sub, overhead_s=1e-3).credited == pytest.approx(2.0)
    # Net of the overhead, a time below the floor counts as the floor: noise, not an infinite speedup.
    assert paired_speed(ref, [0.5e-3] * 12, overhead_s=1e-3, floor_s=0.1e-3).credited == pytest.approx(20.0)


def test_too_few_rounds_are_never_significant() -> None:
    assert sign_test_rank(5, 0.95) == 0  # 2 / 2**5 > 5%: not even all five on one side is enough
    assert sign_test_rank(6, 0.95) == 1
    assert sign_test_rank(12, 0.95) == 3
    assert sign_test_rank(16, 0.95) == 4
    speed = paired_speed([2e-3] * 5, [1e-3] * 5)
    assert speed.credited == 1.0 and speed.ratio == pytest.approx(2.0) and speed.high == math.inf
    assert paired_speed([], []).credited == 1.0


def test_the_interval_covers_as_promised() -> None:
    """The sign test's interval holds the true median speedup in at least 95% of runs, skewed noise or not."""
    rng = random.Random(4)
    covered = 0
    for _ in range(400):
        ref = [1.5e-3 * (1 + rng.expovariate(4.0)) for _ in range(12)]  # heavy right tail
        sub = [1e-3 * (1 + rng.expovariate(4.0)) for _ in range(12)]
        speed = paired_speed(ref, sub)
        covered += speed.low <= 1.5 <= speed.high
    assert covered >= 0.93 * 400


def test_rounds_are_paired() -> None:
    with pytest.raises(ValueError):
        log_ratios([1.0, 2.0], [1.0], 0.0, 1e-9)
