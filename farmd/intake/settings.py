"""The intake funnel's settings (farm.toml's ``[intake]``): what scrutiny each trust level gets, what the
LLM attacker is, and the prices its cost report is in."""

from __future__ import annotations

from dataclasses import dataclass

MIN_CANARY_SHARE = 0.01
"""The floor under ``canary_share``: production keeps checking every contributed version."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IntakeConfig:
    attacker: str | None = None
    """``MODEL@NAME``: the LLM attacker asks model MODEL of ``[endpoints.NAME]`` for exploits (None: no attacker)."""
    max_package_bytes: int = 8 << 20
    """The largest package a contributor may send (packed)."""
    seeds: tuple[int, int, int] = (6, 4, 3)
    """Seeds per level tier 1 asks of a new, a known and a trusted contributor: the less trust, the more seeds."""
    attack_budget: tuple[int, int, int] = (16, 8, 4)
    """Attacker proposals asked for, by the same trust levels."""
    tier2_tasks: int = 3
    """Tasks the exploit library and the canaries are run on (per submission, spread over its levels)."""
    tier2_sample: int = 16
    """Tasks tier 2 solves with the reference to see how answers spread (constant answers, answers the prompt
    does not decide, leaks): each one box."""
    canary_share: float = 0.05
    """Of an approved contributed version's production jobs, the share that are canaries (known-wrong attempts
    mixed in unannounced; at least ``canaries.MIN_SHARE``)."""
    canary_check_s: float = 2.0
    """How often stored canaries are read for a reward (any quarantines their version)."""
    verdict_cpu_s: float = 1.0
    """The farm's CPU budget for one verdict of a contributed verifier, as its box's cgroup counts it, whatever
    its manifest declares: a version whose verdicts typically cost more is refused."""
    verdict_wall_s: float = 10.0
    """The same in wall-clock seconds of its box (a verifier that sleeps holds a box as long)."""
    check_box_s: float = 900.0
    """Box seconds (wall, summed over its boxes) one submission's tiers 1 and 2 may take; past it checking stops
    and the version is refused as too costly."""
    parallel_checks: int = 2
    """Submissions checked at once: one slow submission holds one of these, never the whole funnel."""
    sound_after: int = 500
    """Trajectories an accepted version serves without a quarantine before it counts as proved sound."""
    recent_days: float = 30.0
    """A tanked author's versions accepted this recently go back for full review."""
    box_cpu_hour_usd: float = 0.10
    attacker_usd_per_mtok: float = 5.0
    review_hour_usd: float = 60.0

    def __post_init__(self) -> None:
        for name in ("seeds", "attack_budget"):
            value = getattr(self, name)
            if len(value) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
                raise ValueError(f"{name} is three whole numbers of at least 1 (new, known, trusted), not {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.attacker is not None and "@" not in self.attacker:
            raise ValueError(f"attacker is MODEL@NAME, naming one of [endpoints], not {self.attacker!r}")
        for name in ("max_package_bytes", "tier2_tasks", "tier2_sample", "sound_after", "parallel_checks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        for name in ("recent_days", "box_cpu_hour_usd", "attacker_usd_per_mtok", "review_hour_usd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number of at least 0, not {value!r}")
        for name in ("canary_check_s", "verdict_cpu_s", "verdict_wall_s", "check_box_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400:
                raise ValueError(f"{name} must be a number of seconds above 0, not {value!r}")
        share = self.canary_share
        # Production keeps checking: a farm may raise the share, never turn it off.
        if isinstance(share, bool) or not isinstance(share, int | float) or not MIN_CANARY_SHARE <= share < 1:
            raise ValueError(f"canary_share must be from {MIN_CANARY_SHARE} to below 1, not {share!r}")
