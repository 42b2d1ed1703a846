"""How much faster one function is than another, from paired timings, and whether that is known.

A kernel's speed reward compares the submission with the reference on the same
machine, in the same box, on the same inputs: in each *round* both answer one
fresh input, one right after the other (the order alternates from round to
round). Timings on a shared machine are noisy, heavy-tailed and drift, so:

- each round gives one number, the log of the reference's time over the
  submission's (each net of the call's own overhead): whatever slowed the whole
  round down cancels out;
- the estimate is the median of those numbers, which a few stalled rounds do not move;
- its confidence interval is the sign test's: order statistics whose coverage is
  exact for any distribution symmetric or not (only independence across rounds
  is assumed);
- speed is *credited* only when that interval leaves out parity. A kernel no one
  can tell apart from the reference is at parity (speedup exactly 1.0), not at
  whatever the noise of one run said.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Speed:
    """The submission's speed relative to the reference (above 1: faster)."""

    ratio: float
    """Median over rounds of reference time / submission time (1.0 when there are no rounds)."""
    low: float
    high: float
    """The interval for that median (``0`` and ``inf`` when the rounds are too few to bound it)."""
    credited: float
    """``ratio`` when the interval leaves out 1.0, else exactly 1.0."""
    rounds: int

    @property
    def significant(self) -> bool:
        return self.low > 1.0 or self.high < 1.0


def sign_test_rank(n: int, confidence: float) -> int:
    """The largest k such that [x_(k), x_(n+1-k)] (1-based order statistics of n samples) covers the
    median with probability at least ``confidence``; 0 when not even [x_(1), x_(n)] does."""
    alpha = 1.0 - confidence
    tail = 0.0  # P(Bin(n, 1/2) <= k - 1)
    k = 0
    while k < n // 2:
        tail += math.comb(n, k) / 2.0**n
        if 2 * tail > alpha:
            break
        k += 1
    return k


def log_ratios(ref_s: Sequence[float], sub_s: Sequence[float], overhead_s: float, floor_s: float) -> list[float]:
    """Per round, log(reference time / submission time), each net of ``overhead_s`` and no less than
    ``floor_s`` (below which a time net of its overhead is noise)."""
    if len(ref_s) != len(sub_s):
        raise ValueError("the rounds are paired: as many reference times as submission times")
    return [math.log(max(r - overhead_s, floor_s)) - math.log(max(s - overhead_s, floor_s))
            for r, s in zip(ref_s, sub_s, strict=True)]


def paired_speed(ref_s: Sequence[float], sub_s: Sequence[float], *, overhead_s: float = 0.0,
                 floor_s: float = 1e-9, confidence: float = 0.95) -> Speed:
    """The speed of the submission from paired rounds (``ref_s[i]`` and ``sub_s[i]`` timed on one input)."""
    logs = sorted(log_ratios(ref_s, sub_s, overhead_s, floor_s))
    n = len(logs)
    if n == 0:
        return Speed(ratio=1.0, low=0.0, high=math.inf, credited=1.0, rounds=0)
    mid = n // 2
    median = logs[mid] if n % 2 else (logs[mid - 1] + logs[mid]) / 2
    k = sign_test_rank(n, confidence)
    low, high = (math.exp(logs[k - 1]), math.exp(logs[n - k])) if k else (0.0, math.inf)
    ratio = math.exp(median)
    credited = ratio if (low > 1.0 or high < 1.0) else 1.0
    return Speed(ratio=ratio, low=low, high=high, credited=credited, rounds=n)
