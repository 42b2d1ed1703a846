"""Errors of the agents: a bad agent spec, and a model that could not answer.

Neither is ever a score. ``EndpointError`` in particular is an infrastructure
failure: the rollout runner records it apart from rewards and retries the job,
so a dead inference server can never look like a policy that failed its tasks.
"""

from __future__ import annotations

from farmd.errors import FarmError


class AgentError(FarmError):
    """Base of the agents' errors: the agent could not make an attempt (not that it made a bad one)."""


class AgentSpecError(AgentError):
    """An agent spec (``reference``, ``random``, ``openai:MODEL@ENDPOINT``, ...) is malformed or unknown."""


class EndpointError(AgentError):
    """The model behind an agent failed to answer (after retries where a retry could help).

    ``transient`` says whether trying the job again later may succeed (connection errors,
    timeouts, 429 and 5xx are; a 400 for a malformed request is not), ``status`` is the
    last HTTP status seen (None when there was no response), ``attempts`` how many
    requests were made.
    """

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1,
                 transient: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.transient = transient
