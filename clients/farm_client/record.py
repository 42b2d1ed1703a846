"""The trajectory record as a trainer holds it: typed, field for field ``farm.v1.Trajectory``.

Written once: farmd's record (``farmd/records.py``) is this one with farmd's methods added, and a test keeps
it and the proto in step. Times are
seconds (``Duration``) or seconds since the epoch (``Timestamp``) as floats, enums their lower-case names.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class PosedTask:
    """The task exactly as it was posed to the agent (``Task`` without anything hidden)."""

    kind: str = "submission"
    """``submission`` or ``actions``."""
    prompt: str = ""
    entry_point: str = ""
    answer_format: str = ""
    examples: list[Any] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ToolCall:
    id: str = ""
    name: str = ""
    arguments: str = ""
    """The model's own text (JSON by convention, never parsed into the record)."""


@dataclass(slots=True)
class ChatMessage:
    """One message of the conversation, exactly as sent to or received from the model."""

    role: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""


@dataclass(slots=True)
class Usage:
    """Token counts as the model server reported them, and the requests it took."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0
    retries: int = 0


@dataclass(slots=True)
class Turn:
    """One model reply: to ``messages[:prompt_messages]``, stored as ``messages[message_index]``."""

    message_index: int = 0
    prompt_messages: int = 0
    completion: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    has_logprobs: bool = False
    """False when the server returned no logprobs: ``logprobs`` is then empty, never invented."""
    finish_reason: str = ""
    """``stop``, ``length`` (cut at max_tokens), ``tool_calls``, ``content_filter``, ``other``; "" unknown."""
    usage: Usage = field(default_factory=Usage)
    latency: float = 0.0
    """Seconds from the request to the reply (retries included)."""
    choice_index: int = 0


@dataclass(slots=True)
class SamplingParams:
    """What every turn was requested with."""

    model: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Step:
    """One thing the agent did and what the box said back."""

    action: str = ""
    """The command; "" for a submission (kept once, as the trajectory's ``final``)."""
    observation: str = ""
    exit_code: int | None = None
    duration: float = 0.0
    violations: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Score:
    """One verdict the trajectory was given: the first, or a later one (a rescore under a verifier version, a
    coordinator's check, a withdrawal). Adding one never overwrites another."""

    verifier_version: str = ""
    reward: float = 0.0
    passed: bool = False
    status: str = "ok"
    reasons: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    scored_at: float = 0.0
    verdict_version: int = 0
    """0: the verdict the trajectory was stored with; else this score's place in the store's growing sequence.
    The trajectory's ``verdict_version`` names the current one."""


@dataclass(slots=True)
class Timings:
    """Seconds spent making the task, in the agent (model and boxes), verifying, and in all."""

    task: float = 0.0
    agent: float = 0.0
    verify: float = 0.0
    total: float = 0.0


@dataclass(slots=True)
class Trajectory:
    """A scored rollout as a trainer receives it: the task as posed, the conversation, each model turn's
    token ids and sampling logprobs, the steps and what the boxes said, the verdict and every later
    score, and where and when it all ran. Field for field the wire record (``farm.v1.Trajectory``)."""

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
    steps: list[Step] = field(default_factory=list)
    final: str = ""
    node: str = ""
    run_id: int = 0
    verdict_details: dict[str, Any] = field(default_factory=dict)
    task: PosedTask = field(default_factory=PosedTask)
    messages: list[ChatMessage] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    usage: Usage = field(default_factory=Usage)
    agent_error: str = ""
    scores: list[Score] = field(default_factory=list)
    """Every verdict it was given, the first included, oldest first (whole records; a summary has none)."""
    timings: Timings = field(default_factory=Timings)
    started_at: float = 0.0
    finished_at: float = 0.0
    seq: int = 0
    """Position in the stream trainers consume (assigned by the store when it is stored)."""
    verified_by: str = ""
    """Whose verdict ``reward`` is: ``local`` (the farm's own worker), ``node:NAME`` (a joined node's, not
    checked), ``coordinator`` (a node's, verified again by the farm and found the same), ``external`` (pushed
    with its score from outside); "" for records stored before farm kept it."""
    verdict_version: int = 0
    """Which verdict ``reward``, ``passed``, ``status``, ``reasons``, ``flags`` and ``verifier_version`` are: 0 the
    one it was stored with, else the later score (in ``scores``) with this ``verdict_version``. They are always
    the current verdict: a withdrawal (reward 0, flagged ``withdrawn``) or a rescore replaces the first."""

    @property
    def completion_token_count(self) -> int:
        """Tokens the model produced in this trajectory (all turns)."""
        return sum(len(t.token_ids) for t in self.turns)

    @property
    def has_tokens(self) -> bool:
        """Every turn carries its completion's token ids and sampling logprobs (what a loss needs)."""
        return bool(self.turns) and all(t.token_ids and t.has_logprobs for t in self.turns)


def takes_fields_in_order(cls: type) -> bool:
    """Whether ``cls(*values)`` makes the dataclass from its fields' values in ``dataclasses.fields`` order: its
    constructor takes exactly those, each by position (no init-only variable, no field left out of it, none
    keyword-only)."""
    names = [f.name for f in dataclasses.fields(cls)]
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return False
    return [p.name for p in params] == names and all(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
