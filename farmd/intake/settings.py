"""The intake funnel's settings (farm.toml's ``[intake]``): what scrutiny each trust level gets, what the
LLM attacker is, and the prices its cost report is in."""

from __future__ import annotations

from dataclasses import dataclass


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
        for name in ("max_package_bytes", "tier2_tasks", "sound_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        for name in ("recent_days", "box_cpu_hour_usd", "attacker_usd_per_mtok", "review_hour_usd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number of at least 0, not {value!r}")
