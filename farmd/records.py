"""The farm's records, as plain data: what the store keeps and the services pass around.

Proto types stop at ``farmd/api``; SQL stops at ``farmd/store``; in between, these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class JobState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    """Infrastructure failures exhausted its retries: recorded apart from every score."""


@dataclass(frozen=True, slots=True)
class Job:
    """One rollout to run: one attempt of ``agent`` at one task. Its id is its trajectory's id."""

    id: int
    group_id: int
    env: str
    seed: int
    difficulty: int
    agent: str
    state: JobState
    attempts: int
    lease_owner: str | None = None
    lease_expires: float | None = None
    policy_version: int = 0
    source: str = "request"
    """``request`` (farmctl run) or ``demand`` (a trainer's buffer ran low)."""


@dataclass(slots=True)
class Trajectory:
    """A scored rollout: the task, what the agent did and saw, the verdict, and where it all ran."""

    id: int
    group_id: int
    env: str
    env_version: str
    seed: int
    difficulty: int
    agent: str
    policy_version: int
    reward: float
    passed: bool
    status: str
    """``ok`` or ``error``: an error verdict is recorded, never counted as a score."""
    reasons: list[str]
    flags: list[str]
    verifier_version: str
    steps: list[dict[str, Any]]
    final: str
    node: str
    timings: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    finished_at: float = 0.0
    seq: int = 0
    """Position in the stream trainers consume (assigned by the store when it is stored)."""

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id, "seq": self.seq, "group_id": self.group_id, "env": self.env, "seed": self.seed,
            "difficulty": self.difficulty, "agent": self.agent, "policy_version": self.policy_version,
            "reward": self.reward, "passed": self.passed, "status": self.status, "flags": self.flags,
            "verifier_version": self.verifier_version, "node": self.node, "finished_at": self.finished_at,
        }

    def to_json(self) -> dict[str, Any]:
        out = self.summary()
        out.update({"env_version": self.env_version, "reasons": self.reasons, "steps": self.steps,
                    "final": self.final, "timings": self.timings, "details": self.details})
        return out


@dataclass(frozen=True, slots=True)
class Policy:
    version: int
    sha256: str
    size: int
    uri: str | None
    created_at: float
