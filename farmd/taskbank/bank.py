"""The task bank: which tasks to spend rollouts on, and at what difficulty.

A GRPO group teaches the policy something only when its rewards differ, and a
task with pass probability ``p`` gives differing rewards most often at ``p = 1/2``
(per-attempt reward variance ``p(1 - p)``). So the bank keeps a forgetting Beta
posterior over each task's pass probability (``posterior.py``) and spends most of
every ``sample`` on known tasks in the band (posterior mean pass rate within
``[band_low, band_high]``), best expected variance first. A share goes to fresh
seeds at the environment's current difficulty (new tasks are the only way to find
new band tasks, and the only unbiased reading of how hard the level is), and a
small share re-checks retired tasks (those whose mean has left the band), since
the policy moves on and a retirement may no longer hold.

Per environment the difficulty level moves up when fresh tasks at the current
level are mostly passed, and down when they are almost never passed.

The bank is pure logic: no I/O, no clock, no event loop. Randomness comes from
the caller's ``random.Random``; state leaves and returns through ``to_json`` /
``from_json`` so the scheduler can persist it.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from farmd.errors import TaskBankError
from farmd.taskbank.posterior import BetaModel, Posterior
from farmd.taskbank.seeds import SeedSequence

SCHEMA_VERSION = 1
"""Version of the ``to_json`` layout; ``from_json`` refuses any other."""

_PRUNE_SLACK = 0.05
"""Share of the pool freed beyond the bound when pruning, so pruning (O(pool)) runs once per many new tasks."""

_HARD, _BAND, _EASY = -1, 0, 1


@dataclass(frozen=True, slots=True)
class Standing:
    """One environment's place in the bank, or the totals over every environment (``TaskBank.status``).
    ``None`` where there is nothing to count yet; the level's fields are the environment's alone (None in the
    totals)."""

    tasks: int
    in_band: int
    easy: int
    hard: int
    retired: int
    groups: int
    sampled: int
    band_occupancy: float | None
    fresh_share: float | None
    informative_fraction: float | None
    level: int | None = None
    max_difficulty: int | None = None
    level_pass_rate: float | None = None
    level_groups: int | None = None


@dataclass(frozen=True, slots=True)
class BankStatus:
    """The bank's standing: per environment served, and in total."""

    policy_version: int
    envs: Mapping[str, Standing]
    totals: Standing


@dataclass(frozen=True, order=True)
class TaskKey:
    """One task: an environment's instance for ``(seed, difficulty)``."""

    env: str
    seed: int
    difficulty: int


@dataclass(frozen=True)
class BankConfig:
    """How the task bank estimates pass rates, samples, and moves difficulty.

    Probabilities and shares are fractions in [0, 1]. Shares are of the tasks one
    ``sample`` call returns, rounded at random so that small calls get them on average.
    """

    prior_alpha: float = 1.0
    """Beta prior pseudo-passes of a task nobody has tried (1, 1: uniform)."""
    prior_beta: float = 1.0
    """Beta prior pseudo-fails."""
    pass_threshold: float = 0.5
    """A reward at or above this counts as a pass (kernel rewards are graded; the others are 0 or 1)."""
    keep_per_version: float = 0.7
    """Share of a task's evidence kept per policy version it is behind the newest; 1 never forgets."""
    band_low: float = 0.2
    """Lowest posterior mean pass rate inside the productive band; below it a task is retired as too hard."""
    band_high: float = 0.8
    """Highest posterior mean pass rate inside the productive band; above it a task is retired as too easy."""
    resample_after: int = 64
    """Tasks of an environment handed out before one of them may be handed out again.

    Keeps the stream diverse, and keeps a task whose group is still running from being
    handed out again on the strength of the same evidence.
    """
    explore_share: float = 0.2
    """Share of a sample spent on fresh seeds at the environment's current level.

    Fresh groups are also all the curriculum reads: at 0 the level moves only when
    too few known band tasks leave room for fresh seeds.
    """
    recheck_share: float = 0.05
    """Share of a sample spent re-checking retired tasks (those whose posterior mean is outside the band)."""
    review_share: float = 0.0
    """Share of a sample spent on fresh tasks at the levels below the current one (each equally likely),
    once the level has moved up: a policy trained only on the new level can lose the old one."""
    max_groups_per_task: int = 0
    """Groups one task is handed out for at most (0: no limit). Where distinct tasks are cheap and a policy
    can learn a task by heart, a band task coming back over and over teaches that task, not the skill:
    held-out pass rates stay flat while training ones climb. A small cap keeps the band's picks (a
    task known to split its group) without the memorising."""
    max_tasks_per_env: int = 2000
    """Most tasks remembered per environment; the least informative are forgotten beyond it."""
    start_level: int = 1
    """Difficulty an environment starts at (clamped to its maximum)."""
    max_level: int = 0
    """Highest level the bank serves an environment at (its curriculum stops there, and ``uniform`` draws up to it);
    0: each environment's own maximum. Holding a loop at one level makes it compare with a loop that has no
    curriculum (``make bench``: the farm against one process)."""
    mastery_pass_rate: float = 0.8
    """Level pass rate (of fresh tasks' attempts) at or above which the level moves up."""
    floor_pass_rate: float = 0.05
    """Level pass rate at or below which the level moves down."""
    level_min_groups: int = 16
    """Fresh groups at a level before it may move."""
    level_window_groups: int = 32
    """Groups the level pass rate averages over (an exponential window of about this many)."""
    recent_window: int = 500
    """Samples and finished groups per environment that status fractions are computed over."""
    sampling: str = "band"
    """``band``: as above. ``uniform``: every task a fresh seed at a level drawn uniformly from 1 to the
    environment's maximum, with no band, no re-checks and no curriculum: the baseline the band is
    measured against (``make bench``). Pass rates are still observed, so status reads the same."""

    def __post_init__(self) -> None:
        fractions = {
            "pass_threshold": self.pass_threshold, "band_low": self.band_low, "band_high": self.band_high,
            "explore_share": self.explore_share, "recheck_share": self.recheck_share,
            "review_share": self.review_share,
            "mastery_pass_rate": self.mastery_pass_rate, "floor_pass_rate": self.floor_pass_rate,
        }
        for name, value in fractions.items():
            if not 0.0 <= value <= 1.0:
                raise TaskBankError(f"BankConfig.{name} must be in [0, 1], got {value}")
        if self.band_low > self.band_high:
            raise TaskBankError(f"BankConfig.band_low ({self.band_low}) is above band_high ({self.band_high})")
        if self.explore_share + self.recheck_share + self.review_share > 1.0:
            raise TaskBankError("BankConfig.explore_share + recheck_share + review_share must not exceed 1")
        if self.sampling not in ("band", "uniform"):
            raise TaskBankError(f"BankConfig.sampling must be 'band' or 'uniform', got {self.sampling!r}")
        if self.floor_pass_rate >= self.mastery_pass_rate:
            raise TaskBankError("BankConfig.floor_pass_rate must be below mastery_pass_rate")
        if self.max_groups_per_task < 0:
            raise TaskBankError(f"BankConfig.max_groups_per_task must be >= 0, got {self.max_groups_per_task}")
        for name, count in {"max_tasks_per_env": self.max_tasks_per_env, "start_level": self.start_level,
                            "level_min_groups": self.level_min_groups,
                            "level_window_groups": self.level_window_groups,
                            "recent_window": self.recent_window}.items():
            if count < 1:
                raise TaskBankError(f"BankConfig.{name} must be at least 1, got {count}")
        if self.resample_after < 0:
            raise TaskBankError(f"BankConfig.resample_after must be >= 0, got {self.resample_after}")
        if self.max_level < 0:
            raise TaskBankError(f"BankConfig.max_level must be >= 0 (0: no cap), got {self.max_level}")
        if self.max_level and self.start_level > self.max_level:
            raise TaskBankError(f"BankConfig.start_level ({self.start_level}) is above max_level ({self.max_level})")
        # Raises on a bad prior or forgetting rate.
        self.model()

    def model(self) -> BetaModel:
        return BetaModel(self.prior_alpha, self.prior_beta, self.keep_per_version)


class _Record:
    """What the bank remembers of one task."""

    __slots__ = ("groups", "last_sampled", "post")

    def __init__(self, post: Posterior, groups: int, last_sampled: int | None) -> None:
        self.post = post
        self.groups = groups
        self.last_sampled = last_sampled
        """The environment's ``sampled_total`` when this task was last handed out; None: never by sample()."""


class _EnvState:
    """One environment's pool, curriculum and recent statistics."""

    def __init__(self, max_difficulty: int, config: BankConfig) -> None:
        self.max_difficulty = max_difficulty
        self.top = min(max_difficulty, config.max_level) if config.max_level else max_difficulty
        """The highest level served: the environment's, or ``max_level`` below it."""
        self.level = min(config.start_level, self.top)
        self.level_rate = 0.0
        self.level_groups = 0
        self.next_seed: dict[int, int] = {}
        """Per level, how many fresh seeds were handed out (the bank's ``seeds`` says which the next one is)."""
        # Insertion-ordered; sampling walks it in order, so the order is part of the saved state.
        self.tasks: dict[tuple[int, int], _Record] = {}
        # True/False: the sampled task's posterior mean was inside/outside the band; None: a fresh task.
        self.recent_samples: deque[bool | None] = deque(maxlen=config.recent_window)
        self.recent_groups: deque[bool] = deque(maxlen=config.recent_window)
        self.sampled_total = 0
        self.groups_total = 0


class TaskBank:
    """Per-task pass-rate posteriors, band sampling and a difficulty curriculum, per environment.

    ``max_difficulty`` names every environment the bank serves and its highest level,
    e.g. ``TaskBank({"py-func": 5, "kernel": 5})``. ``seeds``: which seed the n-th fresh task of an
    environment at a level gets (``seeds.py``: a farm's are keyed, so no environment can tell them from the
    seeds intake checks it on); without, the n-th is ``n``.
    """

    def __init__(self, max_difficulty: Mapping[str, int], config: BankConfig | None = None,
                 seeds: SeedSequence | None = None) -> None:
        self.config = config or BankConfig()
        self.seeds = seeds or SeedSequence()
        self._model = self.config.model()
        self._version = 0
        self._envs: dict[str, _EnvState] = {}
        self._resting: dict[str, Any] = {}
        """Saved state of environments not served now, as JSON: kept, not forgotten."""
        for env, top in max_difficulty.items():
            if top < 1:
                raise TaskBankError(f"{env}: max difficulty must be at least 1, got {top}")
            self._envs[env] = _EnvState(top, self.config)

    @property
    def envs(self) -> list[str]:
        return list(self._envs)

    @property
    def policy_version(self) -> int:
        """The newest policy version the bank has heard of; evidence is read as of this version."""
        return self._version

    def set_policy_version(self, version: int) -> None:
        """Tell the bank a new policy is out, so older evidence fades before any group of it finishes.

        Versions only move forward; an older one is ignored.
        """
        self._version = max(self._version, version)

    def level(self, env: str) -> int:
        """The environment's current difficulty level."""
        return self._env(env).level

    def posterior(self, key: TaskKey) -> Posterior | None:
        """The task's posterior as of the newest policy version; None for a task the bank does not know."""
        rec = self._env(key.env).tasks.get((key.seed, key.difficulty))
        return None if rec is None else self._model.at(rec.post, self._version)

    def sample(self, env: str, n: int, rng: random.Random) -> list[TaskKey]:
        """``n`` distinct tasks of ``env`` to run a group of attempts on next.

        Band picks first: band tasks not cooling down (``resample_after``), highest
        expected reward variance E[p(1 - p)] first. Then re-checks of retired tasks,
        then fresh seeds at the current level, which also make up for too few known
        tasks. A fresh seed is never handed out twice.
        """
        st = self._env(env)
        if n <= 0:
            return []
        cfg = self.config
        if cfg.sampling == "uniform":
            return self._uniform(st, env, n, rng)
        n_recheck = min(_round(n * cfg.recheck_share, rng), n)
        n_explore = min(_round(n * cfg.explore_share, rng), n - n_recheck)
        n_review = min(_round(n * cfg.review_share, rng), n - n_recheck - n_explore) if st.level > 1 else 0

        cooling_since = st.sampled_total - cfg.resample_after
        band: list[tuple[float, _Record, tuple[int, int], float]] = []
        retired: list[tuple[Posterior, _Record, tuple[int, int]]] = []
        for ident, rec in st.tasks.items():
            if rec.last_sampled is not None and rec.last_sampled >= cooling_since:
                continue
            if cfg.max_groups_per_task and rec.groups >= cfg.max_groups_per_task:
                continue
            post = self._model.at(rec.post, self._version)
            if self._standing(post) == _BAND:
                band.append((post.reward_variance, rec, ident, post.mean))
            else:
                retired.append((post, rec, ident))

        # The retirement that has gone longest without a look is the likeliest not to hold any
        # more; ties (all retired under one version) are broken at random, not by pool order.
        stalest = heapq.nsmallest(n_recheck, retired, key=lambda item: (item[1].post.version, rng.random()))
        rechecks = [(rec, ident, post.mean) for post, rec, ident in stalest]

        n_band = min(n - len(rechecks) - n_explore - n_review, len(band))
        # Greedy on the expected variance, not Thompson draws: with dozens of picks from
        # hundreds of weakly known tasks, draws of p(1 - p) (flat near 1/2) pick almost at
        # random. Ties (every task with 4 passes of 8) are broken at random, not by pool order.
        best = heapq.nlargest(n_band, band, key=lambda item: (item[0], rng.random()))
        picks = [(rec, ident, mean) for _, rec, ident, mean in best] + rechecks

        out: list[TaskKey] = []
        for rec, (seed, difficulty), mean in picks:
            rec.last_sampled = st.sampled_total
            out.append(TaskKey(env, seed, difficulty))
            st.recent_samples.append(cfg.band_low <= mean <= cfg.band_high)
        out += [_fresh(st, env, rng.randint(1, st.level - 1) if i < n_review else st.level, self.seeds)
                for i in range(n - len(out))]
        st.sampled_total += n
        return out

    def fresh(self, env: str, n: int, difficulty: int) -> list[TaskKey]:
        """``n`` fresh tasks of ``env`` at ``difficulty``, never handed out before (the same sequence ``sample``'s
        fresh picks come from): for a caller that asks for a level rather than the bank's picks."""
        st = self._env(env)
        if not 1 <= difficulty <= st.max_difficulty:
            raise TaskBankError(f"{env}: difficulty must be 1..{st.max_difficulty}, got {difficulty}")
        out = [_fresh(st, env, difficulty, self.seeds) for _ in range(max(0, n))]
        st.sampled_total += len(out)
        return out

    def _uniform(self, st: _EnvState, env: str, n: int, rng: random.Random) -> list[TaskKey]:
        out = [_fresh(st, env, rng.randint(1, st.top), self.seeds) for _ in range(n)]
        st.sampled_total += n
        return out

    def observe(self, key: TaskKey, rewards: Sequence[float], policy_version: int) -> None:
        """Record one finished group: attempts at ``key`` under ``policy_version``, with these rewards in [0, 1]."""
        st = self._env(key.env)
        if not 1 <= key.difficulty <= st.max_difficulty:
            raise TaskBankError(f"{key.env}: difficulty must be 1..{st.max_difficulty}, got {key.difficulty}")
        if not rewards:
            raise TaskBankError(f"{key}: a group needs at least one reward")
        for r in rewards:
            if not 0.0 <= r <= 1.0:  # also refuses NaN
                raise TaskBankError(f"{key}: rewards must be in [0, 1], got {r}")
        if policy_version < 0:
            raise TaskBankError(f"{key}: policy version must be >= 0, got {policy_version}")
        cfg = self.config
        self._version = max(self._version, policy_version)
        passes = sum(1 for r in rewards if r >= cfg.pass_threshold)

        ident = (key.seed, key.difficulty)
        rec = st.tasks.get(ident)
        first = rec is None
        if rec is None:
            rec = st.tasks[ident] = _Record(self._model.fresh(policy_version), 0, None)
            # A task that reached the bank some other way (an operator's run) is not fresh any more. (A keyed
            # sequence meets an operator's seed about once in 2**31 draws: a repeat that harms nothing.)
            if self.seeds.key is None and key.seed >= st.next_seed.get(key.difficulty, 0):
                st.next_seed[key.difficulty] = key.seed + 1
        rec.post = self._model.update(rec.post, passes, len(rewards) - passes, policy_version)
        rec.groups += 1
        st.groups_total += 1
        st.recent_groups.append(max(rewards) != min(rewards))

        # Only first groups of tasks read the level's difficulty: known tasks come back
        # because they sit in the band, which would pin the level's pass rate near 1/2.
        if first and key.difficulty == st.level and cfg.sampling == "band":
            self._level_step(st, passes / len(rewards))
        if first and len(st.tasks) > cfg.max_tasks_per_env:
            self._prune(st)

    def amend(self, key: TaskKey, was: bool | None, now: bool | None, policy_version: int) -> bool:
        """One attempt at ``key`` the bank counted (under ``policy_version``) holds another verdict now: a rescore
        (``was``/``now``: whether each verdict passes, by ``pass_threshold``; None: it counts as neither, a
        withdrawn one or an error). Its pass or fail moves to what it is now, or is taken back. Returns whether
        the task's counts moved (False: the same standing, or a task the bank no longer holds)."""
        st = self._envs.get(key.env)
        rec = st.tasks.get((key.seed, key.difficulty)) if st is not None else None
        if rec is None or was is now:
            return False
        passes = int(now is True) - int(was is True)
        fails = int(now is False) - int(was is False)
        rec.post = self._model.amend(rec.post, passes, fails, policy_version)
        return True

    def passes(self, reward: float) -> bool:
        """Whether a verdict of ``reward`` counts as a pass here."""
        return reward >= self.config.pass_threshold

    def status(self) -> BankStatus:
        """Per environment and in total: level, pool counts, band occupancy, informative-group fraction.

        ``in_band`` / ``easy`` / ``hard``: known tasks whose posterior mean (read at the
        newest policy version) is inside / above / below the band; ``retired`` is easy
        plus hard. ``band_occupancy``: of recently sampled known tasks, the share whose
        posterior mean was inside the band when sampled (fresh tasks have no estimate
        yet and are counted in ``fresh_share`` instead). ``informative_fraction``: of
        recently finished groups, the share whose rewards were not all equal. ``None``
        where there is nothing to count yet.
        """
        envs: dict[str, Standing] = {}
        recent_in, recent_known, recent_samples, recent_informative, recent_groups = 0, 0, 0, 0, 0
        for name, st in self._envs.items():
            # Read at the newest version a posterior keeps its mean (fading scales both counts alike), and the mean
            # alone decides a standing: read as stored, with no posterior made per task on each status read.
            standings = [self._standing(rec.post) for rec in st.tasks.values()]
            known = [s for s in st.recent_samples if s is not None]
            n_in = sum(known)
            n_informative = sum(st.recent_groups)
            envs[name] = Standing(
                tasks=len(st.tasks), in_band=standings.count(_BAND), easy=standings.count(_EASY),
                hard=standings.count(_HARD), retired=len(standings) - standings.count(_BAND), groups=st.groups_total,
                sampled=st.sampled_total, band_occupancy=_fraction(n_in, len(known)),
                fresh_share=_fraction(len(st.recent_samples) - len(known), len(st.recent_samples)),
                informative_fraction=_fraction(n_informative, len(st.recent_groups)), level=st.level,
                max_difficulty=st.max_difficulty, level_pass_rate=st.level_rate if st.level_groups else None,
                level_groups=st.level_groups)
            recent_in += n_in
            recent_known += len(known)
            recent_samples += len(st.recent_samples)
            recent_informative += n_informative
            recent_groups += len(st.recent_groups)
        each = envs.values()
        totals = Standing(
            tasks=sum(e.tasks for e in each), in_band=sum(e.in_band for e in each), easy=sum(e.easy for e in each),
            hard=sum(e.hard for e in each), retired=sum(e.retired for e in each), groups=sum(e.groups for e in each),
            sampled=sum(e.sampled for e in each), band_occupancy=_fraction(recent_in, recent_known),
            fresh_share=_fraction(recent_samples - recent_known, recent_samples),
            informative_fraction=_fraction(recent_informative, recent_groups))
        return BankStatus(policy_version=self._version, envs=envs, totals=totals)

    def to_json(self) -> dict[str, Any]:
        """The whole state as plain JSON values; ``from_json`` restores it exactly. An environment the bank
        stopped serving (``remove_env``) keeps its state here, for when it serves it again."""
        return {
            "schema": SCHEMA_VERSION,
            "policy_version": self._version,
            "envs": {**self._resting, **{name: _env_json(st) for name, st in self._envs.items()}},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], max_difficulty: Mapping[str, int],
                  config: BankConfig | None = None, seeds: SeedSequence | None = None) -> TaskBank:
        """A bank from ``to_json`` output, serving the environments in ``max_difficulty``.

        Saved state of an environment not named is dropped; a named one without saved
        state starts fresh; against a lowered maximum difficulty the level is clamped and
        tasks above it are dropped.
        """
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA_VERSION:
            got = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise TaskBankError(f"saved task bank state has schema {got!r}; this farm reads {SCHEMA_VERSION}")
        bank = cls(max_difficulty, config, seeds)
        bank._version = _restored(lambda: int(data["policy_version"]))
        envs = _restored(lambda: dict(data["envs"]))
        for name, saved in envs.items():
            st = bank._envs.get(name)
            if st is None:
                bank._resting[name] = saved  # not served now (a contributed version not yet loaded): kept
            else:
                _restored(lambda st=st, saved=saved: _load_env(st, saved))  # type: ignore[misc]
        return bank

    def add_env(self, env: str, max_difficulty: int) -> None:
        """Serve ``env`` from now on (an approved contributed version), with its saved state if it has one."""
        if max_difficulty < 1:
            raise TaskBankError(f"{env}: max difficulty must be at least 1, got {max_difficulty}")
        if env in self._envs:
            return
        st = _EnvState(max_difficulty, self.config)
        saved = self._resting.pop(env, None)
        if saved is not None:
            _restored(lambda: _load_env(st, saved))
        self._envs[env] = st

    def remove_env(self, env: str) -> None:
        """Stop serving ``env`` (sample refuses it); its state rests in the saved state."""
        st = self._envs.pop(env, None)
        if st is not None:
            self._resting[env] = _env_json(st)

    def _env(self, env: str) -> _EnvState:
        st = self._envs.get(env)
        if st is None:
            raise TaskBankError(f"the task bank does not serve {env!r}; it serves {', '.join(self._envs) or 'nothing'}")
        return st

    def _standing(self, post: Posterior) -> int:
        mean = post.mean
        if mean < self.config.band_low:
            return _HARD
        if mean > self.config.band_high:
            return _EASY
        return _BAND

    def _level_step(self, st: _EnvState, pass_rate: float) -> None:
        cfg = self.config
        # A plain mean until the window fills, then exponential: no bias toward the initial 0.
        weight = max(1.0 / (st.level_groups + 1), 1.0 / cfg.level_window_groups)
        st.level_rate += weight * (pass_rate - st.level_rate)
        st.level_groups += 1
        if st.level_groups < cfg.level_min_groups:
            return
        if st.level_rate >= cfg.mastery_pass_rate and st.level < st.top:
            st.level += 1
        elif st.level_rate <= cfg.floor_pass_rate and st.level > 1:
            st.level -= 1
        else:
            return
        st.level_rate, st.level_groups = 0.0, 0

    def _prune(self, st: _EnvState) -> None:
        """Forget the least informative tasks: retired ones first, then those with the least expected variance."""
        cfg = self.config
        keep = cfg.max_tasks_per_env - int(cfg.max_tasks_per_env * _PRUNE_SLACK)
        excess = len(st.tasks) - keep

        def worth(item: tuple[tuple[int, int], _Record]) -> tuple[bool, float]:
            post = self._model.at(item[1].post, self._version)
            return self._standing(post) == _BAND, post.reward_variance

        for ident, _ in heapq.nsmallest(excess, st.tasks.items(), key=worth):
            del st.tasks[ident]


def _fresh(st: _EnvState, env: str, level: int, seeds: SeedSequence) -> TaskKey:
    """The next seed never handed out at ``level``: ``next_seed`` counts them, ``seeds`` says which each is."""
    n = st.next_seed.get(level, 0)
    st.next_seed[level] = n + 1
    st.recent_samples.append(None)
    return TaskKey(env, seeds.nth(env, level, n), level)


def _round(x: float, rng: random.Random) -> int:
    """``x`` rounded up with probability equal to its fractional part: right on average."""
    whole = int(x)
    # Always draw, so the rng's stream does not depend on whether x is whole.
    return whole + (rng.random() < x - whole)


def _fraction(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _env_json(st: _EnvState) -> dict[str, Any]:
    return {
        "level": st.level,
        "level_rate": st.level_rate,
        "level_groups": st.level_groups,
        "next_seed": [[d, s] for d, s in st.next_seed.items()],
        "tasks": [[seed, d, r.post.alpha, r.post.beta, r.post.version, r.groups, r.last_sampled]
                  for (seed, d), r in st.tasks.items()],
        "recent_samples": list(st.recent_samples),
        "recent_groups": list(st.recent_groups),
        "sampled_total": st.sampled_total,
        "groups_total": st.groups_total,
    }


def _load_env(st: _EnvState, saved: Mapping[str, Any]) -> None:
    st.level = max(1, min(int(saved["level"]), st.top))
    st.level_rate = float(saved["level_rate"])
    st.level_groups = int(saved["level_groups"])
    # Tasks above a lowered maximum could no longer be generated: forget them.
    st.next_seed = {int(d): int(s) for d, s in saved["next_seed"] if int(d) <= st.max_difficulty}
    st.tasks = {
        (int(seed), int(d)): _Record(Posterior(float(a), float(b), int(v)), int(g), None if last is None else int(last))
        for seed, d, a, b, v, g, last in saved["tasks"]
        if int(d) <= st.max_difficulty
    }
    st.recent_samples.extend(None if s is None else bool(s) for s in saved["recent_samples"])
    st.recent_groups.extend(bool(g) for g in saved["recent_groups"])
    st.sampled_total = int(saved["sampled_total"])
    st.groups_total = int(saved["groups_total"])


_T = TypeVar("_T")


def _restored(read: Callable[[], _T]) -> _T:
    """``read()`` of saved state; whatever is malformed in it is a ``TaskBankError`` saying so."""
    try:
        return read()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TaskBankError(f"saved task bank state is malformed: {type(exc).__name__}: {exc}") from exc
