"""One trajectory as a person reads it (``farmctl trajectories show``).

Nearly everything in a trajectory was written by someone other than farm: the prompt by an
environment, the conversation by a model, steps and the final answer by an attempt, reasons and
details by a verifier fed that attempt. Each goes in as ``shown.text``, so it is shown, never obeyed.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from farmd.cli.shown import joined, text

MAX_SHOWN_CHARS = 4000
"""Of one block of text (a prompt, a message, an observation): the rest is left to ``--json``."""


def _block(value: str, indent: str = "    ") -> Text:
    """Multi-line text, escaped, indented, cut at ``MAX_SHOWN_CHARS`` with a note saying so."""
    cut = value[:MAX_SHOWN_CHARS].rstrip("\n")  # a program's last newline is no line of its own
    shown = text(cut, inline=False)
    lines = shown.split("\n", allow_blank=True)
    out = Text("\n").join(Text.assemble(indent, line) for line in lines)
    if len(value) > MAX_SHOWN_CHARS:
        out.append(f"\n{indent}... {len(value) - MAX_SHOWN_CHARS} more characters (--json shows all)", "dim")
    return out


def _when(seconds: float) -> str:
    if not seconds:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


def _verdict(reward: float, passed: bool, status: str) -> Text:
    if status == "error":
        return Text.assemble(("error", "red"), ": the verifier could not judge it (not a score)")
    return Text.assemble(f"reward {reward:.3f}, ", ("passed", "green") if passed else ("not passed", "yellow"))


def header(t: Any) -> list[RenderableType]:
    return [
        Text.assemble(Text(f"trajectory {t.id}", "bold"), " (seq ", str(t.seq), ", group ", str(t.group_id),
                      ", run ", str(t.run_id), ")"),
        Text.assemble("  env ", text(t.env), " version ", text(t.env_version), f"; seed {t.seed}, level ",
                      str(t.difficulty)),
        Text.assemble("  agent ", text(t.agent), f", policy version {t.policy_version}, on node ", text(t.node or "-")),
        Text.assemble(f"  started {_when(t.started_at)}, finished {_when(t.finished_at)}; ",
                      f"task {t.timings.task:.2f}s, agent {t.timings.agent:.2f}s, verify {t.timings.verify:.2f}s, "
                      f"total {t.timings.total:.2f}s"),
    ]


def task(t: Any) -> list[RenderableType]:
    p = t.task
    out: list[RenderableType] = [Text.assemble(Text("task", "bold"), " (", text(p.kind), ")")]
    if p.entry_point:
        out.append(Text.assemble("  entry point: ", text(p.entry_point)))
    if p.answer_format:
        out.append(Text.assemble("  answer format: ", text(p.answer_format)))
    out.append(_block(p.prompt or "(no prompt stored)"))
    return out


def conversation(t: Any) -> list[RenderableType]:
    if not t.messages:
        return [Text.assemble(Text("conversation", "bold"), ": none (the agent is not a model)")]
    s = t.sampling
    out: list[RenderableType] = [Text.assemble(
        Text("conversation", "bold"), f": {len(t.messages)} messages, {len(t.turns)} model turns; model ",
        text(s.model), f", temperature {s.temperature:g}, top_p {s.top_p:g}, max_tokens {s.max_tokens}, n {s.n}",
        f", seed {s.seed}" if s.seed is not None else "")]
    turns = {turn.message_index: turn for turn in t.turns}
    for i, m in enumerate(t.messages):
        line = Text.assemble(f"  [{i}] ", text(m.role, "bold"))
        if m.tool_call_id:
            line.append_text(Text.assemble(" answering ", text(m.tool_call_id)))
        turn = turns.get(i)
        if turn is not None:
            logprobs = "logprobs stored" if turn.has_logprobs else "no logprobs"
            line.append_text(Text.assemble(
                f"  (turn: {len(turn.prompt_token_ids)} prompt tokens, {len(turn.token_ids)} completion tokens, "
                f"{logprobs}, finish ", text(turn.finish_reason or "unknown"), f", {turn.latency:.2f}s)"))
        out.append(line)
        out.append(_block(m.content))
        for call in m.tool_calls:
            out.append(Text.assemble("    tool call ", text(call.name), " (", text(call.id), "): ",
                                     text(call.arguments)))
    u = t.usage
    out.append(Text(f"  usage: {u.prompt_tokens} prompt + {u.completion_tokens} completion = {u.total_tokens} "
                    f"tokens in {u.requests} requests ({u.retries} retried)"))
    return out


def steps(t: Any) -> list[RenderableType]:
    out: list[RenderableType] = [Text.assemble(Text("steps", "bold"), f": {len(t.steps)}")]
    for i, step in enumerate(t.steps):
        code = "did not exit by itself" if step.exit_code is None else f"exit {step.exit_code}"
        line = Text(f"  [{i}] {code}, {step.duration:.2f}s")
        if step.violations:
            line.append_text(Text.assemble(", violations: ", joined(step.violations, ", ")))
        out.append(line)
        out.append(_block(f"$ {step.action}" if step.action else "(the submission: see final)"))
        if step.observation:
            out.append(_block(step.observation, "      "))
    return out


def final(t: Any) -> list[RenderableType]:
    out: list[RenderableType] = [Text("final", "bold"), _block(t.final or "(nothing was submitted)")]
    if t.agent_error:
        out.append(Text.assemble(Text("agent error: ", "red"), text(t.agent_error)))
    return out


def verdict(t: Any) -> list[RenderableType]:
    which = "the first" if not t.verdict_version else f"verdict {t.verdict_version}"
    out: list[RenderableType] = [Text.assemble(Text("verdict", "bold"), f" (current: {which}; verifier ",
                                               text(t.verifier_version), "): ", _verdict(t.reward, t.passed, t.status))]
    if t.flags:
        out.append(Text.assemble("  flags: ", joined(t.flags, ", ")))
    out += [Text.assemble("  - ", text(reason)) for reason in t.reasons]
    if t.verdict_details:
        out.append(Text.assemble("  details: ", text(json.dumps(t.verdict_details, ensure_ascii=False)[:1000])))
    if len(t.scores) > 1 or any(s.verdict_version for s in t.scores):  # more than the verdict shown above
        table = Table("", "verdict version", "verifier version", "verdict", "flags", "reasons", "scored at",
                      title="every verdict it was given")
        for s in t.scores:
            mark = "current" if s.verdict_version == t.verdict_version else ("first" if not s.verdict_version else "")
            table.add_row(mark, str(s.verdict_version), text(s.verifier_version), _verdict(s.reward, s.passed, s.status),
                          joined(s.flags, ", "), joined(s.reasons, "; "), _when(s.scored_at))
        out.append(table)
    return out


def trajectory_view(t: Any) -> Group:
    """Everything of a record (``farmd.records.Trajectory`` or the client's twin), section by section."""
    parts: list[RenderableType] = []
    for section in (header, task, conversation, steps, final, verdict):
        parts += section(t)
        parts.append(Text(""))
    return Group(*parts[:-1])
