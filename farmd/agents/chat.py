"""The conversation loop of model-driven agents, whatever serves the model.

``ChatAgent`` turns a task into chat messages, asks its model (``complete``: an
OpenAI-compatible endpoint, a local torch policy), reads the reply and, for action
tasks, runs the reply's command through the episode and feeds the observation
back. The protocol the model is told:

- submission tasks: the reply is the submission. For code tasks (an entry point)
  the last fenced ``python`` block that defines the entry point is taken (else the
  last ``python`` block, else the whole reply); for answer tasks the whole reply.
- action tasks: each reply holds one command in a fenced ``sh`` block (the last
  ``sh``/``bash``/``shell`` or untagged block counts), or a line ``ANSWER: <final
  answer>`` outside code blocks, which ends the episode. A reply with neither gets
  a reminder and uses a turn. At the turn limit, or when the episode has no
  commands left, the model is asked once more for its answer.

Bounds: ``ChatLimits``. Running out of turns or budget is the policy's failure,
recorded in ``AgentResult.error`` and still verified; the model failing to answer
at all raises ``EndpointError``, and limits too small for the task's own prompt
raise ``AgentError``: neither is ever a score.
"""

from __future__ import annotations

import abc
import re
import time
from dataclasses import dataclass, field
from typing import Any

from farmd.agents.base import Agent, AgentResult, Step
from farmd.agents.errors import AgentError
from farmd.envs.base import Attempt, Episode, Observation, Task
from farmd.text import clip, valid_text

Message = dict[str, str]

DEFAULT_MAX_TURNS = 20
"""Replies in an action episode when neither the limits nor the task say otherwise."""
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")

SUBMISSION_SYSTEM = ("You solve tasks carefully. Think as much as you need, then give your submission exactly in the "
                     "form the task asks for.")
CODE_INSTRUCTIONS = ("Reply with the complete Python source code in one ```python code block. If your reply holds "
                     "several blocks, the last one that defines `{entry_point}` is taken.")
ACTIONS_SYSTEM = (
    "You solve tasks by running shell commands, one per turn.\n"
    "- To run a command, reply with it in a ```sh code block (one block per reply; if there are several, the last "
    "is run). You will be shown its output and exit status.\n"
    "- When you are finished, reply with a line `ANSWER: <your final answer>` outside any code block, and no "
    "command. If the task is checked on the files you leave rather than on an answer, reply `ANSWER: done` once "
    "they are in place.\n"
    "You have at most {turns} turns."
)
NO_COMMAND = ("Your reply had neither a command in a ```sh code block nor an `ANSWER: ...` line. Reply with one "
              "command, or with your final answer.")
ANSWER_NOW = "You have no commands left. Reply now with your final answer as a line `ANSWER: <your final answer>`."


@dataclass(frozen=True)
class Completion:
    """One reply of the model."""

    text: str
    usage: dict[str, int] = field(default_factory=dict)
    """Token counts as the server reported them (``prompt_tokens``, ``completion_tokens``, ``total_tokens``)."""
    finish_reason: str | None = None
    attempts: int = 1
    """Requests it took (retries included)."""


@dataclass(frozen=True, kw_only=True)
class ChatLimits:
    """Bounds of one attempt's conversation."""

    max_tokens: int = 2048
    """Tokens per reply."""
    max_turns: int | None = None
    """Replies in an action episode, the final-answer request aside. None: the task's ``max_steps`` (or the
    episode's), else ``DEFAULT_MAX_TURNS``; a number is still capped by the task's limit."""
    max_chars: int = 400_000
    """Characters in the whole conversation; no request is made beyond it."""
    max_total_tokens: int | None = None
    """Tokens (the server's ``total_tokens``, summed over requests) one attempt may use; None: unbounded."""
    max_reply_chars: int | None = None
    """Characters kept of one reply; the rest is cut (and counted in ``usage["clipped_replies"]``). None:
    ``max(65536, 32 * max_tokens)``, more than any honest reply of ``max_tokens`` tokens holds."""

    @property
    def reply_chars(self) -> int:
        return self.max_reply_chars or max(65_536, 32 * self.max_tokens)

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_chars < 1 or (self.max_turns is not None and self.max_turns < 1) \
                or (self.max_total_tokens is not None and self.max_total_tokens < 1) \
                or (self.max_reply_chars is not None and self.max_reply_chars < 1):
            raise ValueError(f"chat limits must be positive: {self}")


_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w.+-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.DOTALL | re.MULTILINE)
_PYTHON = frozenset({"python", "py", "python3"})
_SHELL = frozenset({"sh", "bash", "shell", "console", ""})
# Markdown around the marker is common ("**ANSWER:** 42", "- ANSWER: `42`") and not part of the answer.
_ANSWER = re.compile(r"^[ \t>*_#-]*ANSWER[*_]*:[*_]*[ \t]*(.*)$", re.MULTILINE)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced code block, in order; an unclosed last block runs to the end."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def extract_code(text: str, entry_point: str | None) -> str:
    """The submission in a reply to a code task (see the module's docstring)."""
    blocks = fenced_blocks(text)
    python = [body for lang, body in blocks if lang in _PYTHON]
    defining = [body for lang, body in blocks if lang in _PYTHON | {""}
                and re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point or '')}\s*\(", body, re.MULTILINE)]
    if entry_point and defining:
        return defining[-1]
    if python:
        return python[-1]
    return text


def parse_action(text: str) -> tuple[str | None, str | None]:
    """``(command, answer)`` of a reply in an action episode; an answer wins over a command."""
    outside = _FENCE.sub("", text)
    answers = _ANSWER.findall(outside)
    if answers:
        return None, answers[-1].strip().strip("*`").strip()
    commands = [body.strip() for lang, body in fenced_blocks(text) if lang in _SHELL and body.strip()]
    return (commands[-1] if commands else None), None


def task_text(task: Task) -> str:
    """The task as the model reads it: the prompt, and the answer format where the prompt lacks it."""
    text = task.prompt.rstrip()
    if task.answer_format and task.answer_format not in text:
        text += f"\n\n{task.answer_format}"
    if task.kind == "submission" and task.entry_point:
        text += "\n\n" + CODE_INSTRUCTIONS.format(entry_point=task.entry_point)
    return text


def observation_text(obs: Observation) -> str:
    status = "none (the command did not run, or did not exit by itself)" if obs.exit_code is None \
        else str(obs.exit_code)
    # A fence longer than any run of backticks in the output, so that the output cannot close it.
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", obs.output)), default=0))
    text = f"Exit status: {status}\nOutput:\n{fence}\n{obs.output}\n{fence}"
    return f"{text}\n\n{ANSWER_NOW}" if obs.done else text


def turn_limit(task: Task, episode: Episode | None, limits: ChatLimits) -> int:
    bound = task.metadata.get("max_steps") or getattr(episode, "max_steps", None)
    bound = bound if isinstance(bound, int) and bound > 0 else None
    if limits.max_turns is None:
        return bound or DEFAULT_MAX_TURNS
    return min(limits.max_turns, bound) if bound else limits.max_turns


class _Conversation:
    """One attempt's messages, usage and budget."""

    def __init__(self, agent: ChatAgent, policy_version: int, system: str, user: str) -> None:
        self.agent = agent
        self.limits = agent.limits
        self.policy_version = policy_version
        self.messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.usage: dict[str, Any] = {"requests": 0, "retries": 0}
        problem = self.over_budget()
        if problem:
            # Not the policy's failure: this agent's limits cannot hold the task at all.
            raise AgentError(f"{problem} before the model said anything: raise the agent's limits")

    def over_budget(self) -> str | None:
        chars = sum(len(m["content"]) for m in self.messages)
        if chars > self.limits.max_chars:
            return f"the conversation reached its budget of {self.limits.max_chars} characters"
        total = self.usage.get("total_tokens")
        if self.limits.max_total_tokens is not None and isinstance(total, int) \
                and total >= self.limits.max_total_tokens:
            return f"the attempt used its budget of {self.limits.max_total_tokens} tokens"
        return None

    async def ask(self) -> str:
        # The model sees a copy: a policy that kept (or mutated) the list must not change the record.
        reply = await self.agent.complete([dict(m) for m in self.messages], max_tokens=self.limits.max_tokens,
                                          policy_version=self.policy_version)
        # The reply enters the farm here: valid text (a lone surrogate in the server's JSON is a str
        # Python accepts and every encoder refuses) and bounded, both counted so the record says so.
        text, repaired = valid_text(reply.text)
        text, clipped = clip(text, self.limits.reply_chars)
        if repaired:
            self.usage["repaired_chars"] = self.usage.get("repaired_chars", 0) + repaired
        if clipped:
            self.usage["clipped_replies"] = self.usage.get("clipped_replies", 0) + 1
        self.messages.append({"role": "assistant", "content": text})
        self.usage["requests"] += 1
        self.usage["retries"] += reply.attempts - 1
        for key in USAGE_KEYS:
            if isinstance(reply.usage.get(key), int):
                self.usage[key] = self.usage.get(key, 0) + reply.usage[key]
        if reply.finish_reason == "length":
            self.usage["truncated_replies"] = self.usage.get("truncated_replies", 0) + 1
        return text

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


class ChatAgent(Agent):
    """An agent whose policy is a chat model; subclasses say how to reach the model (``complete``)."""

    def __init__(self, *, limits: ChatLimits | None = None) -> None:
        self.limits = limits or ChatLimits()

    @abc.abstractmethod
    async def complete(self, messages: list[Message], *, max_tokens: int, policy_version: int) -> Completion:
        """The model's reply to ``messages``. Raises ``EndpointError`` when the model cannot answer."""

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int) -> AgentResult:
        if task.kind == "actions":
            if episode is None:
                raise AgentError(f"{task.env}: an action task needs an open episode")
            return await self._actions(task, episode, policy_version)
        return await self._submission(task, policy_version)

    async def _submission(self, task: Task, policy_version: int) -> AgentResult:
        conv = _Conversation(self, policy_version, SUBMISSION_SYSTEM, task_text(task))
        started = time.monotonic()
        text = await conv.ask()
        final = extract_code(text, task.entry_point) if task.entry_point else text
        return AgentResult(attempt=Attempt(final=final), steps=[Step(final, None, None, time.monotonic() - started)],
                           usage=conv.usage, transcript=conv.messages)

    async def _actions(self, task: Task, episode: Episode, policy_version: int) -> AgentResult:
        turns = turn_limit(task, episode, self.limits)
        conv = _Conversation(self, policy_version, ACTIONS_SYSTEM.format(turns=turns), task_text(task))
        steps: list[Step] = []
        answer: str | None = None
        problem: str | None = None
        asked_for_answer = False
        for _ in range(turns):
            problem = conv.over_budget()
            if problem:
                break
            started = time.monotonic()
            command, answer = parse_action(await conv.ask())
            if answer is not None:
                break
            if command is None:
                conv.say(NO_COMMAND)
                continue
            obs = await episode.act(command)
            steps.append(Step(command, obs.output, obs.exit_code, time.monotonic() - started))
            conv.say(observation_text(obs))
            if obs.done:
                asked_for_answer = True
                break
        if answer is None and problem is None:
            if not asked_for_answer:
                conv.say(ANSWER_NOW)
            problem = conv.over_budget()
            if problem is None:
                _, answer = parse_action(await conv.ask())
                if answer is None:
                    problem = f"no final answer (after {len(steps)} commands)"
        return AgentResult(attempt=Attempt(final=answer or "", actions=[s.action for s in steps]), steps=steps,
                           usage=conv.usage, error=problem, transcript=conv.messages)
