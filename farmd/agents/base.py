"""The agent API: one ``attempt`` per rollout, and the record of what the agent did and saw.

An agent turns a ``Task`` into an ``Attempt``. For submission tasks it returns the
final text and one ``Step`` (the submission, no observation). For action tasks the
rollout runner opens the environment's ``Episode`` and hands it in; the agent calls
``await episode.act(command)`` once per step, records each step, and returns the
final answer with the actions taken. The agent never closes the episode (its
owner does) and never runs anything itself: every command goes through the
episode, whose boxes are the only place untrusted code runs.

Agents are shared by concurrent rollouts, so ``attempt`` keeps no state on the agent.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from farmd.envs.base import Attempt, Episode, Task
from farmd.records import ChatMessage, SamplingParams, Turn


@dataclass
class Step:
    """One thing the agent did, and what it saw."""

    action: str
    """The command run (action tasks) or the submission (submission tasks)."""
    observation: str | None
    """The episode's output for the command; None for a submission."""
    exit_code: int | None
    """The command's exit status; None for a submission, or when the command did not run or exit."""
    seconds: float
    """Wall time of the step: producing the submission, or the agent's turn plus running the command."""
    violations: list[str] = field(default_factory=list)
    """Bounds the command's box hit (``Observation.violations``)."""


@dataclass
class AgentResult:
    """What one ``Agent.attempt`` produced."""

    attempt: Attempt
    """What is verified: the final text, and for action tasks the actions taken."""
    steps: list[Step] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    """Resource counts of the model behind the agent: ``requests`` (replies), ``retries`` (failed requests
    retried on the way) and, where the server reports them, ``prompt_tokens``, ``completion_tokens``,
    ``total_tokens``; empty for scripted agents."""
    error: str | None = None
    """Why the attempt ended unfinished, when the policy is to blame (no answer before the turn
    limit, an exhausted budget). The attempt is still verified and scored: this is data, and
    infrastructure failures are raised instead (``EndpointError``)."""
    transcript: list[ChatMessage] = field(default_factory=list)
    """For model-driven agents, the conversation exactly as sent and received: what a trainer needs to
    score the policy's own tokens. Empty for scripted agents."""
    turns: list[Turn] = field(default_factory=list)
    """One per model reply, in order: which message it is, its token ids and sampling logprobs where the
    server returned them, its finish reason and usage."""
    sampling: SamplingParams | None = None
    """What the model was asked to sample with (None for scripted agents)."""
    policy_version: int | None = None
    """The policy version the model's server said it sampled with, read back from it (0: it could not say, or
    another model answered); None: the agent does not know, and the job's version stands."""
    flags: list[str] = field(default_factory=list)
    """Flags (``farmd.flags``) the agent raises about its own attempt, added to the verdict's: a red-team
    agent says what it tried, so its trajectories can be found, kept as negative examples, and left out."""


class Agent(abc.ABC):
    """A policy that acts in a rollout."""

    name: str = ""
    """Stable and printable (it is stored with every trajectory); never holds a secret."""

    @abc.abstractmethod
    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        """Attempt ``task``. ``episode`` is open for action tasks (the agent must not close it) and
        None for submission tasks. ``rollout_id`` (the job's id) tells the attempts of one group apart,
        and stays the same when a rollout is retried (a model agent derives its sampling seed from it).
        Raises ``AgentError`` only when no attempt could be made."""

    def prepare(self, policy_version: int) -> None:
        """Jobs of ``policy_version`` are about to start: begin, without waiting, what their attempts will all
        wait on first (a policy's load). Nothing for most agents; never raises (each attempt meets its error)."""
        return None

    async def aclose(self) -> None:
        """Release what the agent holds (an endpoint's connections); its owner calls it once no attempt is
        running. Nothing for most agents."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
