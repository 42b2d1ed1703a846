"""The scheduler's settings, apart from the scheduler: ``farmd.config`` builds them on every start of
farmd and farmctl, and must not load the store and the metrics to do it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    lease_s: float = 120.0
    """How long a worker holds a job without a heartbeat before it goes back to the queue."""
    max_attempts: int = 3
    """Leases a job may take (infrastructure failures, expired leases) before it fails for good."""
    retry_backoff_s: float = 1.0
    """How long a job waits after its first transient failure before it may be leased again; doubled
    after each further one, up to ``retry_backoff_max_s``, and jittered so that jobs failed together
    by one outage do not return together."""
    retry_backoff_max_s: float = 60.0
    node_lost_s: float = 30.0
    """A joined node silent this long is lost: its leases go back to the queue at once. It heartbeats at a
    third of this (or of ``lease_s``, if shorter)."""
    maintenance_every_s: float = 1.0
    """How often expired leases are requeued and finished groups fed to the task bank."""
    demand_buffer: int = 256
    """Unconsumed trajectories (stored or in the queue) to keep ahead of the slowest streaming trainer."""
    demand_per_version: int = 0
    """What the trainer learns from per version of the demand agent's policy (its batch), for demand to queue: a
    batch more with each new version, at most ``demand_lag`` + 1 unqueued at any time (0: no such limit, only
    ``demand_buffer``). A buffer alone lets production run on while the trainer gathers its batch, and some of
    what it sends is two versions old by the time it is learned from: measured in one process on the tiny loop,
    two versions behind learned less than half as much per rollout as one or none (held-out +0.16 against +0.45
    in 90 s)."""
    demand_lag: int = 1
    """With ``demand_per_version``: how many versions the policy that samples a batch may be behind the one that
    learns from it. 1: the farm samples the next batch while the trainer learns from this one (sampling and
    learning overlap). 0: lockstep, each batch sampled by the version just published (nothing overlaps, and the
    ratio to the sampling policy starts at 1)."""
    demand_agent: str | None = None
    """The agent demand-driven rollouts use (the current policy's); None: only explicit requests run."""
    demand_envs: tuple[str, ...] = ()
    bank_agents: tuple[str, ...] = ()
    """The agents (specs, exactly as queued) whose finished groups teach the task bank pass rates. Empty:
    the demand agent when there is one, else every agent but the ``reference`` and ``random`` controls."""
    demand_consumers: tuple[str, ...] = ()
    """The trainers demand follows, by consumer name; empty: every consumer that is consuming."""
    consumer_stall_s: float = 300.0
    """A consumer holding a batch unacknowledged this long stops counting for demand until it acks (a client
    that streams under a new name and never acks must not halt production for every trainer)."""
    group_size: int = 8
    seed: int = 0
    reverify_share: float = 0.05
    """The share of every joined node's results the coordinator verifies again on its own boxes, picked after
    they arrive (the node cannot know which); never below ``REVERIFY_SHARE_FLOOR``."""
    reverify_first: int = 16
    """A node's first results after it joins, every one verified again (never fewer than ``REVERIFY_FIRST_FLOOR``):
    a node that lies from the start is caught at once, not after a share of many."""
    reverify_concurrency: int = 2
    """Checks of nodes' results running at once on the coordinator's boxes (which intake shares)."""
    reverify_tolerance: float = 0.25
    """How far a node's reward may be from the coordinator's for the same attempt and still agree: only rewards
    between 0 and 1 come near it (a kernel's, from its speed measured on the machine that judged it, which an
    honest node's machine measures differently); a pass that is a fail never agrees."""
    canary_share: float = 0.02
    """The share of a node's jobs that are known-answer canaries, sent to it alone (never below
    ``CANARY_SHARE_FLOOR``): each job it leases adds this much on average to what it is owed, and a canary group
    goes once that covers the group's size."""
    canary_first_within: int = 4
    """A node's first canary comes after a random one of its first this many jobs."""
    node_refusals_quarantine: int = 3
    """Results a node reports under another job's identity before it is quarantined."""
    policy_keep_newest: int = 4
    """The versions of each policy line whose content is kept whatever else holds (the current one among them); an
    older version's content goes once no job is queued or leased for it and no operator pinned it (its hash and
    metadata stay). At least 1."""
    policy_sweep_s: float = 10.0
    """How often unused policy content is looked for and removed, and the disk the store takes sampled."""

    def __post_init__(self) -> None:
        if not REVERIFY_SHARE_FLOOR <= self.reverify_share <= 1:
            raise ValueError(f"reverify_share is {REVERIFY_SHARE_FLOOR} to 1 (a node's verdict is checked, not "
                             f"believed), not {self.reverify_share!r}")
        if not CANARY_SHARE_FLOOR <= self.canary_share <= 1:
            raise ValueError(f"canary_share is {CANARY_SHARE_FLOOR} to 1, not {self.canary_share!r}")
        if self.reverify_first < REVERIFY_FIRST_FLOOR:
            raise ValueError(f"reverify_first is at least {REVERIFY_FIRST_FLOOR}, not {self.reverify_first!r}")
        if self.canary_first_within < 1 or self.reverify_concurrency < 1 or self.node_refusals_quarantine < 1:
            raise ValueError("canary_first_within, reverify_concurrency and node_refusals_quarantine are at least 1")
        if isinstance(self.policy_keep_newest, bool) or not isinstance(self.policy_keep_newest, int) \
                or self.policy_keep_newest < 1 or not self.policy_sweep_s > 0:
            raise ValueError(f"policy_keep_newest is at least 1 (a line's current version is always kept) and "
                             f"policy_sweep_s above 0, not {self.policy_keep_newest!r} and {self.policy_sweep_s!r}")
        for name in ("demand_per_version", "demand_lag"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} is a whole number, 0 or more, not {value!r}")
        if not 0 <= self.reverify_tolerance < 1:
            raise ValueError(f"reverify_tolerance is 0 to below 1, not {self.reverify_tolerance!r}")


REVERIFY_SHARE_FLOOR = 0.01
"""The least share of a node's results ever verified again: no setting makes a node's verdicts unchecked."""
REVERIFY_FIRST_FLOOR = 4
CANARY_SHARE_FLOOR = 0.005
