"""What an Atropos client sends, checked before anything keeps it: scored groups, registrations.

A scored group must hang together before it is queued, since a trainer builds tensors from it: as many
masks, scores and rows of advantages or logprobs as sequences, each mask as long as its tokens, every
number finite, every size bounded. Atropos's own server checks types only, and its clients lean on that:
atroposlib's own tests push four advantages for three tokens, and an empty ``messages`` for a group of
one. So a per-token row is bounded but not held to its sequence's length, and ``messages`` is checked
for its shape (each message a role and a content) only. A refusal names the field and why
(``AtroposInvalid``), and nothing of a refused request is kept.

These run off the event loop (a push is up to tens of megabytes of JSON), and return each group as
Atropos hands it back: every field present, None where not sent, plus its stored form.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from typing import Annotated, Any

import msgspec

from farmd import domain, jsonio
from farmd.atropos.records import as_trajectories, untrained_prompt
from farmd.errors import AtroposInvalid
from farmd.records import Trajectory
from farmd.store.atropos import pack_group, pack_records

MAX_SEQUENCES = 4096
"""Sequences in one group."""
MAX_TOKENS = 1 << 20
"""Tokens in one sequence."""
MAX_GROUPS = 4096
"""Groups in one ``/scored_data_list``."""
MAX_NAME = 200
_INT64 = 1 << 63
MAX_PUSHED_DEPTH = domain.MAX_JSON_DEPTH - 2
"""How deep a free-form field of a group (generation parameters, overrides, a message) may nest: its farm
trajectories keep it two levels down their details (``{"atropos": {"generation_params": ...}}``), which are
held to ``domain.MAX_JSON_DEPTH``."""
_IGNORED = -100

SCORED_FIELDS = ("tokens", "masks", "scores", "advantages", "ref_logprobs", "messages", "generation_params",
                 "inference_logprobs", "overrides", "group_overrides", "images", "env_id", "distill_token_ids",
                 "distill_logprobs")
"""A group's fields in the order Atropos hands them back."""


@dataclass
class Checked:
    """A scored group that holds together, ready for the queue."""

    group: dict[str, Any]
    """Every field Atropos hands back (None where not sent)."""
    stored: bytes
    """Its JSON as the store keeps it (``pack``ed)."""
    records: list[Trajectory] = field(default_factory=list)
    """Farm's view of it, one trajectory per sequence (``farmd.atropos.records``); none for groups made from
    farm's own rollouts (they are trajectories already)."""
    bodies: list[bytes] = field(default_factory=list)
    """``records`` as the store keeps them (packed here, off the event loop)."""


def _int(value: Any, loc: list[str | int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AtroposInvalid(loc, "must be an integer")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise AtroposInvalid(loc, "must be an integer")
    if not -_INT64 <= int(value) < _INT64:
        raise AtroposInvalid(loc, "is out of range")
    return int(value)


def _float(value: Any, loc: list[str | int]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AtroposInvalid(loc, "must be a number")
    if not math.isfinite(value):
        raise AtroposInvalid(loc, "must be finite")
    return float(value)


def _str(value: Any, loc: list[str | int], limit: int = MAX_NAME) -> str:
    if not isinstance(value, str):
        raise AtroposInvalid(loc, "must be a string")
    if len(value) > limit:
        raise AtroposInvalid(loc, f"is longer than {limit} characters")
    return value


def _list(value: Any, loc: list[str | int], limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise AtroposInvalid(loc, "must be a list")
    if len(value) > limit:
        raise AtroposInvalid(loc, f"holds more than {limit} items")
    return value


def _rows(value: Any, name: str, lengths: list[int], kind: str, *, exact: bool = True,
          typed: bool = False) -> list[list[Any]]:
    """One list per sequence; each as long as its sequence when ``exact``, else bounded only. ``typed``: its
    numbers were checked as they were decoded (``_Typed``)."""
    rows = _list(value, [name], MAX_SEQUENCES)
    if len(rows) != len(lengths):
        raise AtroposInvalid([name], f"has {len(rows)} rows for {len(lengths)} sequences")
    out = []
    for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        items = _list(row, [name, i], MAX_TOKENS)
        if exact and len(items) != length:
            raise AtroposInvalid([name, i], f"has {len(items)} entries for a sequence of {length} tokens")
        out.append(items if typed else _ints(items, [name, i]) if kind == "int" else _floats(items, [name, i]))
    return out


def _ints(items: list[Any], loc: list[str | int]) -> list[int]:
    """A row of integers. Rows are thousands long: the common case is checked by C loops (``map``,
    ``min``, ``max``), and only a row that fails it is walked in Python, for the error's place."""
    if set(map(type, items)) <= {int} and (not items or (min(items) >= -_INT64 and max(items) < _INT64)):
        return items
    return [_int(x, [*loc, j]) for j, x in enumerate(items)]


def _floats(items: list[Any], loc: list[str | int]) -> list[float]:
    """A row of finite numbers, as floats (checked as ``_ints`` is)."""
    kinds = set(map(type, items))
    if kinds <= {float} and math.isfinite(sum(items)):  # a NaN or an infinity makes the sum so (or an overflow:
        return items                                     # then the row is looked at item by item below)
    if kinds <= {float, int} and all(map(math.isfinite, items)):
        return items if kinds <= {float} else [float(x) for x in items]
    return [_float(x, [*loc, j]) for j, x in enumerate(items)]


def _token_ids(items: list[Any], loc: list[str | int]) -> list[int]:
    """A row of token ids: integers in [0, 2**31) (``farmd.domain``), where ``_ints`` takes any int64."""
    bad = domain.bad_token_id(items)
    if bad is not None:
        raise AtroposInvalid([*loc, bad[0]], bad[1])
    return items


def _tree(value: Any, loc: list[str | int]) -> Any:
    """A free-form field: JSON within ``MAX_PUSHED_DEPTH``, integers within int64, floats finite."""
    problem = domain.tree_problem(value, "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc)[1:],
                                  MAX_PUSHED_DEPTH)
    if problem is not None:
        raise AtroposInvalid(loc, problem)
    return value


def _sampled(rows: list[list[float]] | None, masks: list[list[int]], name: str) -> None:
    """Logprobs one per token are sampling logprobs where the mask trains: at most 0 there (Atropos marks the
    other positions 1.0, and a row not one per token is not read as turns)."""
    for i, (row, mask) in enumerate(zip(rows or [], masks, strict=False)):
        if len(row) != len(mask):
            continue
        # The trained positions' logprobs picked by C loops, where a Python loop over every position was a third of
        # a group's check: the common mask's by a slice, any other's by ``compress``. The row is finite floats
        # already (``_floats``), so only its bounds are left to check. Only a row that fails is walked, for the place.
        prompt = untrained_prompt(mask)
        trained_logprobs = row[prompt:] if prompt is not None else list(compress(row, map(_IGNORED.__ne__, mask)))
        if not trained_logprobs or (max(trained_logprobs) <= domain.LOGPROB_SLACK
                                    and min(trained_logprobs) >= -domain.FLOAT32_MAX):
            continue
        trained = [j for j, m in enumerate(mask) if m != _IGNORED]
        bad = domain.bad_logprob([row[j] for j in trained])
        if bad is not None:
            raise AtroposInvalid([name, i, trained[bad[0]]], f"{bad[1]} (a trained position)")


def scored_group(raw: Any, where: list[str | int] | None = None, *, typed: bool = False) -> dict[str, Any]:
    """A scored group checked, with every field Atropos hands back (None where not sent). Fields it does not
    know are dropped, as Atropos drops them. ``typed``: ``raw`` is a ``_Typed``'s fields, so the numbers of its
    tokens, masks, scores and per-token rows are in their domains already; the rest is checked here."""
    loc = where or []
    if not isinstance(raw, dict):
        raise AtroposInvalid(loc, "a scored group is a JSON object")
    for required in ("tokens", "masks", "scores"):
        if raw.get(required) is None:
            raise AtroposInvalid([*loc, required], "field required")
    try:
        sequences = _list(raw["tokens"], ["tokens"], MAX_SEQUENCES)
        if not sequences:
            raise AtroposInvalid(["tokens"], "a group holds at least one sequence")
        tokens = sequences if typed else [_token_ids(_list(seq, ["tokens", i], MAX_TOKENS), ["tokens", i])
                                          for i, seq in enumerate(sequences)]
        lengths = [len(seq) for seq in tokens]
        group: dict[str, Any] = {"tokens": tokens, "masks": _rows(raw["masks"], "masks", lengths, "int", typed=typed)}
        scores = _list(raw["scores"], ["scores"], MAX_SEQUENCES)
        if len(scores) != len(tokens):
            raise AtroposInvalid(["scores"], f"has {len(scores)} scores for {len(tokens)} sequences")
        group["scores"] = [_score(s, ["scores", i]) for i, s in enumerate(scores)]
        for name in ("advantages", "ref_logprobs", "inference_logprobs"):
            group[name] = None if raw.get(name) is None else _rows(raw[name], name, lengths, "float", exact=False,
                                                                   typed=typed)
        _sampled(group["inference_logprobs"], group["masks"], "inference_logprobs")
        group["messages"] = None if raw.get("messages") is None else _messages(raw["messages"])
        for name in ("generation_params", "group_overrides"):
            value = raw.get(name)
            if value is not None and not isinstance(value, dict):
                raise AtroposInvalid([name], "must be an object")
            group[name] = _tree(value, [name])
        overrides = raw.get("overrides")
        if overrides is not None and not all(isinstance(o, dict) for o in _list(overrides, ["overrides"],
                                                                                MAX_SEQUENCES)):
            raise AtroposInvalid(["overrides"], "must be a list of objects")
        group["overrides"] = _tree(overrides, ["overrides"])
        group["images"] = _tree(raw.get("images"), ["images"])
        env_id = raw.get("env_id")
        group["env_id"] = None if env_id is None else _int(env_id, ["env_id"])
        if group["env_id"] is not None and group["env_id"] < 0:
            raise AtroposInvalid(["env_id"], "must not be negative")
        for name, kind in (("distill_token_ids", "int"), ("distill_logprobs", "float")):
            group[name] = None if raw.get(name) is None else _distill(raw[name], name, lengths, kind)
        for name, first_bad in (("distill_token_ids", domain.bad_token_id), ("distill_logprobs", domain.bad_logprob)):
            for i, row in enumerate(group[name] or []):
                for j, top in enumerate(row):
                    bad = first_bad(top)
                    if bad is not None:
                        raise AtroposInvalid([name, i, j, bad[0]], bad[1])
    except AtroposInvalid as exc:
        raise AtroposInvalid([*loc, *exc.loc], exc.message) from None
    return {name: group.get(name) for name in SCORED_FIELDS}


def _messages(value: Any) -> list[list[dict[str, Any]]]:
    conversations = _list(value, ["messages"], MAX_SEQUENCES)
    for i, conversation in enumerate(conversations):
        for j, message in enumerate(_list(conversation, ["messages", i], MAX_TOKENS)):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise AtroposInvalid(["messages", i, j], "Message must have 'role' and 'content' fields")
            _tree(message, ["messages", i, j])
    return conversations


def _score(value: Any, loc: list[str | int]) -> float:
    """A pushed score: finite, within ``domain.EXTERNAL_SCORE_BOUND`` (Atropos scores on its own scale)."""
    score = _float(value, loc)
    if abs(score) > domain.EXTERNAL_SCORE_BOUND:
        raise AtroposInvalid(loc, f"is {score:g}; a score is at most {domain.EXTERNAL_SCORE_BOUND:g} either side of 0")
    return score


def _distill(value: Any, name: str, lengths: list[int], kind: str) -> list[list[list[Any]]]:
    rows = _list(value, [name], MAX_SEQUENCES)
    if len(rows) != len(lengths):
        raise AtroposInvalid([name], f"has {len(rows)} rows for {len(lengths)} sequences")
    parse = _int if kind == "int" else _float
    return [[[parse(x, [name, i, j, k]) for k, x in enumerate(_list(top, [name, i, j], MAX_TOKENS))]
             for j, top in enumerate(_list(row, [name, i], MAX_TOKENS))] for i, row in enumerate(rows)]


def scored_groups(body: bytes, *, many: bool) -> list[Checked | AtroposInvalid]:
    """``/scored_data`` (one group) or ``/scored_data_list``'s body: each group checked, with its stored form
    and its trajectories, or why it is refused (``AtroposInvalid``, its place in ``loc``). One group's refusal is
    that group's: the others of a list are kept. A body that is no group or list of groups raises."""
    typed = _typed(body, many=many)
    if typed is not None:
        items, exact = typed, True
    else:  # the checks below say what is wrong, and where
        raw, exact = _json_exact(body)
        items = _list(raw, [], MAX_GROUPS) if many else [raw]
    out: list[Checked | AtroposInvalid] = []
    for i, item in enumerate(items):
        try:
            group = scored_group(item, [i] if many else [], typed=typed is not None)
        except AtroposInvalid as exc:
            if not many:
                raise
            out.append(exc)
            continue
        records = as_trajectories(group)
        out.append(Checked(group, pack_group(group, exact=exact), records,
                           pack_records(records)))
    return out


_Int64 = Annotated[int, msgspec.Meta(ge=-_INT64, le=_INT64 - 1)]
_Finite = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
_Score = Annotated[float, msgspec.Meta(ge=-domain.EXTERNAL_SCORE_BOUND, le=domain.EXTERNAL_SCORE_BOUND)]
_Rows = Annotated[list[Annotated[list[_Finite], msgspec.Meta(max_length=MAX_TOKENS)]],
                  msgspec.Meta(max_length=MAX_SEQUENCES)]


class _Typed(msgspec.Struct):
    """A scored group as nearly every client sends one, decoded and its numbers checked in one pass by msgspec (C):
    every token id, mask and per-token number in its domain, every row within its bound. orjson's parse and then
    those checks in Python were half of a push's time. A body that does not decode so is read and checked field by
    field (``scored_group``), which refuses it, names the place, or takes what this refuses and the checks allow (a
    mask written ``5.0``). Fields left ``Any`` are checked by ``scored_group`` as they are for any body."""

    tokens: Annotated[list[Annotated[list[domain.TokenId], msgspec.Meta(max_length=MAX_TOKENS)]],
                      msgspec.Meta(max_length=MAX_SEQUENCES)]
    masks: Annotated[list[Annotated[list[_Int64], msgspec.Meta(max_length=MAX_TOKENS)]],
                     msgspec.Meta(max_length=MAX_SEQUENCES)]
    scores: Annotated[list[_Score], msgspec.Meta(max_length=MAX_SEQUENCES)]
    advantages: _Rows | None = None
    ref_logprobs: _Rows | None = None
    inference_logprobs: _Rows | None = None
    messages: Any = None
    generation_params: Any = None
    overrides: Any = None
    group_overrides: Any = None
    images: Any = None
    env_id: Any = None
    distill_token_ids: Any = None
    distill_logprobs: Any = None


_ONE = msgspec.json.Decoder(_Typed)
_MANY = msgspec.json.Decoder(Annotated[list[_Typed], msgspec.Meta(max_length=MAX_GROUPS)])


def _typed(body: bytes, *, many: bool) -> list[dict[str, Any]] | None:
    """The body's groups as ``_Typed`` decodes them (as dicts of their fields), or None where it does not."""
    try:
        groups = _MANY.decode(body) if many else [_ONE.decode(body)]
    except msgspec.MsgspecError:
        return None
    return [msgspec.structs.asdict(g) for g in groups]


def _json(body: bytes) -> Any:
    return _json_exact(body)[0]


def _json_exact(body: bytes) -> tuple[Any, bool]:
    try:
        return jsonio.parse(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise AtroposInvalid([], f"the body is not JSON: {exc}") from None
    except RecursionError:  # Python's json, past orjson's 1024 levels
        raise AtroposInvalid([], "the body is JSON nested deeper than any group is") from None


_REGISTRATION: dict[str, Callable[[Any, list[str | int]], Any]] = {"wandb_group": _str, "wandb_project": _str, "batch_size": _int, "max_token_len": _int,
    "checkpoint_dir": _str, "save_checkpoint_interval": _int, "starting_step": _int, "num_steps": _int}


def registration(body: bytes) -> dict[str, Any]:
    """A trainer's ``/register``."""
    raw = _object(body)
    out = {name: parse(raw[name], [name]) if name in raw else _missing(name) for name, parse in _REGISTRATION.items()}
    if out["batch_size"] < 1:
        raise AtroposInvalid(["batch_size"], "must be at least 1")
    if out["starting_step"] < 0:
        raise AtroposInvalid(["starting_step"], "must not be negative")
    return out


def env_registration(body: bytes) -> dict[str, Any]:
    """An environment's ``/register-env``."""
    raw = _object(body)
    out: dict[str, Any] = {}
    for name, parse in (("max_token_length", _int), ("desired_name", _str), ("weight", _float),
                        ("group_size", _int)):
        out[name] = parse(raw[name], [name]) if name in raw else _missing(name)
    if out["group_size"] < 1:
        raise AtroposInvalid(["group_size"], "must be at least 1")
    share = raw.get("min_batch_allocation")
    out["min_batch_allocation"] = None if share is None else _float(share, ["min_batch_allocation"])
    if out["min_batch_allocation"] is not None and not 0.0 <= out["min_batch_allocation"] <= 1.0:
        raise AtroposInvalid(["min_batch_allocation"], "is a share of the batch, 0.0 to 1.0")
    return out


def env_id(body: bytes) -> int:
    """``{"env_id": N}`` (``/disconnect-env``, ``/status-env``)."""
    raw = _object(body)
    return _int(raw["env_id"], ["env_id"]) if "env_id" in raw else _missing("env_id")


def _object(body: bytes) -> dict[str, Any]:
    raw = _json(body)
    if not isinstance(raw, dict):
        raise AtroposInvalid([], "the body is a JSON object")
    return raw


def _missing(name: str) -> Any:
    raise AtroposInvalid([name], "field required")
