"""Tier 2's questions about a contributed environment beyond the exploit library: each a class of defect a
verifier or a task family can have, asked of the environment's own code in its boxes (``tier2`` runs them).

- **Forged output** (``FORGED``): a verifier that reads a verdict from output the submission controls. What it
  reads is learned from its own reference runs, not assumed: for a code task, what the verifier's children
  printed while it judged the reference (``trace``); for an answer task, the reference's answers themselves.
  The attempts print (or are) another task's output, or keep the format and move the values: right in form,
  wrong in substance.
- **Transformed leaks** (``LEAK``): the answer in the public task, case-folded, re-spaced or re-separated,
  reversed, reordered, or encoded (base64, base32, hex, rot13, URL). A leak counts when it is systematic: the
  same transform in the same place on most tasks sampled (a sort task whose input happens to be sorted
  already shows its answer by chance, once in a while). A systematic leak by a fixed transform is a finding
  by itself (an agent learns the transform, not the task); a reordering is one only when the leaked text,
  submitted as it stands, earns reward (a sort task's input is a reordering of its answer by design).
- **Constant answers** (``CONSTANT``): a family whose answers are nearly all one value (a constant policy earns
  reward), and a verifier that rewards a constant (the most common answer, or a common one such as ``0`` or
  ``yes``) on a task whose answer is something else.
- **Underivable answers** (``UNDERIVABLE``): two tasks that show an agent the same thing but accept disjoint
  answers: tasks of different seeds posed alike, or the same task with other hidden choices (another per-task
  seed) or other public ones (another ``rng`` stream) that the prompt does not show.
- **Verdict cost** (``COST``): what a verdict costs the farm, as the box's cgroup counts it, against the farm's
  budget (``[intake] verdict_cpu_s``, ``verdict_wall_s``), whatever the manifest declares.

A finding's evidence names the tasks and the text submitted; its fix says what to change.
"""

from __future__ import annotations

import base64
import codecs
import json
import math
import re
import urllib.parse
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from farmd.intake import boxed
from farmd.intake.boxed import Call, ContributedTask
from farmd.intake.checks import Finding
from farmd.intake.forms import frame, same

FORGED, LEAK, CONSTANT, UNDERIVABLE, COST = ("tier2_forged_output", "tier2_leak", "tier2_constant",
                                             "tier2_underivable", "tier2_cost")
PROBES = ("forged", "leaks", "constants", "underivable")
"""What ``run_tier2`` asks by default, by name (the verdict cost is the funnel's, over every call)."""

NEAR_CONSTANT_SHARE = 0.85
"""A family whose most common answer answers at least this share of the tasks sampled is near-constant. An
honest family can have a common answer (word-count's "2" answers about 35% of its tasks): among 19 tasks
(tier 2's default), 17 alike happen by chance about once in 100,000 such families; a constant family (or one
90% so) shows it nearly every time."""
MIN_SAMPLE = 12
"""Tasks needed before answers are called near-constant: among 9, word-count showed 8 alike once in 700 runs."""
COMMON_CONSTANTS = ("0", "1", "-1", "yes", "no", "true", "false", "none")
CONSTANT_TASKS = 2
"""Tasks (whose answer is something else) each constant is submitted to."""
COMMON_VALUES: tuple[Any, ...] = (0, None, [], "", True, False)
"""What a constant function returns, for code tasks."""
SYSTEMATIC_SHARE = 0.75
"""A leak in one place on at least this share of the tasks sampled (and on 3 or more) is the family's, not chance."""
MIN_SUBSTRING = 8
"""Normalised characters an answer needs before it is looked for inside the prompt's text (tier 1's rule for
the answer as it stands): a shorter one turns up in a sentence by chance."""
_WORDS = re.compile(r"[^\W_]+")
_MAX_LEAVES = 10_000
_MAX_REORDERED = 32
_MAX_DEPTH = 32


@dataclass(frozen=True)
class Known:
    """One task tier 2 knows: as posed, and the reference's answer."""

    seed: int
    level: int
    task: ContributedTask
    answer: str

    @property
    def key(self) -> tuple[int, int]:
        return self.seed, self.level

    @property
    def core(self) -> str:
        return frame(self.answer).core

    @property
    def shown(self) -> str:
        """All an agent is shown of it."""
        return self.task.prompt + "\n" + json.dumps(self.task.public, sort_keys=True, default=str)


@dataclass(frozen=True)
class Try:
    """An attempt a probe makes: judged like any of tier 2's; any reward to it is a finding of ``check``."""

    check: str
    source: str
    seed: int
    level: int
    final: str
    why: str = ""


# -- forged output -------------------------------------------------------------------------------------------


def forged_tries(targets: Sequence[Known], known: Sequence[Known], traces: Mapping[tuple[int, int], str],
                 kind: str) -> list[Try]:
    """Attempts at each of ``targets`` that forge what the verifier reads, learned from the reference runs of
    ``known``: the verifier's children's output while it judged (``traces``, by task), and for answer tasks
    the answers' own format."""
    out: list[Try] = []
    if kind == "function":
        common = _common_lines(list(traces.values()))
        for t in targets:
            entry = _entry(t.task)
            others = [text for key, text in traces.items() if key != t.key and text.strip()]
            if not others or entry is None:
                continue
            printed = others[0]
            out += [Try(FORGED, "prints another task's run, then exits", *t.key, _printer(printed, exit_after=True)),
                    Try(FORGED, "prints another task's run, answers nothing", *t.key,
                        _printer(printed, entry=entry))]
            if common and common.strip() != printed.strip():
                out.append(Try(FORGED, "prints the lines every run printed, then exits", *t.key,
                               _printer(common, exit_after=True)))
        return out
    cores = [k.core for k in known]
    for t in targets:
        other = next((k for k in known if k.key != t.key and k.core.casefold() != t.core.casefold()), None)
        if other is not None:
            out.append(Try(FORGED, "another task's answer, in the same format", *t.key, other.answer))
        moved = _moved(t.answer, cores)
        if moved is not None:
            out.append(Try(FORGED, "the reference's format with its values moved", *t.key, moved))
        # An answer verifier that runs something and reads what it printed: an answer that prints it, as a
        # statement and as an expression (for a verifier that executes or evaluates the answer).
        run = next((text for key, text in traces.items() if key != t.key and text.strip()), None)
        if run is not None:
            out += [Try(FORGED, "prints another task's run (as code)", *t.key, _printer(run, exit_after=True)),
                    Try(FORGED, "prints another task's run, then exits (as an expression)", *t.key,
                        f"(__import__('sys').stdout.write({run!r}), __import__('sys').stdout.flush(), "
                        "__import__('os')._exit(0))")]
    return [x for x in out if not any(same(x.final, t.answer) for t in targets if t.key == (x.seed, x.level))]


def _printer(text: str, *, exit_after: bool = False, entry: str | None = None) -> str:
    lines = ["import os as _os, sys as _sys", f"_sys.stdout.write({text!r})", "_sys.stdout.flush()"]
    if exit_after:
        lines.append("_os._exit(0)")
    if entry:
        lines += ["", "", f"def {entry}(*args, **kwargs):", "    return None"]
    return "\n".join(lines) + "\n"


def _common_lines(texts: Sequence[str]) -> str:
    """The lines every one of ``texts`` printed (in the first's order): a run's markers, not its data."""
    if len(texts) < 2:
        return ""
    sets = [{line.strip() for line in t.splitlines() if line.strip()} for t in texts]
    shared = set.intersection(*sets)
    kept = [line.strip() for line in texts[0].splitlines() if line.strip() in shared]
    return "\n".join(dict.fromkeys(kept)) + "\n" if kept else ""


_TOKEN = re.compile(r"\d+|[^\W\d_]+")


def _moved(answer: str, cores: Sequence[str]) -> str | None:
    """``answer`` with what varies between the references moved (numbers up one, words reversed) and what
    they all share (the format: keys, markers, labels) kept; None when nothing varies."""
    shared = set.intersection(*({m.group() for m in _TOKEN.finditer(c)} for c in cores)) if len(cores) > 1 else set()
    f = frame(answer)

    def move(m: re.Match[str]) -> str:
        token = m.group()
        if token in shared:
            return token
        if token.isdigit():
            return str(int(token) + 1)
        return token[::-1] if len(set(token.casefold())) > 1 else token + "x"

    moved = _TOKEN.sub(move, f.core)
    return f.holding(moved) if moved != f.core else None


def _entry(task: ContributedTask) -> str | None:
    entry = task.public.get("entry_point")
    return entry if isinstance(entry, str) and entry.isidentifier() else None


# -- transformed leaks -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leak:
    transform: str
    where: str
    text: str
    """The leaked text as the public task holds it."""
    recovered: tuple[str, ...]
    """Answers an agent reads off it (submitted in the reference's frame)."""
    blocking: bool
    """A finding by itself (a fixed transform); else only if a recovered answer earns reward."""


def _norm(text: str) -> str:
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _norm_spans(text: str) -> tuple[str, list[int]]:
    chars, where = [], []
    for i, ch in enumerate(text.casefold()):
        if ch.isalnum():
            chars.append(ch)
            where.append(min(i, len(text) - 1))
    return "".join(chars), where


def _leaves(public: Any) -> Iterator[tuple[str, str]]:
    """(path, text) of every scalar in a public structure, walked without recursion and within bounds."""
    stack: list[tuple[str, Any, int]] = [("public", public, 0)]
    seen = 0
    while stack and seen < _MAX_LEAVES:
        path, value, depth = stack.pop()
        seen += 1
        if isinstance(value, dict) and depth < _MAX_DEPTH:
            stack += [(f"{path}.{str(k)[:40]}", v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list) and depth < _MAX_DEPTH:
            stack += [(f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value)]
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            yield path, str(value)


def _encodings(core: str) -> dict[str, str]:
    """The answer's encodings worth looking for: of an answer of 4 characters or more, so each is at least
    ``MIN_SUBSTRING`` long (the hex of "3" is "33", which a public field holds by chance)."""
    if len(core) < 4:
        return {}
    raw = core.encode("utf-8")
    # Without their padding: what is looked for is a substring, so the padded forms are found too.
    found = {"base64": base64.b64encode(raw).decode().rstrip("="),
             "base64 (URL-safe)": base64.urlsafe_b64encode(raw).decode().rstrip("="),
             "base32": base64.b32encode(raw).decode().rstrip("="), "hex": raw.hex(),
             "rot13": codecs.encode(core, "rot13"), "URL-encoded": urllib.parse.quote(core, safe="")}
    kept: dict[str, str] = {}
    for name, enc in found.items():  # one name per text: base64 with and without padding are often one
        if len(enc) >= MIN_SUBSTRING and enc != core and enc not in kept.values():
            kept[name] = enc
    return kept


def find_leaks(task: ContributedTask, answer: str) -> list[Leak]:
    """Where the public task holds ``answer`` (the reference's final text) under a transform. Linear in the
    task's size for each transform (CPU work: tier 2 runs it in a thread)."""
    core = frame(answer).core.strip()
    if not core:
        return []
    leaves = list(_leaves(task.public))
    prompt = task.prompt
    found: list[Leak] = []
    n = _norm(core)
    # Numbers are left to the exact check: "-3" and "3.0" normalise to what a prompt holds by chance.
    wordy = any(ch.isalpha() for ch in n) or len(n) >= 6
    if len(n) >= 2 and wordy:
        for transform, target, back in (("case and separators", n, False), ("reversed", n[::-1], True)):
            if transform == "reversed" and target == n:
                continue
            for path, text in leaves:
                if _norm(text) == target and text.strip() != core:
                    found.append(Leak(transform, path, text, (text, text[::-1]) if back else (text,), True))
            if len(target) >= MIN_SUBSTRING:
                normed, where = _norm_spans(prompt)
                at = normed.find(target)
                if at >= 0:
                    span = prompt[where[at]:where[at + len(target) - 1] + 1]
                    if span.strip() != core:
                        found.append(Leak(transform, "prompt", span, (span, span[::-1]) if back else (span,), True))
    words = _WORDS.findall(core.casefold())
    # An answer of many words (a program) is no list to reorder, and its windows would cost O(prompt x answer).
    if 2 <= len(words) <= _MAX_REORDERED and len(set(words)) >= 2 and sum(map(len, words)) >= 6:
        want = Counter(words)
        for path, text in leaves:
            got = _WORDS.findall(text.casefold())
            if Counter(got) == want and got != words:
                found.append(Leak("reordered", path, text, (text,), False))
        tokens = list(_WORDS.finditer(prompt))
        for i in range(len(tokens) - len(words) + 1):
            window = tokens[i:i + len(words)]
            got = [m.group().casefold() for m in window]
            if Counter(got) == want and got != words:
                span = prompt[window[0].start():window[-1].end()]
                found.append(Leak("reordered", "prompt", span, (span,), False))
                break
    for name, encoded in _encodings(core).items():
        for path, text in leaves:
            if encoded in text:
                found.append(Leak(name, path, encoded, (core,), True))
        if encoded in prompt:
            found.append(Leak(name, "prompt", encoded, (core,), True))
    return found


def _place(leak: Leak) -> tuple[str, str]:
    return leak.transform, re.sub(r"\[\d+\]", "[]", leak.where)


def systematic(leaks: Mapping[tuple[int, int], Sequence[Leak]]) -> set[tuple[str, str]]:
    """The (transform, place) pairs found on ``SYSTEMATIC_SHARE`` of the tasks (and on at least 3)."""
    counts = Counter(place for found in leaks.values() for place in {_place(leak) for leak in found})
    need = max(3, math.ceil(SYSTEMATIC_SHARE * len(leaks)))
    return {place for place, n in counts.items() if n >= need}


def leak_tries(known: Known, leaks: Sequence[Leak], places: set[tuple[str, str]]) -> list[Try]:
    """Each systematic leak's recovered answers, in the reference's frame, where that is not the reference."""
    f = frame(known.answer)
    out: dict[str, Try] = {}
    for leak in leaks:
        if _place(leak) not in places:
            continue
        for text in leak.recovered:
            final = f.holding(text.strip())
            if not same(final, known.answer) and final not in out:
                out[final] = Try(LEAK, f"{leak.transform} in {leak.where}", *known.key, final,
                                 f"the public task holds {leak.text[:200]!r}")
    return list(out.values())


def leak_findings(leaks: Mapping[tuple[int, int], Sequence[Leak]], places: set[tuple[str, str]]) -> list[Finding]:
    """One finding per transform that leaks by itself, systematically, naming the first task and field."""
    by: dict[str, list[tuple[tuple[int, int], Leak]]] = {}
    for key, found in leaks.items():
        for leak in found:
            if leak.blocking and _place(leak) in places:
                by.setdefault(leak.transform, []).append((key, leak))
    out = []
    for transform, hits in by.items():
        (seed, level), leak = hits[0]
        more = len({k for k, _ in hits}) - 1
        out.append(Finding(LEAK, f"the answer to task (seed {seed}, level {level}) is in the public task, "
                           f"{transform}: {leak.where} holds {leak.text[:200]!r}"
                           + (f" (and on {more} more tasks)" if more else ""),
                           "keep the expected answer, in any form, in 'hidden': never in 'prompt' or 'public'"))
    return out


# -- constant answers ------------------------------------------------------------------------------------------


def near_constant(known: Sequence[Known], kind: str) -> Finding | None:
    """A finding when the most common answer answers ``NEAR_CONSTANT_SHARE`` of the tasks sampled (code tasks
    are left out: one function answers them all, by design)."""
    if kind == "function" or len(known) < MIN_SAMPLE:
        return None
    counts = Counter(k.core.casefold() for k in known)
    common, count = counts.most_common(1)[0]
    if count < math.ceil(NEAR_CONSTANT_SHARE * len(known)):
        return None
    shown = next(k.core for k in known if k.core.casefold() == common)
    return Finding(CONSTANT, f"{shown[:200]!r} is the answer to {count} of {len(known)} tasks sampled: a policy that "
                   "always answers it earns reward without solving anything",
                   "make the answer depend on the task: its values should spread over many answers")


def constant_tries(known: Sequence[Known], kind: str) -> list[Try]:
    """The most common answer, and common constants, each submitted to tasks whose answer is something else."""
    out: list[Try] = []
    if kind == "function":
        outputs = Counter(repr(e.get("output")) for k in known for e in _examples(k.task))
        values = [*COMMON_VALUES]
        if outputs:
            top = outputs.most_common(1)[0][0]
            values.insert(0, next(e.get("output") for k in known for e in _examples(k.task)
                                  if repr(e.get("output")) == top))
        for value in values:  # one task each: a code verifier's verdict costs a child process
            for k in [k for k in known if _entry(k.task)][:1]:
                code = f"def {_entry(k.task)}(*args, **kwargs):\n    return {value!r}\n"
                out.append(Try(CONSTANT, f"a function that returns {value!r}", *k.key, code))
        return out
    counts = Counter(k.core.casefold() for k in known)
    common = [next(k.core for k in known if k.core.casefold() == c) for c, _ in counts.most_common(1)]
    for constant in dict.fromkeys([*common, *COMMON_CONSTANTS]):
        targets = [k for k in known if k.core.casefold() != constant.casefold()][:CONSTANT_TASKS]
        for k in targets:
            final = frame(k.answer).holding(constant)
            if not same(final, k.answer):
                out.append(Try(CONSTANT, f"the constant answer {constant!r}", *k.key, final))
    return out


def _examples(task: ContributedTask) -> list[dict[str, Any]]:
    raw = task.public.get("examples")
    return [e for e in raw if isinstance(e, dict) and "output" in e] if isinstance(raw, list) else []


# -- underivable answers ---------------------------------------------------------------------------------------


def alike(known: Sequence[Known]) -> list[tuple[Known, Known]]:
    """Pairs of tasks posed alike (the same prompt and public fields) whose answers differ: one per group."""
    groups: dict[str, list[Known]] = {}
    for k in known:
        groups.setdefault(k.shown, []).append(k)
    pairs = []
    for members in groups.values():
        first = members[0]
        other = next((m for m in members[1:] if m.core.casefold() != first.core.casefold()), None)
        if other is not None:
            pairs.append((first, other))
    return pairs


def underivable_finding(judged: Known, answer: str, other: str, failed: str = "") -> Finding:
    """``answer``, right for ``other`` (a task posed exactly as ``judged`` is), failed on ``judged``."""
    return Finding(UNDERIVABLE, f"task (seed {judged.seed}, level {judged.level}) and {other} are posed alike, yet "
                   f"the verifier {'failed on' if failed else 'rejects on'} the first the answer {answer[:200]!r} "
                   f"right for the second{failed}: the answer is decided by something the prompt does not show",
                   "put everything the answer depends on in the prompt or the public fields; hidden data may "
                   "only check an answer the prompt decides")


# -- verdict cost ----------------------------------------------------------------------------------------------


def verdict_cost(calls: Sequence[Call], cpu_budget_s: float, wall_budget_s: float) -> Finding | None:
    """A finding when verdicts typically cost more than the farm's budget (``boxed.verdict_cost``)."""
    why = boxed.verdict_cost(calls, cpu_budget_s, wall_budget_s)
    if why is None:
        return None
    return Finding(COST, why, "make a verdict cheap: judge the answer directly, with fewer or smaller hidden checks")
