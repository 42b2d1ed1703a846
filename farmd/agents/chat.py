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
- action tasks of an agent with ``tools`` on: the model is offered two tools
  (``TOOLS``), ``run`` with a ``command`` and ``answer`` with an ``answer``, in place
  of the text protocol. The assistant messages keep their tool calls, and each call
  is answered by a ``tool`` message: the observation for the call that ran (the last
  ``run``), a note for the others. An ``answer`` call ends the episode. A call with
  an unknown name or malformed arguments is the policy's mistake like a reply with
  no command: its note says what was wrong, and it uses a turn.

What is recorded (``AgentResult``): the conversation as sent and received
(``transcript``), one ``records.Turn`` per reply (``turns``: where it sits in the
conversation, its text as kept, the token ids, prompt token ids and sampling logprobs
the model's server returned (never made up: ``has_logprobs`` says whether there were
any), its finish reason as one of ``stop``, ``length``, ``tool_calls``,
``content_filter``, ``other`` or "" (unknown), its usage, latency and which choice of
its request it was), and what was asked for (``sampling``, whose ``n`` is the choices
the first request asked for: more than 1 when a group's first requests were one).
A reply's text is made valid and bounded as it comes in (``usage["repaired_chars"]``,
``usage["clipped_replies"]``); a clipped turn keeps the token ids it was sampled as.

Bounds: ``ChatLimits``. Running out of turns or budget is the policy's failure,
recorded in ``AgentResult.error`` and still verified; the model failing to answer
at all raises ``EndpointError``, and limits too small for the task's own prompt
raise ``AgentError``: neither is ever a score.
"""

from __future__ import annotations

import abc
import copy
import json
import re
import time
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

from farmd.agents.base import Agent, AgentResult, Step
from farmd.envs.base import Attempt, Episode, Observation, Task
from farmd.errors import AgentError
from farmd.records import MAX_ACTION_CHARS, ChatMessage, SamplingParams, ToolCall, Turn, Usage
from farmd.text import clip, valid_text

Message = dict[str, Any]
"""A message as it is sent: ``role`` and ``content``, and ``tool_calls`` or ``tool_call_id`` in tool use."""

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

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "run", "description": "Run one shell command and see its output and exit status.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string",
                                                                    "description": "The shell command to run."}},
                       "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give your final answer. This ends the task.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string",
                                                                   "description": "Your final answer."}},
                       "required": ["answer"]}}},
]
"""What an agent with ``tools`` on offers in action episodes, in OpenAI's tool format."""
TOOLS_SYSTEM = (
    "You solve tasks by running shell commands, one per turn.\n"
    "- To run a command, call the `run` tool with it (one call per reply; if there are several, the last is run). "
    "You will be shown its output and exit status.\n"
    "- When you are finished, call the `answer` tool with your final answer. If the task is checked on the files "
    "you leave rather than on an answer, answer `done` once they are in place.\n"
    "You have at most {turns} turns."
)
NO_TOOL_CALL = "Your reply called no tool. Call `run` with one command, or `answer` with your final answer."
NOT_RUN = "Not run: one command per turn, and only the last `run` call of a reply is run."
ANSWER_NOW_TOOLS = "You have no commands left. Call the `answer` tool now with your final answer."
_TOOL_FIELDS = {"run": "command", "answer": "answer"}

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter"})


def finish_reason(raw: str | None) -> str:
    """A server's finish reason in the record's closed set (``other`` for any other; "" when none)."""
    if not raw:
        return ""
    if raw == "function_call":  # the older name of tool calls
        return "tool_calls"
    return raw if raw in FINISH_REASONS else "other"


@dataclass(frozen=True)
class Completion:
    """One reply of the model, with what its server said about it (None where it said nothing)."""

    text: str
    usage: dict[str, int] = field(default_factory=dict)
    """Token counts as the server reported them (``prompt_tokens``, ``completion_tokens``, ``total_tokens``)."""
    finish_reason: str | None = None
    """As the server gave it; the record normalizes it (``finish_reason``)."""
    attempts: int = 1
    """Requests it took (retries included)."""
    token_ids: list[int] | None = None
    """The sampled tokens."""
    prompt_token_ids: list[int] | None = None
    """The prompt as the server tokenized it (chat template applied)."""
    logprobs: list[float] | None = None
    """The sampling logprob of each sampled token; None when the server returned none."""
    latency: float = 0.0
    """Seconds from asking to the reply, retries included."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    choice_index: int = 0
    """Which choice of its request this reply was (several when a group's first requests were one)."""
    n: int = 1
    """Choices its request asked for."""
    seed: int | None = None
    """The seed the request carried, if any."""
    policy_version: int | None = None
    """The policy version its server said sampled it (0: it could not say); None when the agent does not know."""


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


MAX_TOOL_ARGUMENT_CHARS = 4 * MAX_ACTION_CHARS
"""A tool call's JSON arguments (a command is kept up to ``MAX_ACTION_CHARS``; escapes may take a few times that)."""
_PYTHON = frozenset({"python", "py", "python3"})
_SHELL = frozenset({"sh", "bash", "shell", "console", ""})
# Markdown around the marker is common ("**ANSWER:** 42", "- ANSWER: `42`") and not part of the answer. Matched
# one line at a time: nothing in it can run past its line, so a reply costs its length.
_ANSWER = re.compile(r"[ \t>*_#-]*ANSWER[*_]*:[*_]*[ \t]*(.*)")

# A reply is read by scanning its lines once, never by a pattern that may backtrack across them: a fence
# regex with a lazy body read a 64k-character reply of one unclosed fence in seconds, and ``^\s*def`` over
# a block of blank lines took minutes. Everything here is linear in the reply's length.


@dataclass(frozen=True, slots=True)
class _Fence:
    language: str
    body: str
    start: int
    """Where the block starts (its opening line) and ends (after its closing fence, before that line's
    newline; the end of the text when it is never closed)."""
    end: int


def _opening(line: str) -> str | None:
    """The language of a line that opens a fenced block (indented by spaces or tabs, three backticks, then
    the language's letters), or None."""
    rest = line.lstrip(" \t")
    if not rest.startswith("```"):
        return None
    rest = rest[3:].lstrip(" \t")
    n = 0
    while n < len(rest) and (rest[n].isalnum() or rest[n] in "_.+-"):
        n += 1
    return rest[:n]


def _fences(text: str) -> list[_Fence]:
    """Each fenced block of ``text`` in order: opened by a line of ``` (an opening needs its newline), closed by
    the next line that is only ``` (spaces and tabs aside), or running to the end."""
    lines = text.split("\n")
    starts = [0] * len(lines)
    at = 0
    for i, line in enumerate(lines):
        starts[i] = at
        at += len(line) + 1
    out: list[_Fence] = []
    i = 0
    while i < len(lines) - 1:
        language = _opening(lines[i])
        if language is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip(" \t") != "```":
            j += 1
        if j == len(lines):  # never closed: the block runs to the end
            out.append(_Fence(language.lower(), text[starts[i + 1]:], starts[i], len(text)))
            break
        out.append(_Fence(language.lower(), text[starts[i + 1]:starts[j]], starts[i], starts[j] + len(lines[j])))
        i = j + 1
    return out


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced code block, in order; an unclosed last block runs to the end."""
    return [(f.language, f.body) for f in _fences(text)]


def _defines(body: str, name: str) -> bool:
    """Whether a line of ``body`` defines function ``name`` (``def name(``, ``async def name (``, indented)."""
    for line in body.split("\n"):
        words = line.strip()
        if words.startswith("async") and words[5:6].isspace():
            words = words[5:].lstrip()
        if words.startswith("def") and words[3:4].isspace() and words[3:].lstrip().startswith(name) \
                and words[3:].lstrip()[len(name):].lstrip().startswith("("):
            return True
    return False


def extract_code(text: str, entry_point: str | None) -> str:
    """The submission in a reply to a code task (see the module's docstring)."""
    blocks = fenced_blocks(text)
    python = [body for lang, body in blocks if lang in _PYTHON]
    defining = [body for lang, body in blocks if lang in _PYTHON | {""} and _defines(body, entry_point or "")]
    if entry_point and defining:
        return defining[-1]
    if python:
        return python[-1]
    return text


def parse_action(text: str) -> tuple[str | None, str | None]:
    """``(command, answer)`` of a reply in an action episode; an answer wins over a command."""
    fences = _fences(text)
    outside, at = [], 0
    for fence in fences:
        outside.append(text[at:fence.start])
        at = fence.end
    outside.append(text[at:])
    answers = [m.group(1) for line in "".join(outside).split("\n") if (m := _ANSWER.match(line))]
    if answers:
        return None, answers[-1].strip().strip("*`").strip()
    commands = [f.body.strip() for f in fences if f.language in _SHELL and f.body.strip()]
    return (commands[-1] if commands else None), None


def task_text(task: Task) -> str:
    """The task as the model reads it: the prompt, and the answer format where the prompt lacks it."""
    text = task.prompt.rstrip()
    if task.answer_format and task.answer_format not in text:
        text += f"\n\n{task.answer_format}"
    if task.kind == "submission" and task.entry_point:
        text += "\n\n" + CODE_INSTRUCTIONS.format(entry_point=task.entry_point)
    return text


def observation_text(obs: Observation, answer_now: str = ANSWER_NOW) -> str:
    status = "none (the command did not run, or did not exit by itself)" if obs.exit_code is None \
        else str(obs.exit_code)
    # A fence longer than any run of backticks in the output, so that the output cannot close it.
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", obs.output)), default=0))
    text = f"Exit status: {status}\nOutput:\n{fence}\n{obs.output}\n{fence}"
    return f"{text}\n\n{answer_now}" if obs.done else text


def turn_limit(task: Task, episode: Episode | None, limits: ChatLimits) -> int:
    bound = task.metadata.get("max_steps") or getattr(episode, "max_steps", None)
    bound = bound if isinstance(bound, int) and bound > 0 else None
    if limits.max_turns is None:
        return bound or DEFAULT_MAX_TURNS
    return min(limits.max_turns, bound) if bound else limits.max_turns


@dataclass(frozen=True)
class Move:
    """What one reply in an action episode does: run ``command``, end with ``answer``, or neither."""

    command: str | None = None
    answer: str | None = None
    call_id: str | None = None
    """In tool use: the call whose command is run."""
    notes: dict[str, str] = field(default_factory=dict)
    """In tool use: what each other call is answered with."""


def tool_move(calls: list[ToolCall]) -> Move:
    """The move of a reply's tool calls: an ``answer`` wins, else the last well-formed ``run``."""
    answers: list[str] = []
    runs: list[tuple[str, str]] = []
    notes: dict[str, str] = {}
    for call in calls:
        value, problem = tool_argument(call)
        if value is None:
            notes[call.id] = problem
        elif call.name == "answer":
            answers.append(value)
        else:
            runs.append((call.id, value))
    if answers:
        return Move(answer=answers[-1])
    if not runs:
        return Move(notes=notes)
    for call_id, _ in runs[:-1]:
        notes[call_id] = NOT_RUN
    return Move(command=runs[-1][1], call_id=runs[-1][0], notes=notes)


def tool_argument(call: ToolCall) -> tuple[str | None, str]:
    """``(value, "")`` of a well-formed ``run`` or ``answer`` call, else ``(None, what to tell the model)``."""
    name = _TOOL_FIELDS.get(call.name)
    if name is None:
        return None, f"There is no tool {call.name!r}: call `run` with a command or `answer` with your final answer."
    usage = f'`{call.name}` takes a JSON object with one string, {{"{name}": "..."}}'
    if len(call.arguments) > MAX_TOOL_ARGUMENT_CHARS:  # parsed on the event loop: bounded first
        return None, (f"The arguments of your `{call.name}` call are {len(call.arguments)} characters long, more "
                      f"than {MAX_TOOL_ARGUMENT_CHARS}: {usage}.")
    try:
        arguments = json.loads(call.arguments)
    except (ValueError, RecursionError):
        return None, f"The arguments of your `{call.name}` call are not valid JSON: {usage}."
    value = arguments.get(name) if isinstance(arguments, dict) else None
    if not isinstance(value, str):
        return None, f"The arguments of your `{call.name}` call lack the string {name!r}: {usage}."
    if call.name == "run" and not value.strip():
        return None, "The command of your `run` call is empty."
    return value.strip(), ""


class _Conversation:
    """One attempt's messages, turns, usage and budget."""

    def __init__(self, agent: ChatAgent, task: Task, policy_version: int, system: str, user: str, *,
                 tools: bool = False, rollout_id: int = 0) -> None:
        self.agent = agent
        self.limits = agent.limits
        self.policy_version = policy_version
        self.tools = tools
        self.group: Hashable = (task.env, task.seed, task.difficulty, policy_version)
        """The group's task: the attempts of one group share it, and their first requests may be one."""
        self.messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.usage: dict[str, Any] = {"requests": 0, "retries": 0}
        self.turns: list[Turn] = []
        self.sampling = agent.sampling(policy_version, rollout_id)
        self.versions: list[int | None] = []
        """Each reply's ``Completion.policy_version``."""
        self.seed = self.sampling.seed if self.sampling is not None else None
        problem = self.over_budget()
        if problem:
            # Not the policy's failure: this agent's limits cannot hold the task at all.
            raise AgentError(f"{problem} before the model said anything: raise the agent's limits")

    def over_budget(self) -> str | None:
        chars = sum(len(m["content"]) + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls", ()))
                    for m in self.messages)
        if chars > self.limits.max_chars:
            return f"the conversation reached its budget of {self.limits.max_chars} characters"
        total = self.usage.get("total_tokens")
        if self.limits.max_total_tokens is not None and isinstance(total, int) \
                and total >= self.limits.max_total_tokens:
            return f"the attempt used its budget of {self.limits.max_total_tokens} tokens"
        return None

    async def ask(self) -> Completion:
        """The model's next reply, as kept (repaired and clipped), recorded as a message and a turn."""
        first = not self.turns
        # The model sees a copy: a policy that kept (or mutated) the list must not change the record.
        reply = await self.agent.complete(copy.deepcopy(self.messages), max_tokens=self.limits.max_tokens,
                                          policy_version=self.policy_version, tools=self.tools,
                                          group=self.group if first else None, seed=self.seed)
        # The reply enters the farm here: valid text (a lone surrogate in the server's JSON is a str
        # Python accepts and every encoder refuses) and bounded, both counted so the record says so.
        clipped: list[bool] = []
        text = self._kept(reply.text, clipped)
        index = len(self.messages)
        calls = [ToolCall(id=self._kept(c.id, clipped, 256) or f"call_{index}_{i}",
                          name=self._kept(c.name, clipped, 256), arguments=self._kept(c.arguments, clipped))
                 for i, c in enumerate(reply.tool_calls)]
        if any(clipped):
            self.usage["clipped_replies"] = self.usage.get("clipped_replies", 0) + 1
        message: Message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        self.messages.append(message)
        self.usage["requests"] += 1
        self.usage["retries"] += reply.attempts - 1
        self.versions.append(reply.policy_version)
        for key in USAGE_KEYS:
            if isinstance(reply.usage.get(key), int):
                self.usage[key] = self.usage.get(key, 0) + reply.usage[key]
        finish = finish_reason(reply.finish_reason)
        if finish == "length":
            self.usage["truncated_replies"] = self.usage.get("truncated_replies", 0) + 1
        turn_usage = {k: reply.usage[k] for k in USAGE_KEYS if isinstance(reply.usage.get(k), int)}
        # A clipped text no longer matches its token ids; they are kept all the same (they are what was
        # sampled), and the clip is flagged on the trajectory.
        self.turns.append(Turn(
            message_index=index, prompt_messages=index, completion=text,
            prompt_token_ids=list(reply.prompt_token_ids or []), token_ids=list(reply.token_ids or []),
            logprobs=list(reply.logprobs or []), has_logprobs=reply.logprobs is not None, finish_reason=finish,
            usage=Usage(**turn_usage, requests=1, retries=reply.attempts - 1), latency=reply.latency,
            choice_index=reply.choice_index))
        if first and self.sampling is not None:
            self.sampling.n = reply.n
            if reply.seed is not None:  # a coalesced request carried its first attempt's seed
                self.seed = self.sampling.seed = reply.seed
        return replace(reply, text=text, tool_calls=calls)

    def sampled_version(self) -> int | None:
        """The version every reply was sampled with, as their servers said; 0 when they differ or one could not
        say; None when the agent does not know (then the job's own stands)."""
        known = set(self.versions)
        if known <= {None}:
            return None
        return known.pop() if len(known) == 1 else 0

    def _kept(self, text: str, clipped: list[bool], bound: int | None = None) -> str:
        text, repaired = valid_text(text)
        text, cut = clip(text, bound or self.limits.reply_chars)
        if repaired:
            self.usage["repaired_chars"] = self.usage.get("repaired_chars", 0) + repaired
        clipped.append(cut)
        return text

    def transcript(self) -> list[ChatMessage]:
        return [ChatMessage(role=m["role"], content=m["content"], tool_call_id=m.get("tool_call_id", ""),
                            tool_calls=[ToolCall(id=c["id"], name=c["function"]["name"],
                                                 arguments=c["function"]["arguments"])
                                        for c in m.get("tool_calls", ())])
                for m in self.messages]

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def answer_calls(self, move: Move, observation: str | None) -> None:
        """Answer the last reply: its move's observation (or, with no command, a reminder); in tool use one
        ``tool`` message per call, in order."""
        calls = self.messages[-1].get("tool_calls", [])
        if not self.tools:
            self.say(NO_COMMAND if observation is None else observation)
        elif not calls:
            self.say(NO_TOOL_CALL)
        else:
            for call in calls:
                content = observation if call["id"] == move.call_id and observation is not None \
                    else move.notes.get(call["id"], NOT_RUN)
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})

    def move(self, reply: Completion) -> Move:
        if self.tools:
            return tool_move(reply.tool_calls)
        command, answer = parse_action(reply.text)
        return Move(command=command, answer=answer)


class ChatAgent(Agent):
    """An agent whose policy is a chat model; subclasses say how to reach the model (``complete``)."""

    tools: bool = False
    """Offer action episodes the ``run`` and ``answer`` tools (``TOOLS``) instead of the text protocol."""

    def __init__(self, *, limits: ChatLimits | None = None) -> None:
        self.limits = limits or ChatLimits()

    @abc.abstractmethod
    async def complete(self, messages: list[Message], *, max_tokens: int, policy_version: int, tools: bool = False,
                       group: Hashable | None = None, seed: int | None = None) -> Completion:
        """The model's reply to ``messages``. Raises ``EndpointError`` when the model cannot answer.

        ``tools``: offer ``TOOLS``. ``group``: given with an attempt's first request only, the same for every
        attempt of one group (its task and policy version); a model server may answer the group's identical
        first requests with the choices of one request. ``seed``: the attempt's (``sampling``), if any."""

    def sampling(self, policy_version: int, rollout_id: int = 0) -> SamplingParams | None:
        """What rollout ``rollout_id``'s requests ask the model to sample with; None when the agent does not know."""
        return None

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        if task.kind == "actions":
            if episode is None:
                raise AgentError(f"{task.env}: an action task needs an open episode")
            return await self._actions(task, episode, policy_version, rollout_id)
        return await self._submission(task, policy_version, rollout_id)

    async def _submission(self, task: Task, policy_version: int, rollout_id: int) -> AgentResult:
        conv = _Conversation(self, task, policy_version, SUBMISSION_SYSTEM, task_text(task), rollout_id=rollout_id)
        started = time.monotonic()
        text = (await conv.ask()).text
        final = extract_code(text, task.entry_point) if task.entry_point else text
        return AgentResult(attempt=Attempt(final=final), steps=[Step(final, None, None, time.monotonic() - started)],
                           usage=conv.usage, transcript=conv.transcript(), turns=conv.turns,
                           sampling=conv.sampling, policy_version=conv.sampled_version())

    async def _actions(self, task: Task, episode: Episode, policy_version: int, rollout_id: int) -> AgentResult:
        turns = turn_limit(task, episode, self.limits)
        system, answer_now = (TOOLS_SYSTEM, ANSWER_NOW_TOOLS) if self.tools else (ACTIONS_SYSTEM, ANSWER_NOW)
        conv = _Conversation(self, task, policy_version, system.format(turns=turns), task_text(task),
                             tools=self.tools, rollout_id=rollout_id)
        steps: list[Step] = []
        answer: str | None = None
        problem: str | None = None
        asked_for_answer = False
        for _ in range(turns):
            problem = conv.over_budget()
            if problem:
                break
            started = time.monotonic()
            move = conv.move(await conv.ask())
            if move.answer is not None:
                answer = move.answer
                break
            if move.command is None:
                conv.answer_calls(move, None)
                continue
            obs = await episode.act(move.command)
            steps.append(Step(move.command, obs.output, obs.exit_code, time.monotonic() - started, obs.violations))
            conv.answer_calls(move, observation_text(obs, answer_now))
            if obs.done:
                asked_for_answer = True
                break
        if answer is None and problem is None:
            if not asked_for_answer:
                conv.say(answer_now)
            problem = conv.over_budget()
            if problem is None:
                answer = conv.move(await conv.ask()).answer
                if answer is None:
                    problem = f"no final answer (after {len(steps)} commands)"
        return AgentResult(attempt=Attempt(final=answer or "", actions=[s.action for s in steps]), steps=steps,
                           usage=conv.usage, error=problem, transcript=conv.transcript(), turns=conv.turns,
                           sampling=conv.sampling, policy_version=conv.sampled_version())
