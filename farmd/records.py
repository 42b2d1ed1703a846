"""The farm's records, as plain data: what the store keeps and the services pass around.

Proto types stop at ``farmd/api``; SQL stops at ``farmd/store``; in between, these.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from farmd.flags import INVALID_TEXT, TRUNCATED
from farmd.text import clip, valid_text, valid_tree

# What one stored trajectory may hold. Whatever an attempt, an endpoint or a box produces, a stored
# trajectory stays within a few MiB, so any one fits a stream message with room to spare and a batch
# is packed by size (a big group continues over several messages; see farmd/api). The verdict is
# always given on the whole attempt; only what is kept is cut, with the ``truncated`` flag.
MAX_FINAL_CHARS = 256 * 1024
"""Larger than any submission a built-in verifier accepts (py-func: 200,000 bytes)."""
MAX_STEPS = 256
MAX_ACTION_CHARS = 16 * 1024
MAX_OBSERVATION_CHARS = 64 * 1024
MAX_STEPS_CHARS = 512 * 1024
"""Actions and observations of all steps together; steps past it keep their exit codes and times only."""
MAX_REASONS = 16
MAX_REASON_CHARS = 1000
MAX_FLAGS = 32
MAX_FLAG_CHARS = 64
MAX_DETAILS_CHARS = 64 * 1024
MAX_NAME_CHARS = 512
"""Names and versions (env, agent spec, node, verifier version)."""


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

    def sealed(self) -> Trajectory:
        """This trajectory as it may be stored: every string valid text, every field within the bounds
        above. What was repaired or cut is flagged (``invalid_text``, ``truncated``) rather than lost
        silently; the verdict itself is unchanged."""
        repaired = cut = 0

        def text(value: str, bound: int) -> str:
            nonlocal repaired, cut
            value, n = valid_text(value)
            value, clipped = clip(value, bound)
            repaired += n
            cut += clipped
            return value

        steps: list[dict[str, Any]] = []
        budget = MAX_STEPS_CHARS
        for step in self.steps[:MAX_STEPS]:
            step = dict(step)
            for key, bound in (("action", MAX_ACTION_CHARS), ("observation", MAX_OBSERVATION_CHARS)):
                if isinstance(step.get(key), str):
                    kept = text(step[key], min(bound, max(budget, 0)))
                    budget -= len(kept)
                    step[key] = kept
            steps.append(step)
        cut += len(self.steps) > MAX_STEPS
        details, n = valid_tree(self.details)
        repaired += n
        if len(json.dumps(details, default=str)) > MAX_DETAILS_CHARS:
            details = {"truncated": f"details over {MAX_DETAILS_CHARS} characters were not kept"}
            cut += 1
        flags = [text(f, MAX_FLAG_CHARS) for f in self.flags[:MAX_FLAGS]]
        reasons = [text(r, MAX_REASON_CHARS) for r in self.reasons[:MAX_REASONS]]
        cut += len(self.reasons) > MAX_REASONS or len(self.flags) > MAX_FLAGS
        sealed = replace(
            self, env=text(self.env, MAX_NAME_CHARS), env_version=text(self.env_version, MAX_NAME_CHARS),
            agent=text(self.agent, MAX_NAME_CHARS), node=text(self.node, MAX_NAME_CHARS),
            verifier_version=text(self.verifier_version, MAX_NAME_CHARS), status=text(self.status, MAX_NAME_CHARS),
            final=text(self.final, MAX_FINAL_CHARS), steps=steps, reasons=reasons, flags=flags, details=details,
            timings={k: float(v) for k, v in self.timings.items()})
        for flag, happened in ((INVALID_TEXT, repaired), (TRUNCATED, cut)):
            if happened and flag not in sealed.flags:
                sealed.flags.append(flag)
        return sealed

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
