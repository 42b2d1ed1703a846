"""Every number of a trajectory in its domain, checked in one place: what may enter the store, and what a
reader may serve.

A record is written once and read by every stream, listing, console page and export after it, so a number
out of its domain is not one bad record: a NaN reward makes a whole group's advantages NaN, a token id the
wire's ``uint32`` cannot hold (negative, or past 2**32) or a number past int64 makes every read that meets it
fail, and JSON nested deeper than protobuf's decoder goes makes the reader's parse fail. So each entry (a
node's result, an Atropos push, a model endpoint's reply, the torch policy's own output, a contributed
environment's task) refuses what is out of its domain, naming each problem, and each reader of stored
records checks again and serves what it cannot read as a stub that says so (``unreadable``).

The domains, and why each bound is where it is:

- reward: finite, in [0, 1] (a farm verifier's scale); a score an Atropos environment pushed (flagged
  ``external_score``) in ``[-EXTERNAL_SCORE_BOUND, EXTERNAL_SCORE_BOUND]``: Atropos's convention is 1.0 right,
  -1.0 wrong, and its own API tests push 2.0. ``passed`` only with a reward above 0; an ``error`` verdict is
  never a score (reward 0, not passed).
- token ids: integers in [0, 2**31) (int32, what torch, vLLM and Atropos's trainers index with; the wire's
  ``uint32`` would take up to 2**32), and below the vocabulary's size where it is known.
- logprobs: finite and at most ``LOGPROB_SLACK`` (a sampled token's probability is at most 1); at least
  ``-FLOAT32_MAX``, since they travel as 32-bit floats and a larger magnitude arrives as -inf.
- ids, versions, counts: non-negative integers within int64 (SQLite's integers; the protos' uint64 and
  uint32 fields hold that much or are checked to their own width); seeds within int64; exit codes int32.
- times: finite, non-negative, within what ``google.protobuf.Duration`` (10,000 years) and ``Timestamp``
  (up to 9999-12-31) carry.
- JSON trees (task examples and metadata, verdict details, extra sampling fields): at most
  ``MAX_JSON_DEPTH`` deep, keys text, integers within int64, floats finite, except in a verdict's details:
  a verifier's own figures may hold an infinity (a speedup interval's open end), which every reader carries
  (``farm_client.convert`` reads it, the console shows it as text, protobuf's ``Struct`` holds it).

The standard library, the record types and msgspec (a leaf library: its C checks of a list of numbers), so every
floor may import it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import msgspec

from farmd.errors import OutOfDomain
from farmd.flags import EXTERNAL_SCORE, UNREADABLE
from farmd.records import MAX_NAME_CHARS, MAX_REASON_CHARS, Trajectory, Turn
from farmd.text import bounded

__all__ = ["EXTERNAL_SCORE_BOUND", "INT64_MAX", "LOGPROB_SLACK", "MAX_JSON_DEPTH", "TOKEN_ID_BOUND", "bad_logprob",
           "bad_token_id", "check", "logprobs_problem", "problems", "reward_problem", "time_problem",
           "token_ids_problem", "tree_problem", "unreadable"]

INT64_MAX = (1 << 63) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
TOKEN_ID_BOUND = 1 << 31
"""Token ids are below this (int32's range): every tokenizer farm meets has fewer than 2**31 tokens, and the
trainers that index embeddings with them use int32 or int64."""
LOGPROB_SLACK = 1e-3
"""How far above 0 a logprob may read and still be taken as 0. A server that computes a probability near 1 in
half precision and logs it can read up to one rounding step (2**-10 in float16) above it; a positive logprob
past that is no probability at all (Atropos marks unsampled positions with 1.0, and a bug or a forger writes
anything). It also never moves a trainer's importance ratio by more than 0.1%."""
FLOAT32_MAX = 3.4028234663852886e38
MAX_DURATION_S = 315_576_000_000
"""``google.protobuf.Duration``'s range: about 10,000 years."""
MAX_TIME_S = 253_402_300_799
"""``google.protobuf.Timestamp``'s last second: 9999-12-31T23:59:59Z."""
MAX_JSON_DEPTH = 16
"""Containers nested in one JSON tree of a record, the tree itself counted (``{"a": [1]}`` is 2 deep). The
tightest reader is protobuf's decoder (upb), which refuses a message nested more than 100 deep; a JSON object
is three levels there (``Struct``, its map entry, ``Value``) and a list two, and a record's trees sit three
or four levels down a stream message, so a tree 33 objects deep is refused on the trainer's side (measured
in task metadata; 32 decodes). 16 is half of that. The others are far off: orjson writes 254 levels and reads
1024, Python's ``json`` about 1000 (its recursion limit)."""
EXTERNAL_SCORE_BOUND = 1e6
"""The largest magnitude of a score an Atropos environment pushed: any scale such an environment scores on
(±1 by Atropos's convention, 0..10 judges), and far from where a group's mean or variance overflows (a
group-relative advantage squares rewards: 4096 sequences of 1e12 are nowhere near 1.8e308)."""
REWARD_RANGE = (0.0, 1.0)

_BOUNDED_COUNT = (0, INT64_MAX)
_UINT32 = (0, UINT32_MAX)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_problem(value: object, where: str, low: int, high: int) -> str | None:
    if not _is_int(value):
        return f"{where} is {_shown(value)}, not an integer"
    assert isinstance(value, int)
    if not low <= value <= high:
        return f"{where} is {_shown(value)}, outside {low}..{high}"
    return None


def _float_problem(value: object, where: str, low: float, high: float) -> str | None:
    if not _is_number(value):
        return f"{where} is {_shown(value)}, not a number"
    assert isinstance(value, int | float)
    if not math.isfinite(value):
        return f"{where} is {_shown(value)}, not finite"
    if not low <= value <= high:
        return f"{where} is {_shown(value)}, outside {low:g}..{high:g}"
    return None


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        return f"an integer of {value.bit_length()} bits"  # repr of a huge one can fail (4300 digits at most)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def reward_problem(reward: object, passed: object, status: object, *, external: bool = False) -> str | None:
    """What is wrong with a verdict's numbers, or None: the reward in its domain (see the module), ``passed``
    a bool and only with a reward above 0, an ``error`` verdict no score."""
    low, high = (-EXTERNAL_SCORE_BOUND, EXTERNAL_SCORE_BOUND) if external else REWARD_RANGE
    problem = _float_problem(reward, "the reward", low, high)
    if problem is not None:
        return problem
    if not isinstance(passed, bool):
        return f"passed is {_shown(passed)}, not true or false"
    if status not in ("ok", "error"):
        return f"the verdict's status is {_shown(status)}, not ok or error"
    assert isinstance(reward, int | float)
    if passed and reward <= 0:
        return f"passed with a reward of {reward:g}: a pass is rewarded"
    if status == "error" and (passed or reward != 0):
        return "an error verdict is no score, yet it carries a reward or a pass"
    return None


def _all_within(values: Sequence[Any], shape: Any) -> bool:
    """Whether msgspec takes ``values`` as ``shape`` (a list of numbers within bounds), in C: several times faster than
    the type, min and max passes it replaced, for the lists of thousands a record's turns hold. Never the last word
    on a refusal: what it refuses (a tuple of another kind, say) is walked for the place, which may find nothing."""
    try:
        msgspec.convert(values, shape)
    except (msgspec.ValidationError, TypeError):
        return False
    return True


TokenId = Annotated[int, msgspec.Meta(ge=0, lt=TOKEN_ID_BOUND)]
"""A token id as msgspec checks one: an integer (not a bool) in [0, 2**31) (``_token_ids_below`` for a known
vocabulary's)."""


@functools.cache
def _token_ids_below(high: int) -> Any:
    return list[Annotated[int, msgspec.Meta(ge=0, lt=high)]]


_LOGPROBS = list[Annotated[float, msgspec.Meta(ge=-FLOAT32_MAX, le=LOGPROB_SLACK)]]
"""Floats (or integers, as floats) in [-FLOAT32_MAX, LOGPROB_SLACK]: a NaN or an infinity is outside."""


def bad_token_id(ids: Sequence[Any], vocab: int | None = None) -> tuple[int, str] | None:
    """The first token id that is not an integer in [0, 2**31) (below ``vocab`` when it is known), as (its
    index, why); None when all are. Checked by C loops; only a list that fails is walked, for the place."""
    high = TOKEN_ID_BOUND if vocab is None else min(vocab, TOKEN_ID_BOUND)
    if not ids or _all_within(ids, _token_ids_below(high)):
        return None
    for i, token in enumerate(ids):
        problem = _int_problem(token, "it", 0, high - 1)
        if problem is not None:
            return i, problem.removeprefix("it ") + ("" if vocab is None else f" (the vocabulary has {vocab} tokens)")
    return None


def token_ids_problem(ids: Sequence[Any], where: str, vocab: int | None = None) -> str | None:
    """What is wrong with a list of token ids (see ``bad_token_id``), or None."""
    bad = bad_token_id(ids, vocab)
    return None if bad is None else f"{where}[{bad[0]}] {bad[1]}"


def bad_logprob(logprobs: Sequence[Any]) -> tuple[int, str] | None:
    """The first sampling logprob that is not finite, above ``LOGPROB_SLACK`` or past float32's range, as (its
    index, why); None when all are fine. Checked by C loops as ``bad_token_id`` is."""
    if not logprobs or _all_within(logprobs, _LOGPROBS):
        return None
    for i, value in enumerate(logprobs):
        problem = _float_problem(value, "it", -FLOAT32_MAX, LOGPROB_SLACK)
        if problem is not None:
            positive = _is_number(value) and math.isfinite(value) and value > 0
            return i, problem.removeprefix("it ") + (": a sampled token's logprob is at most 0" if positive else "")
    return None


def logprobs_problem(logprobs: Sequence[Any], where: str) -> str | None:
    """What is wrong with a list of sampling logprobs (see ``bad_logprob``), or None."""
    bad = bad_logprob(logprobs)
    return None if bad is None else f"{where}[{bad[0]}] {bad[1]}"


def tree_problem(value: Any, where: str, max_depth: int = MAX_JSON_DEPTH, *, finite: bool = True) -> str | None:
    """What is wrong with a JSON tree, or None: at most ``max_depth`` containers deep, object keys text,
    integers within int64, floats finite (``finite=False``: infinities and NaN allowed), nothing but JSON's
    kinds. Walked with a stack of its own, so a tree
    of any depth is refused rather than taking Python's recursion limit with it; a list of numbers alone (an
    Atropos group's per-token rows, kept in its details) is checked by C loops."""
    return None if _tree_fine(value, max_depth, finite) else _walk_tree(value, where, max_depth, finite)


def _walk_tree(value: Any, where: str, max_depth: int, finite: bool) -> str | None:
    stack: list[tuple[Any, int, Any]] = [(value, 0, None)]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str) or node is None or isinstance(node, bool):
            continue
        if isinstance(node, int):
            if not -INT64_MAX - 1 <= node <= INT64_MAX:
                return f"{_path(where, path)} is an integer past int64 ({node.bit_length()} bits)"
            continue
        if isinstance(node, float):
            if finite and not math.isfinite(node):
                return f"{_path(where, path)} is {node!r}, not a finite number"
            continue
        if isinstance(node, dict | list | tuple):
            if depth + 1 > max_depth:
                return f"{where} is nested more than {max_depth} deep (at {_path(where, path)})"
            if isinstance(node, dict):
                for key, item in node.items():
                    if not isinstance(key, str):
                        return f"{_path(where, path)} has a key {_shown(key)} that is not text"
                    stack.append((item, depth + 1, (path, key)))
            elif not _numbers_fine(node, finite):
                stack.extend((item, depth + 1, (path, i)) for i, item in enumerate(node))
            continue
        return f"{_path(where, path)} is a {type(node).__name__}, which JSON has no word for"
    return None


def _tree_fine(value: Any, max_depth: int, finite: bool) -> bool:
    """Whether ``tree_problem`` finds nothing, decided without keeping where each node is: a tree's leaves are
    looked at where their container is, and only containers go on the stack. A record's trees are small and many
    (a task's examples, its metadata), and the walk that names a place cost about a microsecond a node; what fails
    here is walked again by it, for the place."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is not dict and kind is not list and kind is not tuple:
            if not _leaf_fine(node, finite):
                return False
            continue
        if depth > max_depth:
            return False
        if kind is dict:
            items: Any = node.values()
            if node and set(map(type, node)) != _STR:
                return False
        elif _numbers_fine(node, finite):
            continue
        else:
            items = node
        for item in items:
            kind = type(item)
            if kind is str or item is None or kind is bool:
                continue
            if kind is dict or kind is list or kind is tuple:
                stack.append((item, depth + 1))
            elif not _leaf_fine(item, finite):
                return False
    return True


_STR = frozenset({str})


def _leaf_fine(node: Any, finite: bool) -> bool:
    kind = type(node)
    if kind is int:
        return bool(-INT64_MAX - 1 <= node <= INT64_MAX)
    if kind is float:
        return not finite or math.isfinite(node)
    return kind is str or node is None or kind is bool


def _numbers_fine(items: list[Any] | tuple[Any, ...], finite: bool = True) -> bool:
    """``items`` are all integers within int64, or all (finite) floats (False: look at each)."""
    if not items:
        return True
    kinds = set(map(type, items))
    if kinds == {float}:
        return not finite or math.isfinite(sum(items))  # NaN and infinities make it so; an overflowing sum is looked at
    if kinds == {int}:
        return bool(min(items) >= -INT64_MAX - 1 and max(items) <= INT64_MAX)
    return False


def _path(where: str, path: Any) -> str:
    keys: list[str] = []
    while path is not None:
        path, key = path
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key[:40]}")
    return where + "".join(reversed(keys))


def _time_problem(value: object, where: str, high: float = MAX_DURATION_S) -> str | None:
    return _float_problem(value, where, 0.0, high)


def time_problem(value: object, where: str) -> str | None:
    """What is wrong with a time (seconds since the epoch), or None."""
    return _time_problem(value, where, MAX_TIME_S)


def _turn_problems(turn: Turn, i: int, vocab: int | None) -> Iterable[str | None]:
    at = f"turns[{i}]"
    for name in ("message_index", "prompt_messages", "choice_index"):
        yield _int_problem(getattr(turn, name), f"{at}.{name}", *_UINT32)
    yield token_ids_problem(turn.prompt_token_ids, f"{at}.prompt_token_ids", vocab)
    yield token_ids_problem(turn.token_ids, f"{at}.token_ids", vocab)
    yield logprobs_problem(turn.logprobs, f"{at}.logprobs")
    if not isinstance(turn.has_logprobs, bool):
        yield f"{at}.has_logprobs is {_shown(turn.has_logprobs)}, not true or false"
    elif not turn.has_logprobs and turn.logprobs:
        yield f"{at} says it has no logprobs but carries {len(turn.logprobs)}"
    elif turn.has_logprobs and turn.token_ids and len(turn.logprobs) != len(turn.token_ids):
        yield f"{at} has {len(turn.token_ids)} token ids and {len(turn.logprobs)} logprobs"
    yield from _usage_problems(turn.usage, f"{at}.usage")
    yield _time_problem(turn.latency, f"{at}.latency")


def _usage_problems(usage: Any, at: str) -> Iterable[str | None]:
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        yield _int_problem(getattr(usage, name), f"{at}.{name}", *_BOUNDED_COUNT)
    for name in ("requests", "retries"):
        yield _int_problem(getattr(usage, name), f"{at}.{name}", *_UINT32)


def _all_problems(t: Trajectory, vocab: int | None, external: bool | None) -> Iterable[str | None]:
    for name in ("id", "seq", "group_id", "run_id", "policy_version", "verdict_version"):
        yield _int_problem(getattr(t, name), name, *_BOUNDED_COUNT)
    yield _int_problem(t.seed, "seed", -INT64_MAX - 1, INT64_MAX)
    yield _int_problem(t.difficulty, "difficulty", *_UINT32)
    flags = t.flags if isinstance(t.flags, list) else []
    yield reward_problem(t.reward, t.passed, t.status,
                         external=EXTERNAL_SCORE in flags if external is None else external)
    for name in ("started_at", "finished_at"):
        yield _time_problem(getattr(t, name), name, MAX_TIME_S)
    for name in ("task", "agent", "verify", "total"):
        yield _time_problem(getattr(t.timings, name), f"timings.{name}")
    yield from _usage_problems(t.usage, "usage")
    yield tree_problem(t.verdict_details, "verdict_details", finite=False)
    if not isinstance(t.task.examples, list):
        yield "task.examples is not a list"
    yield tree_problem(t.task.examples, "task.examples")
    if not isinstance(t.task.metadata, dict):
        yield "task.metadata is not an object"
    yield tree_problem(t.task.metadata, "task.metadata")
    s = t.sampling
    yield _float_problem(s.temperature, "sampling.temperature", 0.0, FLOAT32_MAX)
    yield _float_problem(s.top_p, "sampling.top_p", 0.0, 1.0)
    yield _int_problem(s.max_tokens, "sampling.max_tokens", *_UINT32)
    yield _int_problem(s.n, "sampling.n", *_UINT32)
    if s.seed is not None:
        yield _int_problem(s.seed, "sampling.seed", -INT64_MAX - 1, INT64_MAX)
    if not isinstance(s.extra, dict):
        yield "sampling.extra is not an object"
    yield tree_problem(s.extra, "sampling.extra")
    for i, step in enumerate(t.steps):
        if step.exit_code is not None:
            yield _int_problem(step.exit_code, f"steps[{i}].exit_code", INT32_MIN, INT32_MAX)
        yield _time_problem(step.duration, f"steps[{i}].duration")
    for i, turn in enumerate(t.turns):
        yield from _turn_problems(turn, i, vocab)
    for i, score in enumerate(t.scores):
        yield reward_problem(score.reward, score.passed, score.status)
        yield _time_problem(score.scored_at, f"scores[{i}].scored_at", MAX_TIME_S)
        yield _int_problem(score.verdict_version, f"scores[{i}].verdict_version", *_BOUNDED_COUNT)


def problems(t: Trajectory, *, vocab: int | None = None, external: bool | None = None) -> list[str]:
    """Every number of ``t`` that is out of its domain, each named with where and why (empty: none).

    ``vocab``: the vocabulary's size, when the entry knows it. ``external``: the reward is a score pushed from
    outside (Atropos's wider domain); None decides it by the record's ``external_score`` flag, as a reader
    must; an entry that knows who scored says so.
    """
    try:
        if _fine(t, vocab, external):
            return []
        return [p for p in _all_problems(t, vocab, external) if p is not None]
    except (AttributeError, TypeError) as exc:  # a field of the wrong kind altogether (a list where a record is)
        return [f"the record is not of the record's shape: {type(exc).__name__}: {exc}"]


_INT = frozenset({int})
_NUMBER = frozenset({int, float})


def _ints_within(values: Sequence[Any], low: int, high: int) -> bool:
    return not values or (set(map(type, values)) <= _INT and min(values) >= low and max(values) <= high)


def _seconds_within(values: Sequence[Any], high: float) -> bool:
    # A NaN or an infinity makes the sum so (and min and max cannot be trusted with a NaN).
    return not values or (set(map(type, values)) <= _NUMBER and math.isfinite(sum(values)) and min(values) >= 0
                          and max(values) <= high)


def _fine(t: Trajectory, vocab: int | None, external: bool | None) -> bool:
    """Every number of ``t`` in its domain, decided without naming anything: the common case of every read
    costs a few microseconds; only a record that fails it is walked by ``_all_problems`` for what and where."""
    reward, s, u = t.reward, t.sampling, t.usage
    if external is None:
        external = isinstance(t.flags, list) and EXTERNAL_SCORE in t.flags
    low, high = (-EXTERNAL_SCORE_BOUND, EXTERNAL_SCORE_BOUND) if external else REWARD_RANGE
    if not (type(reward) in (float, int) and low <= reward <= high and type(t.passed) is bool
            and (not t.passed or reward > 0) and (t.status == "ok" or (t.status == "error" and not t.passed
                                                                     and reward == 0))):
        return False
    counts = [t.id, t.seq, t.group_id, t.run_id, t.policy_version, t.verdict_version, u.prompt_tokens,
              u.completion_tokens, u.total_tokens]
    narrow = [t.difficulty, u.requests, u.retries, s.max_tokens, s.n]
    seconds = [t.timings.task, t.timings.agent, t.timings.verify, t.timings.total]
    for turn in t.turns:
        tu = turn.usage
        counts += (tu.prompt_tokens, tu.completion_tokens, tu.total_tokens)
        narrow += (turn.message_index, turn.prompt_messages, turn.choice_index, tu.requests, tu.retries)
        seconds.append(turn.latency)
        if bad_token_id(turn.prompt_token_ids, vocab) or bad_token_id(turn.token_ids, vocab) \
                or bad_logprob(turn.logprobs) or type(turn.has_logprobs) is not bool \
                or (not turn.has_logprobs and turn.logprobs) \
                or (turn.has_logprobs and turn.token_ids and len(turn.logprobs) != len(turn.token_ids)):
            return False
    exits = [step.exit_code for step in t.steps if step.exit_code is not None]
    seconds += [step.duration for step in t.steps]
    signed = [t.seed] if s.seed is None else [t.seed, s.seed]
    return (_ints_within(counts, 0, INT64_MAX) and _ints_within(narrow, 0, UINT32_MAX)
            and _ints_within(signed, -INT64_MAX - 1, INT64_MAX) and _ints_within(exits, INT32_MIN, INT32_MAX)
            and _seconds_within(seconds, MAX_DURATION_S) and _seconds_within((t.started_at, t.finished_at), MAX_TIME_S)
            and type(s.temperature) in (float, int) and 0 <= s.temperature <= FLOAT32_MAX
            and type(s.top_p) in (float, int) and 0 <= s.top_p <= 1
            and isinstance(t.task.examples, list) and isinstance(t.task.metadata, dict) and isinstance(s.extra, dict)
            and not (t.verdict_details and tree_problem(t.verdict_details, "", finite=False))
            and not any(tree_problem(tree, "") for tree in (t.task.examples, t.task.metadata, s.extra) if tree)
            and all(reward_problem(x.reward, x.passed, x.status) is None
                    and _seconds_within((x.scored_at,), MAX_TIME_S) and _ints_within((x.verdict_version,), 0, INT64_MAX)
                    for x in t.scores))


def outside_vocab(t: Trajectory, vocab: int) -> list[str]:
    """Every turn's token ids of ``t`` its policy's vocabulary (``vocab`` tokens) does not hold, named as
    ``problems(t, vocab=vocab)`` names them: for a record ``check`` found in its domain already, the one thing it
    could not know (C loops, no other field looked at again)."""
    found = []
    for i, turn in enumerate(t.turns):
        for name in ("prompt_token_ids", "token_ids"):
            problem = token_ids_problem(getattr(turn, name), f"turns[{i}].{name}", vocab)
            if problem is not None:
                found.append(problem)
    return found


def check(t: Trajectory, **kwargs: Any) -> Trajectory:
    """``t`` itself when every number is in its domain, else ``OutOfDomain`` naming each problem."""
    found = problems(t, **kwargs)
    if found:
        raise OutOfDomain(found)
    return t


_STUB_INTS = {"id": _BOUNDED_COUNT, "seq": _BOUNDED_COUNT, "group_id": _BOUNDED_COUNT, "run_id": _BOUNDED_COUNT,
              "policy_version": _BOUNDED_COUNT, "seed": (-INT64_MAX - 1, INT64_MAX), "difficulty": _UINT32,
              "verdict_version": _BOUNDED_COUNT}
_STUB_TEXT = ("env", "env_version", "agent", "verifier_version", "node")


def unreadable(fields: dict[str, Any], why: str) -> Trajectory:
    """What a reader serves for a stored record it cannot read: its ids and names from ``fields`` (a row's
    columns, or the record's own fields) where they are in their domain (else 0 or ""), an error verdict (no
    score: a trainer leaves it out, as it leaves out every verdict that is not ``ok``), flagged ``unreadable``,
    its reason saying why. Whatever ``fields`` holds, the stub converts to the wire record."""
    kept: dict[str, Any] = {}
    for name, (low, high) in _STUB_INTS.items():
        value = fields.get(name)
        if isinstance(value, float) and math.isfinite(value):  # a number stored as REAL: its place is kept
            value = int(value)
        kept[name] = min(max(value, low), high) if isinstance(value, int) and not isinstance(value, bool) else 0
    for name in _STUB_TEXT:
        value = fields.get(name)
        kept[name] = bounded(value, MAX_NAME_CHARS) if isinstance(value, str) else ""
    finished = fields.get("finished_at")
    kept["finished_at"] = float(finished) if isinstance(finished, int | float) and _time_problem(
        finished, "", MAX_TIME_S) is None else 0.0
    return Trajectory(**kept, reward=0.0, passed=False, status="error",
                      reasons=[bounded(f"this stored record cannot be read, so none of it is served: {why}",
                                       MAX_REASON_CHARS)],
                      flags=[UNREADABLE])
