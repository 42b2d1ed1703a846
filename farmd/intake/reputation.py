"""Reputation: how much the funnel trusts a contributor, and what that trust buys.

New contributors start at low trust: low-value bounties only, and maximum scrutiny (more seeds per
level in tier 1, a larger attack budget in tier 2). Accepted environments earn reputation, and more when
they later prove sound in service; a rejection costs a little (honest mistakes are the common case). A
planted exploit, once a reviewer or a quarantine says so, tanks a reputation for good: the contributor
stays at maximum scrutiny and claims no bounty again. Every change is a ledger row with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from farmd.intake.settings import IntakeConfig

ACCEPTED = 10.0
PROVED_SOUND = 10.0
REJECTED_TIER1 = -1.0
REJECTED_TIER2 = -5.0
"""An exploit earned reward: worse than a broken generator, not yet proof of intent."""
REJECTED_REVIEW = -2.0
QUARANTINED = -20.0
TANKED = -1000.0
"""Below any reputation accepted environments can rebuild: the ``tanked`` mark is what makes it for good."""


@dataclass(frozen=True)
class Trust:
    name: str
    seeds: int
    attack_budget: int
    max_payout: float
    """The most a bounty this contributor may claim pays."""


_LEVELS = (("new", float("-inf"), 100.0), ("known", 10.0, 250.0), ("trusted", 30.0, 1000.0))
"""(name, reputation from, max payout): one accepted environment makes a contributor known; three, trusted."""


def trust(reputation: float, tanked: bool, config: IntakeConfig) -> Trust:
    if tanked:
        return Trust("tanked", config.seeds[0], config.attack_budget[0], 0.0)
    index = max(i for i, (_, floor, _) in enumerate(_LEVELS) if reputation >= floor)
    name, _, payout = _LEVELS[index]
    return Trust(name, config.seeds[index], config.attack_budget[index], payout)


def strictest(config: IntakeConfig) -> Trust:
    """The scrutiny of a full review (what a tanked author's other versions are sent back to)."""
    return Trust("full review", config.seeds[0], config.attack_budget[0], 0.0)
