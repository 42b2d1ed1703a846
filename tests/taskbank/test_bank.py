"""The task bank: forgetting posteriors, band sampling, re-checks, curriculum, persistence, and a simulated farm."""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import time
from collections.abc import Callable

import pytest

from farmd.taskbank import SCHEMA_VERSION, BankConfig, BetaModel, Posterior, TaskBank, TaskBankError, TaskKey

ONLY_BAND = BankConfig(explore_share=0.0, recheck_share=0.0, resample_after=0)
"""Sampling with no fresh seeds, no re-checks and no cool-down: band picks, then fresh seeds to fill."""


def group(passes: int, n: int = 8) -> list[float]:
    return [1.0] * passes + [0.0] * (n - passes)


def seeds(keys: list[TaskKey]) -> list[int]:
    return [k.seed for k in keys]


# -- the posterior ------------------------------------------------------------------------------------


def test_posterior_counts_passes_and_fails() -> None:
    model = BetaModel(1.0, 1.0, keep_per_version=0.5)
    post = model.update(model.fresh(0), passes=3, fails=5, version=0)
    assert post == Posterior(4.0, 6.0, 0)
    assert post.mean == pytest.approx(0.4)
    assert model.evidence(post) == pytest.approx(8.0)
    # An unknown task is worth less than one known to sit at 1/2, more than one known to be easy.
    assert model.fresh(0).reward_variance == pytest.approx(1 / 6)
    assert model.update(model.fresh(0), 500, 500, 0).reward_variance == pytest.approx(0.25, abs=1e-3)
    assert model.update(model.fresh(0), 8, 0, 0).reward_variance < 1 / 6


def test_evidence_fades_with_the_version_gap_and_keeps_the_estimate() -> None:
    model = BetaModel(1.0, 1.0, keep_per_version=0.5)
    post = Posterior(4.0, 6.0, 0)
    faded = model.at(post, 2)
    assert faded.version == 2
    assert model.evidence(faded) == pytest.approx(8.0 * 0.25)
    assert faded.mean == pytest.approx(0.4)
    # Reading under an older (or the same) version never sharpens.
    assert model.at(faded, 1) is faded and model.at(post, 0) is post
    # A group of a newer version fades the old evidence first, then counts in full.
    after = model.update(post, passes=2, fails=0, version=2)
    assert (after.alpha, after.beta, after.version) == pytest.approx((faded.alpha + 2, faded.beta, 2))
    # A late group, leased before the policy moved, counts at its faded weight and does not rewind.
    late = model.update(after, passes=1, fails=1, version=1)
    assert (late.alpha, late.beta, late.version) == pytest.approx((after.alpha + 0.5, after.beta + 0.5, 2))
    # keep 1: nothing is forgotten.
    assert BetaModel(1.0, 1.0, 1.0).at(post, 50) == Posterior(4.0, 6.0, 50)


def test_bank_posterior_reads_at_the_newest_version() -> None:
    bank = TaskBank({"e": 3}, BankConfig(keep_per_version=0.5, pass_threshold=0.5))
    key = TaskKey("e", 7, 2)
    assert bank.posterior(key) is None
    # Graded rewards (kernel speedups): at or above the threshold is a pass.
    bank.observe(key, [0.5, 0.49, 1.0, 0.0], policy_version=3)
    assert bank.posterior(key) == Posterior(3.0, 3.0, 3)
    bank.set_policy_version(4)
    bank.set_policy_version(2)  # versions only move forward
    assert bank.policy_version == 4
    post = bank.posterior(key)
    assert post is not None and post.version == 4 and post.alpha + post.beta == pytest.approx(2 + 4 * 0.5)


def test_bad_input_is_refused() -> None:
    bank = TaskBank({"e": 3})
    with pytest.raises(TaskBankError, match="does not serve 'nope'"):
        bank.sample("nope", 1, random.Random(0))
    for key, rewards, version in [
        (TaskKey("e", 0, 4), [1.0], 0),
        (TaskKey("e", 0, 0), [1.0], 0),
        (TaskKey("e", 0, 1), [], 0),
        (TaskKey("e", 0, 1), [1.5], 0),
        (TaskKey("e", 0, 1), [math.nan], 0),
        (TaskKey("e", 0, 1), [1.0], -1),
        (TaskKey("x", 0, 1), [1.0], 0),
    ]:
        with pytest.raises(TaskBankError):
            bank.observe(key, rewards, version)
    assert bank.status().totals.groups == 0
    for bad in [dict(band_low=0.9, band_high=0.1), dict(explore_share=0.9, recheck_share=0.2),
                dict(keep_per_version=0.0), dict(prior_alpha=0.0), dict(max_tasks_per_env=0),
                dict(floor_pass_rate=0.9), dict(resample_after=-1)]:
        with pytest.raises(TaskBankError):
            BankConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(TaskBankError):
        TaskBank({"e": 0})


# -- sampling -------------------------------------------------------------------------------------------


def test_fresh_seeds_are_handed_out_once_per_level() -> None:
    bank = TaskBank({"e": 3, "f": 2})
    rng = random.Random(0)
    first, second = bank.sample("e", 5, rng), bank.sample("e", 3, rng)
    assert first + second == [TaskKey("e", s, 1) for s in range(8)]
    assert bank.sample("f", 2, rng) == [TaskKey("f", 0, 1), TaskKey("f", 1, 1)]
    assert bank.sample("e", 0, rng) == []
    # A task that reached the bank another way is not handed out as fresh.
    bank.observe(TaskKey("e", 20, 1), group(8), 0)
    assert seeds(bank.sample("e", 2, rng)) == [21, 22]


def test_band_tasks_come_first_best_expected_variance_first() -> None:
    bank = TaskBank({"e": 3}, ONLY_BAND)
    for seed in range(4):
        bank.observe(TaskKey("e", seed, 1), group(4), 0)  # Beta(5, 5): E[p(1-p)] 0.227
    for seed in (4, 5):
        bank.observe(TaskKey("e", seed, 2), group(2), 0)  # Beta(3, 7): 0.191, still in the band
    for seed in (6, 7):
        bank.observe(TaskKey("e", seed, 1), group(8), 0)  # too easy
    for seed in (8, 9):
        bank.observe(TaskKey("e", seed, 1), group(0), 0)  # too hard
    rng = random.Random(1)
    assert set(seeds(bank.sample("e", 4, rng))) == {0, 1, 2, 3}
    picks = bank.sample("e", 6, rng)
    assert set(seeds(picks[:4])) == {0, 1, 2, 3} and set(seeds(picks[4:])) == {4, 5}
    picks = bank.sample("e", 8, rng)
    assert set(seeds(picks[:6])) == set(range(6))
    assert picks[6:] == [TaskKey("e", 10, 1), TaskKey("e", 11, 1)]  # fresh, past every seed it has seen
    assert len(set(bank.sample("e", 30, rng))) == 30


def test_a_task_handed_out_cools_down() -> None:
    bank = TaskBank({"e": 3}, BankConfig(explore_share=0.0, recheck_share=0.0, resample_after=4))
    bank.observe(TaskKey("e", 0, 1), group(4), 0)
    bank.observe(TaskKey("e", 1, 1), group(3), 0)
    rng = random.Random(0)
    got = [bank.sample("e", 1, rng)[0].seed for _ in range(8)]
    # Seed 0 may come back once four other tasks have been handed out.
    assert got == [0, 1, 2, 3, 4, 0, 1, 5]


def test_shares_hold_on_average_even_one_task_at_a_time() -> None:
    bank = TaskBank({"e": 3}, BankConfig(explore_share=0.25, recheck_share=0.0, resample_after=0))
    for seed in range(50):
        bank.observe(TaskKey("e", seed, 2), group(4), 0)
    rng = random.Random(3)
    fresh = sum(bank.sample("e", 1, rng)[0].seed >= 50 for _ in range(2000))
    assert 0.22 < fresh / 2000 < 0.28
    assert bank.status().envs["e"].fresh_share == pytest.approx(0.25, abs=0.06)


def test_retired_tasks_leave_the_band_and_are_rechecked_stalest_first() -> None:
    cfg = BankConfig(explore_share=0.0, recheck_share=0.5, resample_after=0)
    bank = TaskBank({"e": 3}, cfg)
    rng = random.Random(5)
    for seed in range(4):
        bank.observe(TaskKey("e", seed, 1), group(4), 10)
    bank.observe(TaskKey("e", 10, 1), group(8), 2)   # retired as too easy, long ago
    bank.observe(TaskKey("e", 11, 1), group(0), 6)   # retired as too hard
    bank.observe(TaskKey("e", 12, 1), group(8), 10)  # retired as too easy, just now
    status = bank.status().envs["e"]
    assert (status.in_band, status.easy, status.hard, status.retired) == (4, 2, 1, 3)

    # Half of each sample re-checks, stalest retirement first; no retired task is a band pick.
    picks = bank.sample("e", 4, rng)
    assert seeds(picks[2:]) == [10, 11] and set(seeds(picks[:2])) <= {0, 1, 2, 3}
    # The re-check shows task 10 has come back to the band.
    bank.observe(TaskKey("e", 10, 1), group(4), 11)
    bank.observe(TaskKey("e", 10, 1), group(5), 11)
    assert bank.status().envs["e"].in_band == 5
    assert seeds(bank.sample("e", 2, rng))[1:] == [11]

    # With no share for re-checks, a retired task is never handed out: fresh seeds fill in.
    only_band = TaskBank.from_json(bank.to_json(), {"e": 3}, ONLY_BAND)
    picks = only_band.sample("e", 8, rng)
    assert set(seeds(picks[:5])) == {0, 1, 2, 3, 10} and seeds(picks[5:]) == [13, 14, 15]


# -- curriculum -----------------------------------------------------------------------------------------


_unseen = itertools.count(10_000)


def play(bank: TaskBank, env: str, pass_rate: float, groups: int, rng: random.Random) -> None:
    """Run groups of unseen tasks at the current level, each attempt passing with ``pass_rate``."""
    for _ in range(groups):
        key = TaskKey(env, next(_unseen), bank.level(env))
        bank.observe(key, [float(rng.random() < pass_rate) for _ in range(8)], 0)


def test_level_moves_up_when_mastered_and_stops_at_the_top() -> None:
    cfg = BankConfig(level_min_groups=16, mastery_pass_rate=0.8)
    bank = TaskBank({"e": 3}, cfg)
    rng = random.Random(11)
    play(bank, "e", 0.95, 15, rng)
    assert bank.level("e") == 1  # not before level_min_groups
    play(bank, "e", 0.95, 1, rng)
    assert bank.level("e") == 2
    play(bank, "e", 0.95, 100, rng)
    assert bank.level("e") == 3
    fresh = [k for k in bank.sample("e", 50, rng) if bank.posterior(k) is None]
    assert fresh and {k.difficulty for k in fresh} == {3}


def test_max_level_holds_the_curriculum_and_uniform_draws_below_it() -> None:
    bank = TaskBank({"e": 5, "small": 1}, BankConfig(level_min_groups=4, mastery_pass_rate=0.8, max_level=2))
    rng = random.Random(13)
    play(bank, "e", 1.0, 200, rng)
    assert bank.level("e") == 2, "mastered level after level: the curriculum stops at max_level"
    assert {k.difficulty for k in bank.sample("e", 50, rng) if bank.posterior(k) is None} == {2}
    play(bank, "small", 1.0, 20, rng)
    assert bank.level("small") == 1, "an environment whose own top is lower keeps its own"
    saved = bank.to_json()
    saved["envs"]["e"]["level"] = 4  # saved under a higher cap (or none): restored at the cap
    assert TaskBank.from_json(saved, {"e": 5, "small": 1}, BankConfig(max_level=2)).level("e") == 2
    uniform = TaskBank({"e": 5}, BankConfig(sampling="uniform", max_level=3))
    assert {k.difficulty for k in uniform.sample("e", 300, rng)} == {1, 2, 3}
    with pytest.raises(TaskBankError, match="max_level"):
        BankConfig(max_level=-1)
    with pytest.raises(TaskBankError, match="above max_level"):
        BankConfig(start_level=3, max_level=2)


def test_level_moves_down_when_nothing_passes_and_stops_at_one() -> None:
    bank = TaskBank({"e": 5}, BankConfig(start_level=3, level_min_groups=10))
    rng = random.Random(12)
    assert bank.level("e") == 3
    play(bank, "e", 0.0, 10, rng)
    assert bank.level("e") == 2
    play(bank, "e", 0.0, 100, rng)
    assert bank.level("e") == 1


def test_level_holds_in_between_and_reads_only_fresh_tasks() -> None:
    bank = TaskBank({"e": 5}, BankConfig(start_level=2))
    rng = random.Random(13)
    play(bank, "e", 0.5, 200, rng)
    assert bank.level("e") == 2
    status = bank.status().envs["e"]
    assert status.level_pass_rate == pytest.approx(0.5, abs=0.15)
    # Known tasks come back because they are in the band; they say nothing of the level.
    known = [TaskKey("e", 1, 2), TaskKey("e", 2, 2)]
    for key in known:
        bank.observe(key, group(4), 0)
    counted = bank.status().envs["e"].level_groups
    for _ in range(100):
        bank.observe(known[0], group(8), 0)
        bank.observe(known[1], group(0), 0)
    assert bank.level("e") == 2 and bank.status().envs["e"].level_groups == counted
    # Nor do fresh tasks of another level (sampled before the level moved).
    for seed in range(100):
        bank.observe(TaskKey("e", 50_000 + seed, 1), group(8), 0)
    assert bank.level("e") == 2 and bank.status().envs["e"].level_groups == counted


# -- pool, status, persistence ---------------------------------------------------------------------------


def test_pool_is_bounded_and_forgets_retired_tasks_first() -> None:
    bank = TaskBank({"e": 3}, BankConfig(max_tasks_per_env=100))
    for seed in range(40):
        bank.observe(TaskKey("e", seed, 1), group(4), 0)
    for seed in range(40, 400):
        bank.observe(TaskKey("e", seed, 1), group(8 if seed % 2 else 0), 0)
        assert bank.status().envs["e"].tasks <= 100
    assert all(bank.posterior(TaskKey("e", seed, 1)) is not None for seed in range(40))
    assert bank.status().envs["e"].in_band == 40


def test_status_counts_band_occupancy_and_informative_groups() -> None:
    bank = TaskBank({"e": 3, "f": 3}, BankConfig(explore_share=0.0, recheck_share=0.5, resample_after=0))
    rng = random.Random(2)
    bank.observe(TaskKey("e", 0, 1), group(4), 0)
    bank.observe(TaskKey("e", 1, 1), group(8), 0)
    bank.observe(TaskKey("e", 2, 1), [0.3, 0.3], 0)  # graded and equal: not informative
    bank.observe(TaskKey("e", 3, 1), [0.3, 0.9], 0)  # graded and different: informative
    # Seeds 0, 2 (Beta(1, 3)) and 3 (Beta(2, 2)) are in the band; seed 1 is retired.
    assert seeds(bank.sample("e", 2, rng)) == [0, 1]  # one band pick, one re-check
    picks = bank.sample("e", 6, rng)  # three re-checks asked for, one to be had; two fresh to fill
    assert seeds(picks) == [0, 3, 2, 1, 4, 5]
    status = bank.status()
    assert status.totals.level is None and status.totals.level_groups is None, "a level is an environment's alone"
    e = status.envs["e"]
    assert e.groups == 4 and e.sampled == 8
    assert e.informative_fraction == pytest.approx(2 / 4)
    assert e.fresh_share == pytest.approx(2 / 8)
    assert e.band_occupancy == pytest.approx(4 / 6)
    assert status.envs["f"].band_occupancy is None and status.envs["f"].informative_fraction is None
    assert status.totals.groups == 4 and status.totals.informative_fraction == pytest.approx(0.5)
    assert status.totals.tasks == 4


def test_persistence_round_trip_continues_identically() -> None:
    def drive(bank: TaskBank, rng: random.Random, world: random.Random, steps: int) -> list[TaskKey]:
        out = []
        for step in range(steps):
            for key in bank.sample("py-func", 6, rng) + bank.sample("kernel", 3, rng):
                out.append(key)
                p = 0.9 / key.difficulty
                bank.observe(key, [float(world.random() < p) for _ in range(4)], step // 5)
        return out

    cfg = BankConfig(max_tasks_per_env=60, level_min_groups=4)
    bank = TaskBank({"py-func": 5, "kernel": 3}, cfg)
    rng, world = random.Random(21), random.Random(22)
    drive(bank, rng, world, 40)

    saved = json.loads(json.dumps(bank.to_json()))
    assert saved["schema"] == SCHEMA_VERSION
    restored = TaskBank.from_json(saved, {"py-func": 5, "kernel": 3}, cfg)
    assert restored.to_json() == bank.to_json()
    rng2, world2 = random.Random(), random.Random()
    rng2.setstate(rng.getstate())
    world2.setstate(world.getstate())
    assert drive(restored, rng2, world2, 30) == drive(bank, rng, world, 30)
    assert restored.to_json() == bank.to_json() and restored.status() == bank.status()


def test_restore_refuses_other_schemas_and_adapts_to_new_environments() -> None:
    bank = TaskBank({"a": 5, "b": 5}, BankConfig(start_level=4))
    bank.observe(TaskKey("a", 0, 4), group(3), 2)
    saved = bank.to_json()
    with pytest.raises(TaskBankError, match="schema"):
        TaskBank.from_json({**saved, "schema": SCHEMA_VERSION + 1}, {"a": 5})
    with pytest.raises(TaskBankError, match="malformed"):
        TaskBank.from_json({**saved, "envs": {"a": {"level": 1}}}, {"a": 5})
    restored = TaskBank.from_json(saved, {"a": 5, "c": 3})
    assert restored.envs == ["a", "c"]
    assert restored.level("a") == 4 and restored.posterior(TaskKey("a", 0, 4)) == Posterior(4.0, 6.0, 2)
    assert restored.status().envs["c"].tasks == 0
    # A lowered maximum clamps the level and forgets the tasks above it.
    lowered = TaskBank.from_json(saved, {"a": 2})
    assert lowered.level("a") == 2 and lowered.posterior(TaskKey("a", 0, 4)) is None
    assert lowered.status().envs["a"].tasks == 0


@pytest.mark.clocked
def test_sampling_a_full_pool_is_fast() -> None:
    bank = TaskBank({"e": 5})
    rng = random.Random(4)
    for seed in range(2000):
        bank.observe(TaskKey("e", seed, 1 + seed % 5), group(rng.randint(0, 8)), seed // 200)
    bank.set_policy_version(12)  # every posterior is read faded
    assert bank.status().envs["e"].tasks > 1800
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        bank.sample("e", 64, rng)
        best = min(best, time.perf_counter() - start)
    assert best / 64 < 1e-3, f"sample(64) over 2,000 tasks took {best * 1e3:.1f} ms"


# -- the simulated farm ----------------------------------------------------------------------------------

LEVELS = 5
GROUP = 8
GROUPS = 3000
BATCH = 32
GROUPS_PER_VERSION = 100


@functools.cache
def task_skill(seed: int, level: int) -> float:
    """How hard this one task is, in logits, beyond its level's difficulty: a spread within a level."""
    return random.Random(level * 1_000_003 + seed).gauss(0.0, 1.2)


def true_pass_rate(key: TaskKey, version: int) -> float:
    """Level 1 is mostly too easy (p ~ 0.9), level 5 mostly too hard (p ~ 0.03); the policy improves."""
    logit = 2.5 - 1.5 * (key.difficulty - 1) + task_skill(key.seed, key.difficulty) + 0.05 * version
    return 1.0 / (1.0 + math.exp(-logit))


def simulate(pick: Callable[[int], list[TaskKey]], world: random.Random, bank: TaskBank | None) -> tuple[float, float]:
    """Run GROUPS groups of tasks chosen by ``pick(n)``: the share whose true p is in the band, and informative."""
    in_band = informative = done = 0
    # The scheduler keeps work queued ahead: the next batch is chosen before this one finishes.
    queued: list[TaskKey] = pick(BATCH)
    while done < GROUPS:
        batch, queued = queued, pick(BATCH)
        for key in batch:
            version = done // GROUPS_PER_VERSION
            p = true_pass_rate(key, version)
            rewards = [float(world.random() < p) for _ in range(GROUP)]
            in_band += 0.2 <= p <= 0.8
            informative += max(rewards) != min(rewards)
            if bank is not None:
                bank.observe(key, rewards, version)
            done += 1
    return in_band / done, informative / done


def test_band_sampling_beats_uniform_on_a_simulated_population() -> None:
    bank = TaskBank({"sim": LEVELS})
    rng = random.Random(7)
    banked = simulate(lambda n: bank.sample("sim", n, rng), random.Random(8), bank)

    urng = random.Random(7)
    uniform = simulate(lambda n: [TaskKey("sim", urng.randrange(1_000_000), urng.randint(1, LEVELS))
                                  for _ in range(n)], random.Random(8), None)

    status = bank.status().envs["sim"]
    print(f"\nband occupancy (true p in [0.2, 0.8]): bank {banked[0]:.3f}, uniform {uniform[0]:.3f}")
    print(f"informative-group fraction:           bank {banked[1]:.3f}, uniform {uniform[1]:.3f}")
    print(f"bank status: level {status.level}, band occupancy {status.band_occupancy:.3f}, "
          f"informative {status.informative_fraction:.3f}, tasks {status.tasks}, in band {status.in_band}")
    assert banked[0] >= uniform[0] + 0.15
    assert banked[1] >= uniform[1] + 0.15
    assert status.level > 1  # the curriculum moved off the too-easy start


def test_uniform_sampling_draws_fresh_tasks_over_every_level_and_never_moves_the_curriculum() -> None:
    bank = TaskBank({"e": 5}, BankConfig(sampling="uniform", level_min_groups=1))
    rng = random.Random(3)
    keys = bank.sample("e", 2000, rng)
    assert len(set(keys)) == 2000, "every task is fresh"
    per_level = {d: sum(k.difficulty == d for k in keys) for d in range(1, 6)}
    assert all(330 <= n <= 470 for n in per_level.values()), per_level
    for key in keys[:50]:
        bank.observe(key, [1.0] * 8, 0)
    assert bank.level("e") == 1, "no curriculum: a mastered level does not move"
    with pytest.raises(TaskBankError, match="sampling"):
        BankConfig(sampling="thompson")


def test_a_task_is_handed_out_for_at_most_max_groups_per_task_groups() -> None:
    bank = TaskBank({"e": 5}, BankConfig(explore_share=0.0, recheck_share=0.0, resample_after=0,
                                         max_groups_per_task=2))
    rng = random.Random(0)
    seen: dict[TaskKey, int] = {}
    for _ in range(20):
        for key in bank.sample("e", 4, rng):
            seen[key] = seen.get(key, 0) + 1
            bank.observe(key, [1.0, 0.0] * 4, 0)  # always in the band
    assert max(seen.values()) == 2 and len(seen) == 40


def test_review_share_keeps_levels_below_in_the_mix_once_the_level_moved() -> None:
    bank = TaskBank({"e": 5}, BankConfig(explore_share=0.5, recheck_share=0.0, review_share=0.25,
                                         level_min_groups=1, mastery_pass_rate=0.5))
    rng = random.Random(1)
    assert {k.difficulty for k in bank.sample("e", 40, rng)} == {1}, "nothing below level 1 to review"
    for key in bank.sample("e", 8, rng):
        bank.observe(key, [1.0] * 8, 0)
    assert bank.level("e") == 2
    keys = bank.sample("e", 400, rng)
    reviewed = sum(k.difficulty == 1 for k in keys)
    assert 70 <= reviewed <= 130 and all(k.difficulty in (1, 2) for k in keys)
    with pytest.raises(TaskBankError, match="review_share"):
        BankConfig(explore_share=0.5, recheck_share=0.3, review_share=0.3)


def test_an_environment_added_later_is_served_and_one_removed_keeps_its_state() -> None:
    bank = TaskBank({"py-func": 3})
    with pytest.raises(TaskBankError):
        bank.sample("contrib:wc@1.0.0", 1, random.Random(0))
    bank.add_env("contrib:wc@1.0.0", 2)
    [key] = bank.sample("contrib:wc@1.0.0", 1, random.Random(0))
    bank.observe(key, [1.0, 0.0], 0)
    bank.remove_env("contrib:wc@1.0.0")
    with pytest.raises(TaskBankError):
        bank.sample("contrib:wc@1.0.0", 1, random.Random(0))
    # Saved while it rests, restored by a bank that does not serve it at first, then serves it again.
    again = TaskBank.from_json(bank.to_json(), {"py-func": 3})
    assert "contrib:wc@1.0.0" not in again.envs
    again.add_env("contrib:wc@1.0.0", 2)
    assert again.status().envs["contrib:wc@1.0.0"].groups == 1


def test_a_counted_attempts_new_verdict_moves_its_pass_or_takes_it_back() -> None:
    """``amend``: a pass rescored a fail moves one count over; a withdrawn one (neither) takes its count back, at
    the weight it was counted with; an unknown task or an unchanged standing moves nothing."""
    bank = TaskBank({"py-func": 5}, BankConfig(keep_per_version=0.5))
    key = TaskKey("py-func", 7, 2)
    bank.observe(key, [1.0, 1.0, 0.0], policy_version=1)
    assert bank.amend(key, True, False, policy_version=1)
    post = bank.posterior(key)
    assert post is not None and (post.alpha, post.beta) == (2.0, 3.0)
    assert bank.amend(key, False, None, policy_version=1)  # withdrawn: no longer a fail, nor a pass
    post = bank.posterior(key)
    assert post is not None and (post.alpha, post.beta) == (2.0, 2.0)
    assert not bank.amend(key, True, True, policy_version=1) and not bank.amend(key, None, None, policy_version=1)
    assert not bank.amend(TaskKey("py-func", 8, 2), True, False, 1) and not bank.amend(TaskKey("kernel", 1, 1),
                                                                                      True, False, 1)
    # Counted under an older version than the task's newest evidence: moved at the weight it was counted with.
    bank.observe(key, [1.0], policy_version=2)
    faded = bank.posterior(key)
    assert faded is not None
    bank.amend(key, True, False, policy_version=1)
    after = bank.posterior(key)
    assert after is not None and after.alpha == pytest.approx(faded.alpha - 0.5)
    assert after.beta == pytest.approx(faded.beta + 0.5)
    # Never below a sliver: the posterior stays a Beta whatever is taken back.
    for _ in range(10):
        bank.amend(key, True, None, policy_version=2)
    low = bank.posterior(key)
    assert low is not None and 0 < low.alpha < 0.01 and low.mean >= 0
