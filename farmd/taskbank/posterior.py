"""A task's pass probability as a Beta posterior that forgets as the policy moves on.

Evidence gathered under policy version ``v`` says less about version ``v + k``: the
policy has learned since. So evidence fades geometrically with the version gap,
whether it is being read (``BetaModel.at``) or added to (``BetaModel.update``). Everything here is pure: values in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass

from farmd.errors import TaskBankError


@dataclass(frozen=True, slots=True)
class Posterior:
    """``Beta(alpha, beta)`` over a task's pass probability, as of policy ``version``."""

    alpha: float
    beta: float
    version: int

    @property
    def mean(self) -> float:
        """The expected pass probability."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def reward_variance(self) -> float:
        """The expected per-attempt reward variance, E[p(1-p)]: the learning signal a group of this task carries.

        Lower than ``mean * (1 - mean)`` by the posterior's own spread, so an unknown
        task (1/6 under a uniform prior) ranks below one known to sit at 1/2 (1/4).
        """
        total = self.alpha + self.beta
        return self.alpha * self.beta / (total * (total + 1.0))


@dataclass(frozen=True, slots=True)
class BetaModel:
    """The prior and the forgetting rate shared by every task's posterior."""

    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    keep_per_version: float = 0.7
    """Share of evidence kept per policy version of age; 1 never forgets."""

    def __post_init__(self) -> None:
        if not (self.prior_alpha > 0 and self.prior_beta > 0):
            raise TaskBankError(f"the Beta prior needs alpha, beta > 0, got {self.prior_alpha}, {self.prior_beta}")
        if not 0 < self.keep_per_version <= 1:
            raise TaskBankError(f"keep_per_version must be in (0, 1], got {self.keep_per_version}")

    def fresh(self, version: int) -> Posterior:
        """What is believed of a task nobody has tried."""
        return Posterior(self.prior_alpha, self.prior_beta, version)

    def evidence(self, post: Posterior) -> float:
        """How many attempts' worth of (faded) evidence ``post`` holds beyond the prior."""
        return post.alpha + post.beta - self.prior_alpha - self.prior_beta

    def at(self, post: Posterior, version: int) -> Posterior:
        """``post`` as it should be read under policy ``version``: evidence from older versions faded.

        Fading discounts the evidence but keeps the estimate: the policy has moved, and
        nothing says which way for this task, so the best guess stays where it was while
        the posterior widens back toward the prior's strength. (Fading toward the prior's
        mean instead would make every task nobody has looked at lately look like a
        band task at 1/2.) A posterior is never sharpened by reading it under an older version.
        """
        gap = version - post.version
        if gap <= 0:
            return post
        prior = self.prior_alpha + self.prior_beta
        total = post.alpha + post.beta
        scale = (prior + self.keep_per_version**gap * (total - prior)) / total
        return Posterior(post.alpha * scale, post.beta * scale, version)

    def update(self, post: Posterior, passes: float, fails: float, version: int) -> Posterior:
        """``post`` after a group of attempts under policy ``version``.

        A group from a newer version first fades the old evidence. A group from an
        older version (a late result, leased before the policy moved) counts at the
        weight it would have had had it arrived in order, and does not rewind the
        posterior's version.
        """
        if passes < 0 or fails < 0:
            raise TaskBankError(f"passes and fails must be non-negative, got {passes}, {fails}")
        if version >= post.version:
            base, weight = self.at(post, version), 1.0
        else:
            base, weight = post, self.keep_per_version ** (post.version - version)
        return Posterior(base.alpha + weight * passes, base.beta + weight * fails, base.version)

    def amend(self, post: Posterior, passes: float, fails: float, version: int) -> Posterior:
        """``post`` after attempts it counted under policy ``version`` got another verdict: ``passes`` and
        ``fails`` are what that moves (-1 takes one back, +1 counts one), at the weight ``update`` gave them, so
        a pass taken back removes about what counting it added. Evidence never goes below a sliver (fading is
        not exactly reversible): the posterior stays a Beta."""
        weight = self.keep_per_version ** max(0, post.version - version)
        return Posterior(max(_SLIVER, post.alpha + weight * passes), max(_SLIVER, post.beta + weight * fails),
                         post.version)


_SLIVER = 1e-3
