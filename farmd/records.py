"""The farm's records, as plain data: what the store keeps and the services pass around.

Proto types stop at ``farmd/api``; SQL stops at ``farmd/store``; in between, these.
"""

from __future__ import annotations

import enum
import json
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from farm_client import record
from farm_client.record import (
    ChatMessage,
    PosedTask,
    SamplingParams,
    Score,
    Step,
    Timings,
    ToolCall,
    Turn,
    Usage,
)

from farmd.flags import INVALID_TEXT, TRUNCATED
from farmd.text import clip, valid_text, valid_tree

__all__ = ["BODY_FIELDS", "SUMMARY_FIELDS", "ChatMessage", "Job", "JobState", "Policy", "PosedTask", "SamplingParams",
           "Score", "Step", "Timings", "ToolCall", "Trajectory", "Turn", "Usage", "View", "from_plain",
           "to_plain"]

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
MAX_PROMPT_CHARS = 256 * 1024
MAX_MESSAGES = 512
MAX_MESSAGE_CHARS = 256 * 1024
MAX_CONVERSATION_CHARS = 1024 * 1024
"""All messages' text together; a message past it keeps its role and as much text as is left."""
MAX_TOOL_CALLS = 16
MAX_TOKEN_ENTRIES = 384 * 1024
"""Token ids and logprobs of all turns together (about 2 MB on the wire): earlier turns' prompt token ids
go first (the last turn's prompt holds them), then whole turns' tokens."""


NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A node's name in a fleet: lease owners are ``<name>:<pid>:<nonce>``, so never a colon."""

MAX_HELD_JOBS = 16384
"""Jobs a node names as held when it joins again (``NodeHello.held``): its slots' and its undelivered results'.
A node holding more names none, and its leases not delivered wait out their time as before."""

VERIFIED_LOCAL = "local"
"""``verified_by`` of a verdict the coordinator's own worker gave."""
VERIFIED_COORDINATOR = "coordinator"
"""``verified_by`` of a node's verdict the coordinator verified again and found the same."""
VERIFIED_EXTERNAL = "external"
"""``verified_by`` of a score pushed from outside (an Atropos environment's): farm's verifier never judged it."""


def verified_by_node(name: str) -> str:
    """``verified_by`` of a joined node's verdict, as it reported it (not checked)."""
    return f"node:{name}"


KNOWN_ANSWER_AGENT = re.compile(r"reference|random(:-?[0-9]{1,18})?")
"""Agent specs whose every attempt is a function of the task alone (``reference``, ``random[:SEED]``): the
coordinator can run the same job itself and know the exact answer and verdict a node must report (a canary)."""

RED_TEAM_PREFIX = "redteam:"
"""Agent specs of ``farmctl redteam``'s adversaries: their trajectories are kept, flagged, and never taken as
evidence of how hard a task is (the task bank) or how the farm's policy does (pass rates)."""
CANARY_PREFIX = RED_TEAM_PREFIX + "canary:"
"""Agent specs of intake's production canaries (known-wrong attempts mixed into a contributed version's jobs):
a red team's, so kept out of the bank and pass rates, and kept out of every trainer stream too."""


class JobState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    """Infrastructure failures exhausted its retries: recorded apart from every score."""
    CANCELLED = "cancelled"
    """Its run was cancelled while it was still queued."""


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


class Trajectory(record.Trajectory):
    """A scored rollout: the task as posed, what the agent said, did and saw, the verdict, and where it ran.

    The fields are the wire record's, written once in ``farm_client.record`` (the client a trainer installs
    holds the same record); farmd adds what it does with one: bound it for storage, summarize it.
    """

    __slots__ = ()

    def sealed(self) -> Trajectory:
        """This trajectory as it may be stored: every string valid text, every field within the bounds
        above. What was repaired or cut is flagged (``invalid_text``, ``truncated``) rather than lost
        silently; the verdict itself is unchanged."""
        return _Sealer().seal(self)

    def summary(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SUMMARY_FIELDS}

    def for_loss(self) -> Trajectory:
        """What a loss needs of it (the ``tokens`` view): this record without the bulk a learner never reads (the
        task as posed, the conversation, the steps, the final text, the verifier's details, the scores); the
        turns keep their token ids and sampling logprobs. A new record: the one it came from is unchanged."""
        return evolve(self, task=PosedTask(), messages=[], steps=[], final="", verdict_details={}, scores=[])

    def to_json(self) -> dict[str, Any]:
        plain: dict[str, Any] = to_plain(self)
        return plain


SUMMARY_FIELDS = ("id", "seq", "group_id", "run_id", "env", "seed", "difficulty", "agent", "policy_version",
                  "reward", "passed", "status", "flags", "verifier_version", "node", "finished_at", "verified_by",
                  "verdict_version")
"""What a trajectory is listed by (``farmctl trajectories list``, a summary-only stream)."""
BODY_FIELDS = ("task", "messages", "turns", "steps", "final", "verdict_details")
"""The bulk of a record: left out of summaries."""

View = typing.Literal["full", "summary", "tokens"]
"""How much of each record a read returns: ``full`` (all of it, every score included), ``summary``
(``BODY_FIELDS`` left out: no body is read), ``tokens`` (``Trajectory.for_loss``: the summary with the turns'
token ids and logprobs, what a trainer's stream needs; no scores are read)."""


def to_plain(record: Any) -> Any:
    """A record as plain JSON values (dataclasses as dicts), field for field."""
    if is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_plain(getattr(record, f.name)) for f in fields(record)}
    if isinstance(record, list | tuple):
        return [to_plain(v) for v in record]
    return record


def from_plain(cls: type[R], data: Mapping[str, Any]) -> R:
    """The record ``to_plain`` made; a field missing from ``data`` takes its default (older records)."""
    return cls(**{name: convert(data[name]) for name, convert in _plan(cls) if name in data})


_PLANS: dict[type, tuple[tuple[str, Callable[[Any], Any]], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """Each field of ``cls`` with what turns its plain value into the field's, worked out once per
    class: a store reads every trajectory it streams this way, and asking the type of every value of every
    record, each time, was most of what a read cost."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = _hints(cls)
        plan = _PLANS[cls] = tuple((f.name, _converter(hints[f.name])) for f in fields(cls))
    return plan


def _converter(hint: Any) -> Callable[[Any], Any]:
    """What turns a plain value into a ``hint``-typed field's, with the questions about ``hint`` answered now."""
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        if item in _SCALARS:  # token ids, logprobs, reasons: copied whole, not item by item
            return lambda v: None if v is None else list(v)
        each = _converter(item)
        return lambda v: None if v is None else [each(x) for x in v]
    if isinstance(hint, type) and is_dataclass(hint):
        return lambda v: None if v is None else from_plain(hint, v)
    return _same


def _same(value: Any) -> Any:
    return value


R = TypeVar("R")
D = TypeVar("D")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


_SCALARS = frozenset({int, float, str, bool})


_COPIERS: dict[tuple[Any, ...], Callable[..., Any]] = {}


def evolve(obj: D, /, **changes: Any) -> D:
    """``dataclasses.replace`` for the records every rollout passes through several times: the same new
    record, made by a function compiled once per (class, changed fields) that passes every field by position.
    ``replace`` binds each field by keyword after walking the class's fields (7.6 us a trajectory, measured,
    against 2.3 us), and a rollout's record is copied about eight times between its agent and its reader."""
    key = (type(obj), *changes)
    copier = _COPIERS.get(key)
    if copier is None:
        copier = _COPIERS[key] = _copier(type(obj), tuple(changes))
    return typing.cast(D, copier(obj, **changes))


def _copier(cls: type[Any], changed: tuple[str, ...]) -> Callable[..., Any]:
    every = fields(cls)
    unknown = set(changed) - {f.name for f in every}
    clash = {"evolved", "new_record"} & {f.name for f in every}
    if unknown or clash or not record.takes_fields_in_order(cls) or hasattr(cls, "__post_init__"):
        # What ``replace`` alone does right (a TypeError naming the field, an init-only field, a post-init)
        return lambda obj, **kw: replace(obj, **kw)
    args = ", ".join(f.name if f.name in changed else f"evolved.{f.name}" for f in every)
    namespace: dict[str, Any] = {"new_record": cls}
    # Field names only (identifiers, checked above against the class): no outside text reaches the source.
    exec(f"def copy(evolved, {', '.join(changed)}):\n    return new_record({args})", namespace)
    return typing.cast(Callable[..., Any], namespace["copy"])


class _Sealer:
    """Bounds a record and counts what it repaired or cut."""

    def __init__(self) -> None:
        self.repaired = 0
        self.cut = 0

    def text(self, value: str, bound: int) -> str:
        if value.isascii() and len(value) <= bound:  # most of a record's text: valid, and within its bound
            return value
        value, n = valid_text(value)
        value, clipped = clip(value, max(bound, 0))
        self.repaired += n
        self.cut += clipped
        return value

    def tree(self, value: Any, bound: int, what: str) -> Any:
        if not value:  # most records' (no examples, no metadata): nothing to repair, and well within any bound
            return value
        value, n = valid_tree(value)
        self.repaired += n
        if len(json.dumps(value, default=str)) > bound:
            self.cut += 1
            return {"truncated": f"{what} over {bound} characters were not kept"}
        return value

    def seal(self, t: Trajectory) -> Trajectory:
        steps: list[Step] = []
        budget = MAX_STEPS_CHARS
        for step in t.steps[:MAX_STEPS]:
            action = self.text(step.action, min(MAX_ACTION_CHARS, budget))
            budget -= len(action)
            observation = self.text(step.observation, min(MAX_OBSERVATION_CHARS, budget))
            budget -= len(observation)
            steps.append(evolve(step, action=action, observation=observation,
                                violations=[self.text(v, MAX_REASON_CHARS) for v in step.violations[:MAX_REASONS]]))
        self.cut += len(t.steps) > MAX_STEPS
        messages: list[ChatMessage] = []
        budget = MAX_CONVERSATION_CHARS
        for m in t.messages[:MAX_MESSAGES]:
            content = self.text(m.content, min(MAX_MESSAGE_CHARS, budget))
            budget -= len(content)
            calls = [ToolCall(self.text(c.id, MAX_NAME_CHARS), self.text(c.name, MAX_NAME_CHARS),
                              self.text(c.arguments, MAX_ACTION_CHARS)) for c in m.tool_calls[:MAX_TOOL_CALLS]]
            self.cut += len(m.tool_calls) > MAX_TOOL_CALLS
            messages.append(ChatMessage(self.text(m.role, MAX_FLAG_CHARS), content, calls,
                                        self.text(m.tool_call_id, MAX_NAME_CHARS)))
        self.cut += len(t.messages) > MAX_MESSAGES
        turns = self.turns(t.turns)
        task = evolve(t.task, prompt=self.text(t.task.prompt, MAX_PROMPT_CHARS),
                      entry_point=self.text(t.task.entry_point, MAX_NAME_CHARS),
                      answer_format=self.text(t.task.answer_format, MAX_REASON_CHARS),
                      examples=self.tree(t.task.examples, MAX_DETAILS_CHARS, "examples"),
                      metadata=self.tree(t.task.metadata, MAX_DETAILS_CHARS, "metadata"))
        if not isinstance(task.examples, list):
            task.examples = []
        sampling = evolve(t.sampling, model=self.text(t.sampling.model, MAX_NAME_CHARS),
                          stop=[self.text(s, MAX_NAME_CHARS) for s in t.sampling.stop[:MAX_REASONS]],
                          extra=self.tree(t.sampling.extra, MAX_DETAILS_CHARS, "extra request fields"))
        flags = [self.text(f, MAX_FLAG_CHARS) for f in t.flags[:MAX_FLAGS]]
        reasons = [self.text(r, MAX_REASON_CHARS) for r in t.reasons[:MAX_REASONS]]
        self.cut += len(t.reasons) > MAX_REASONS or len(t.flags) > MAX_FLAGS
        sealed = evolve(
            t, env=self.text(t.env, MAX_NAME_CHARS), env_version=self.text(t.env_version, MAX_NAME_CHARS),
            agent=self.text(t.agent, MAX_NAME_CHARS), node=self.text(t.node, MAX_NAME_CHARS),
            verifier_version=self.text(t.verifier_version, MAX_NAME_CHARS),
            status=self.text(t.status, MAX_NAME_CHARS), final=self.text(t.final, MAX_FINAL_CHARS), steps=steps,
            reasons=reasons, flags=flags, verdict_details=self.tree(t.verdict_details, MAX_DETAILS_CHARS, "details"),
            agent_error=self.text(t.agent_error, MAX_REASON_CHARS), task=task, messages=messages, turns=turns,
            sampling=sampling, scores=[])
        for flag, happened in ((INVALID_TEXT, self.repaired), (TRUNCATED, self.cut)):
            if happened and flag not in sealed.flags:
                sealed.flags.append(flag)
        return sealed

    def turns(self, turns: list[Turn]) -> list[Turn]:
        """Turns within the token budget. A later turn's prompt holds the earlier ones' prompts, so those
        go first; past that a turn keeps its text but not its tokens (and says it has no logprobs)."""
        kept = [evolve(turn, completion=self.text(turn.completion, MAX_MESSAGE_CHARS),
                       finish_reason=self.text(turn.finish_reason, MAX_FLAG_CHARS))
                for turn in turns[:MAX_MESSAGES]]
        self.cut += len(turns) > MAX_MESSAGES

        def count() -> int:
            return sum(len(x.prompt_token_ids) + len(x.token_ids) + len(x.logprobs) for x in kept)

        for turn in kept[:-1]:
            if count() <= MAX_TOKEN_ENTRIES:
                break
            if turn.prompt_token_ids:
                turn.prompt_token_ids = []
                self.cut += 1
        for turn in reversed(kept):
            if count() <= MAX_TOKEN_ENTRIES:
                break
            if turn.prompt_token_ids or turn.token_ids or turn.logprobs:
                turn.prompt_token_ids, turn.token_ids, turn.logprobs, turn.has_logprobs = [], [], [], False
                self.cut += 1
        return kept


@dataclass(frozen=True, slots=True)
class Policy:
    version: int
    sha256: str
    size: int
    uri: str | None
    created_at: float
    name: str = ""
    """The policy line it was published to (``torch:NAME`` agents run the newest version of NAME)."""
