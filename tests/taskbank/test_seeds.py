"""The seeds the task bank hands out: a keyed permutation of each environment's and level's counter, so
production's seeds are neither small integers nor anything a contributor can compute, and intake draws the
seeds it checks on from the same sequence."""

from __future__ import annotations

import random

import pytest

from farmd.taskbank import CHECK_HORIZON, SEED_SPACE, SeedSequence, TaskBank
from farmd.verifier import VerifierKey

KEY = VerifierKey(b"seed-sequence-test-key-32-bytes!")
ENV = "contrib:word-count@1.0.0"


def test_the_sequence_is_a_permutation_of_the_seed_space_that_the_key_decides() -> None:
    seeds = SeedSequence.keyed(KEY.seed)
    first = [seeds.nth(ENV, 1, n) for n in range(5000)]
    assert len(set(first)) == len(first) and all(0 <= s < SEED_SPACE for s in first), "never twice, always a seed"
    assert [seeds.index(ENV, 1, s) for s in first[:500]] == list(range(500)), "it inverts"
    # Spread over the whole space like random draws: no small integers, no order.
    assert min(first) > SEED_SPACE // 100_000 and first != sorted(first)
    assert sum(s < SEED_SPACE // 2 for s in first) == pytest.approx(2500, abs=200)
    other_key = SeedSequence.keyed(VerifierKey(b"another-farm-another-key-32bytes").seed)
    assert [other_key.nth(ENV, 1, n) for n in range(50)] != first[:50], "another farm, other seeds"
    assert [seeds.nth(ENV, 2, n) for n in range(50)] != first[:50], "another level, other seeds"
    assert [seeds.nth("contrib:word-count@1.0.1", 1, n) for n in range(50)] != first[:50], "another version too"
    with pytest.raises(ValueError):
        seeds.nth(ENV, 1, SEED_SPACE)
    assert SeedSequence().nth(ENV, 1, 7) == 7, "without a key: the counter itself (the bank's own tests)"


def test_the_bank_hands_out_the_keyed_sequence_and_a_check_draws_from_what_it_will_hand_out() -> None:
    seeds = SeedSequence.keyed(KEY.seed)
    bank = TaskBank({ENV: 3}, seeds=seeds)
    served = [k.seed for _ in range(10) for k in bank.sample(ENV, 4, random.Random(1))]
    assert served == [seeds.nth(ENV, 1, n) for n in range(40)], "production: the sequence in order"
    assert all(s >= 1 << 16 for s in served), "no small integers a verifier could pass on"
    # Restored from its saved state, it carries on where it was: never a seed twice.
    again = TaskBank.from_json(bank.to_json(), {ENV: 3}, seeds=seeds)
    assert [k.seed for k in again.sample(ENV, 2, random.Random(1))] == [seeds.nth(ENV, 1, n) for n in (40, 41)]
    # A check's seed is production's n-th for an n production reaches: the same distribution, the same seeds.
    rng = random.Random(2)
    checked = [seeds.nth(ENV, 1, rng.randrange(CHECK_HORIZON)) for _ in range(200)]
    assert all(seeds.index(ENV, 1, s) < CHECK_HORIZON for s in checked)
