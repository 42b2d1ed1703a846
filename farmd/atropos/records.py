"""A pushed Atropos group as farm trajectories: one per sequence, so the console, ``farmctl trajectories``,
the export and farm's own trainer streams see what Atropos environments sent beside farm's rollouts.

The group as pushed stays the source of truth (what ``/batch`` hands out, byte for byte); these are farm's
view of it, built where the group was checked (off the event loop):

- the tokens become turns, one per run of trained positions (mask not -100), each with everything before
  it as its prompt, so ``farm_client.sequences.token_rows`` gives back the sequence with its loss mask;
  ``inference_logprobs``, when the environment sent one per token, become the turns' sampling logprobs;
- the score is the reward, ``passed`` when it is above 0, flagged ``external_score``: the environment
  scored it, farm's verifier never saw it;
- the messages, when sent, become the conversation (content that is not text is kept as its JSON);
- what a trajectory has no field for (advantages, ref logprobs, overrides, generation parameters, and masks
  or logprobs the turns cannot say) is kept in ``verdict_details["atropos"]`` (per-token rows while they
  fit a bound), so an export holds what was pushed.

Names are the queue's to give (it knows the registered environments): ``name`` fills them in.
"""

from __future__ import annotations

import json
import re
from typing import Any

from farmd.flags import EXTERNAL_SCORE
from farmd.records import (
    MAX_DETAILS_CHARS,
    MAX_MESSAGES,
    MAX_TOKEN_ENTRIES,
    ChatMessage,
    PosedTask,
    Trajectory,
    Turn,
    evolve,
)

AGENT = "atropos"
"""Whose attempts pushed groups are: an Atropos environment's own inference (farm does not know the model)."""
ENV_PREFIX = "atropos:"
VERIFIER_VERSION = "atropos-env"
_IGNORED = -100
_MAX_TURNS = 64
"""Trained runs in one sequence kept as turns; past this the rest of the sequence is one turn (the exact
masks are in the details)."""
_MAX_DETAILS = 4 * MAX_DETAILS_CHARS
"""Per-token rows of one sequence kept in its details at most (as JSON characters, counted generously). They are
numbers, not text, so they are held to this rather than to the seal's bound on details (64 KiB), which a
sequence of a few thousand tokens would pass."""
_CHARS_PER_NUMBER = 26
"""The most a number takes as JSON: a float's shortest repr (24 at most), a separator, a sign to spare."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def env_name(desired_name: str | None) -> str:
    """The farm environment an Atropos environment's groups are listed under (``atropos`` when a group
    names no registered environment)."""
    if not desired_name:
        return "atropos"
    return ENV_PREFIX + (_UNSAFE.sub("_", desired_name)[:64] or "_")


def is_atropos_env(name: str) -> bool:
    """A name ``env_name`` gives."""
    return name == "atropos" or (name.startswith(ENV_PREFIX) and _UNSAFE.search(name[len(ENV_PREFIX):]) is None
                                 and 0 < len(name) - len(ENV_PREFIX) <= 64)


def as_trajectories(group: dict[str, Any]) -> list[Trajectory]:
    """One unnamed trajectory per sequence of a checked group (``farmd.atropos.groups.scored_group``),
    sealed to the record's bounds."""
    out = []
    logprob_rows = group.get("inference_logprobs")
    plain: tuple[Trajectory, dict[str, Any]] | None = None
    """A sequence's record that sealing left as it was, with its details as sealed: see ``_like``."""
    for i, tokens in enumerate(group["tokens"]):
        score = float(group["scores"][i])
        masks = group["masks"][i]
        logprobs = logprob_rows[i] if logprob_rows is not None and len(logprob_rows[i]) == len(tokens) else None
        messages = _conversation(group["messages"][i]) if _has(group.get("messages"), i) else []
        details: dict[str, Any] = {"index": i}
        for name in ("generation_params", "group_overrides"):
            if group.get(name) is not None:
                details[name] = group[name]
        if _has(group.get("overrides"), i):
            details["overrides"] = group["overrides"][i]
        turns, exact = _turns(tokens, masks, logprobs, messages)
        record = _like(plain, i, score, turns) if plain is not None and _plain(messages, details, turns) else None
        if record is None:
            record = Trajectory(
                id=0, group_id=0, env="atropos", env_version="", seed=0, difficulty=0, agent=AGENT, policy_version=0,
                reward=score, passed=score > 0, status="ok",
                reasons=["scored by the Atropos environment that pushed it; farm's verifier did not judge it"],
                flags=[EXTERNAL_SCORE], verifier_version=VERIFIER_VERSION, node="atropos",
                verdict_details={"atropos": details}, messages=messages,
                task=PosedTask(prompt=next((m.content for m in messages if m.role == "user"), ""),
                               metadata={"source": "atropos"}),
                turns=turns).sealed()
            if plain is None and _plain(messages, details, turns) and record.flags == [EXTERNAL_SCORE] \
                    and record.verdict_details == {"atropos": details} \
                    and len(json.dumps(record.verdict_details, default=str)) + _INDEX_SLACK <= MAX_DETAILS_CHARS:
                plain = record, dict(details)
        out.append(record)
        # Per-token rows the turns do not already say join after the seal: they are numbers the group's check
        # found finite, and walking them as JSON trees was half of a push's time. Masks that are the tokens
        # where trained and -100 elsewhere, and logprobs one per token, are in the turns.
        per_token = {name: group[name][i] for name in ("advantages", "ref_logprobs") if _has(group.get(name), i)}
        if not exact or not _masks_are_turns(masks, tokens, turns):
            per_token["masks"] = masks
        if logprobs is None and logprob_rows is not None and _has(logprob_rows, i):
            per_token["inference_logprobs"] = logprob_rows[i]  # not one per token: kept as sent
        kept = out[-1].verdict_details.get("atropos")
        if kept is not None and per_token:
            if sum(len(row) for row in per_token.values()) * _CHARS_PER_NUMBER <= _MAX_DETAILS:
                kept.update(per_token)
            else:
                kept["per_token"] = "over the record's bound: kept with the Atropos group as pushed"
    return out


_INDEX_SLACK = 8
"""Characters a sequence's index may add to details that were sealed under another index (at most 4096
sequences: four digits), and a margin; measured as the seal measures details (``json.dumps`` of them all)."""


def _plain(messages: list[ChatMessage], details: dict[str, Any], turns: list[Turn]) -> bool:
    """Whether sealing a sequence's record can change nothing but what it shares with its group's other plain
    sequences: no conversation, no overrides of its own, and turns within the record's token budget (their text
    is empty: there are no messages to take it from)."""
    return not messages and "overrides" not in details and len(turns) <= MAX_MESSAGES and \
        sum(len(t.prompt_token_ids) + len(t.token_ids) + len(t.logprobs) for t in turns) <= MAX_TOKEN_ENTRIES


def _like(plain: tuple[Trajectory, dict[str, Any]], index: int, score: float, turns: list[Turn]) -> Trajectory:
    """A plain sequence's record made from another plain sequence's of the same group, sealed already (one seal a
    group, where each sequence's was a seventh of a push's time): what differs between them (the score, the
    turns, the index in the details) is what sealing leaves as it is for a plain sequence (``_plain``). A test
    holds this to sealing each record on its own."""
    sealed, details = plain
    return evolve(sealed, reward=score, passed=score > 0, turns=turns, reasons=list(sealed.reasons),
                  flags=list(sealed.flags), verdict_details={"atropos": {**details, "index": index}}, messages=[],
                  steps=[], scores=[])


def name(records: list[Trajectory], *, env: str, group: int) -> None:
    """Where the queue put them: the environment they are listed under, and the Atropos group (``seed``).
    Both are columns, not the stored body: the body is packed before the queue names them."""
    for t in records:
        t.env = env
        t.seed = group


def _masks_are_turns(masks: list[int], tokens: list[int], turns: list[Turn]) -> bool:
    """Whether the masks are the tokens where trained and -100 elsewhere, as the turns say them (made by
    ``_turns`` with no runs merged): each turn's span of the masks equals its tokens, slice to slice (C loops,
    where a Python loop over every position was a tenth of a push's time); outside the turns they are -100 by how
    the runs were found."""
    return all(masks[len(t.prompt_token_ids):len(t.prompt_token_ids) + len(t.token_ids)] == t.token_ids
               for t in turns)


def _has(rows: Any, i: int) -> bool:
    return isinstance(rows, list) and i < len(rows) and rows[i] is not None


def _conversation(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    out = []
    for m in messages:
        content = m.get("content")
        out.append(ChatMessage(role=str(m.get("role")),
                               content=content if isinstance(content, str) else json.dumps(content)))
    return out


def untrained_prompt(masks: list[int]) -> int | None:
    """How long the untrained prompt (mask -100) is, when the masks have the common shape, a prompt not trained then
    a completion that is; None for any other. By C loops (``count``, ``in``), never a walk of every position."""
    ignored = masks.count(_IGNORED)
    return ignored if _IGNORED not in masks[ignored:] else None  # every ignored position is in the prefix


def _trained_runs(masks: list[int]) -> list[tuple[int, int]]:
    """Each run of trained positions (mask not -100) as (start, end). The common shape (``untrained_prompt``) is
    one run; others are walked position by position."""
    ignored = untrained_prompt(masks)
    if ignored is not None:
        return [(ignored, len(masks))] if ignored < len(masks) else []
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for j, m in enumerate(masks):
        if m != _IGNORED and start is None:
            start = j
        elif m == _IGNORED and start is not None:
            runs.append((start, j))
            start = None
    if start is not None:
        runs.append((start, len(masks)))
    return runs


def _turns(tokens: list[int], masks: list[int], logprobs: list[float] | None,
           messages: list[ChatMessage]) -> tuple[list[Turn], bool]:
    """The turns, and whether they say exactly which positions are trained (no runs were merged)."""
    runs = _trained_runs(masks)
    exact = True
    if len(runs) > _MAX_TURNS:
        runs, exact = [*runs[:_MAX_TURNS - 1], (runs[_MAX_TURNS - 1][0], runs[-1][1])], False
    # Each turn's prompt repeats all before it: a long sequence cut into many runs would be built as tens of
    # millions of ids only for the seal to drop them. Past the record's budget, one turn from the first
    # trained position on (the exact masks go to the details).
    if runs and sum(b for _, b in runs) * (2 if logprobs is not None else 1) > MAX_TOKEN_ENTRIES:
        runs, exact = [(runs[0][0], runs[-1][1])], len(runs) == 1
    replies = [k for k, m in enumerate(messages) if m.role == "assistant"]
    turns = []
    for n, (a, b) in enumerate(runs):
        index = replies[n] if n < len(replies) else len(messages)
        turns.append(Turn(message_index=index, prompt_messages=index,
                          completion=messages[index].content if index < len(messages) else "",
                          prompt_token_ids=tokens[:a], token_ids=tokens[a:b],
                          logprobs=logprobs[a:b] if logprobs is not None else [], has_logprobs=logprobs is not None))
    return turns, exact
