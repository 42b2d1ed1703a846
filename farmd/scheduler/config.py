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
