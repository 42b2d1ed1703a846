"""Environments: tasks with a difficulty knob, reference attempts, and verification.

``get(name)`` returns an environment by name: ``py-func``, ``kernel``, ``shell``
and ``rg:<dataset>`` for the reasoning-gym datasets farm supports.
"""

from __future__ import annotations

from farmd.envs.base import (
    Attempt,
    Environment,
    Episode,
    EpisodeEnvironment,
    Observation,
    SubmissionEnvironment,
    Task,
    VerifyContext,
    judge_episode_safely,
    kind_of,
    verify_safely,
)
from farmd.envs.registry import get, names
from farmd.errors import TaskError

__all__ = ["Attempt", "Environment", "Episode", "EpisodeEnvironment", "Observation", "SubmissionEnvironment", "Task",
           "TaskError", "VerifyContext", "get", "judge_episode_safely", "kind_of", "names", "verify_safely"]
