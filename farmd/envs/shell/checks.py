"""Checking a final answer and a final tree on the host: every check complete, none sampled."""

from __future__ import annotations

import os
import re
import stat
from decimal import Decimal, InvalidOperation
from pathlib import Path

from farmd.envs.shell.puzzle import Expect, Puzzle
from farmd.envs.shell.rules import MAX_FINAL_CHARS, TREE_BYTES

_NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")
_MAX_NUMBER_CHARS = 1000
"""Longer is not the plain number a check wants (and Decimal would take its time over it)."""


def _decoded(content: bytes) -> str | None:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def _as_lines(text: str) -> list[str]:
    return _trimmed([" ".join(line.split()) for line in text.split("\n")])


def _as_ini(text: str) -> list[str]:
    # "key = value" lines (a key starts with neither "#", ";" nor "=") with the blanks around "="
    # and at the ends made one form; by partition, in linear time: the regular expression this
    # replaces backtracked quadratically on a long line of blanks, and a file is the agent's to fill.
    out = []
    for line in text.split("\n"):
        line = line.rstrip()
        key, eq, value = line.lstrip().partition("=")
        out.append(f"{key.rstrip()} = {value.strip()}" if eq and key and key[0] not in "#;" else line)
    return _trimmed(out)


def _as_number(text: str) -> Decimal | None:
    text = text.strip()
    if len(text) > _MAX_NUMBER_CHARS or not _NUMBER.match(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        return None


def matches(expect: Expect, got: bytes) -> str | None:
    """None when ``got`` is what ``expect`` wants, else why not (short, safe to show)."""
    if expect.kind == "bytes":
        return None if got == expect.content else "its contents differ from the original's"
    text = _decoded(got)
    if text is None:
        return "it is not UTF-8 text"
    want = expect.content.decode()
    if expect.kind == "number":
        value = _as_number(text)
        if value is None:
            return "it does not hold a plain decimal number"
        return None if value == _as_number(want) else "wrong number"
    if expect.kind == "lines":
        return None if _as_lines(text) == _as_lines(want) else "wrong lines"
    return None if _as_ini(text) == _as_ini(want) else "its lines differ from what the edit should give"


def normalize_answer(final: str) -> str:
    """A final answer as compared: surrounding blanks and a leading ``./`` do not matter."""
    text = final.strip()
    return text[2:] if text.startswith("./") else text


def _regular_files(tree: Path, top: str) -> set[str]:
    """Regular files under ``tree/top``, relative to ``tree`` (the carried tree holds no links)."""
    found: set[str] = set()
    base = tree / top
    if not base.is_dir() or base.is_symlink():
        return found
    for root, _, names in os.walk(base, followlinks=False):
        for name in names:
            path = Path(root) / name
            if stat.S_ISREG(path.lstat().st_mode):
                found.add(path.relative_to(tree).as_posix())
    return found


def read_regular(tree: Path, rel: str) -> bytes | None:
    path = tree / rel
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > TREE_BYTES:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(TREE_BYTES + 1)


def check_tree(puzzle: Puzzle, tree: Path) -> list[str]:
    """What is wrong with a final tree (empty when it is right)."""
    problems: list[str] = []
    for top in puzzle.scope:
        have = _regular_files(tree, top)
        want = {p for p in puzzle.expected if p.startswith(f"{top}/")}
        extra = sorted(have - want)
        if extra:
            problems.append(f"{len(extra)} unexpected file(s) under {top}/, e.g. {_shown(extra[0])}")
    for rel, expect in puzzle.expected.items():
        got = read_regular(tree, rel)
        if got is None:
            problems.append(f"{rel}: missing (or not a regular file)")
            continue
        why = matches(expect, got)
        if why is not None:
            problems.append(f"{rel}: {why}")
    return problems


def disturbed(puzzle: Puzzle, tree: Path) -> list[str]:
    """What the task said to leave alone and was not (``Puzzle.left_alone``), as far as it can be told from a
    wrong answer: a new file under a checked directory, which the task does not give, or a file the task
    expects to keep an original file's content (left in place, or moved) that holds something else. Work left
    undone (a file not moved, an edit not made, a file missing) is a wrong answer, not this."""
    if not puzzle.scope:
        return []
    problems: list[str] = []
    for top in puzzle.scope:
        extra = sorted(_regular_files(tree, top) - {p for p in puzzle.expected if p.startswith(f"{top}/")})
        new = [p for p in extra if p not in puzzle.files or read_regular(tree, p) != puzzle.files[p]]
        if new:
            problems.append(f"{len(new)} new or changed file(s) under {top}/ that the task does not give, e.g. "
                            f"{_shown(new[0])}")
    originals = set(puzzle.files.values())
    for rel, expect in puzzle.expected.items():
        got = read_regular(tree, rel)
        if got is None or matches(expect, got) is None:
            continue
        if expect.content in originals:
            problems.append(f"{rel} was to keep its original contents")
        elif (line := _other_line_changed(expect, puzzle.files.get(rel), got)) is not None:
            problems.append(f"{rel}: line {line} was to stay as it is")
    return problems


def _other_line_changed(expect: Expect, original: bytes | None, got: bytes) -> int | None:
    """In a file edited in place (an INI file whose edit changes values, never the lines' count), the first
    line that the edit leaves as it was and ``got`` does not, or None (a count changed: the first line past
    the shorter)."""
    if expect.kind != "ini" or original is None or (text := _decoded(got)) is None:
        return None
    before, want, have = _as_ini(original.decode()), _as_ini(expect.content.decode()), _as_ini(text)
    if len(before) != len(want):
        return None
    if len(have) != len(want):
        return min(len(have), len(want)) + 1
    return next((i for i, (b, w, h) in enumerate(zip(before, want, have, strict=True), 1) if b == w != h), None)


def _shown(path: str) -> str:
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")[:200]


def check_answer(puzzle: Puzzle, final: str) -> list[str]:
    if len(final) > MAX_FINAL_CHARS:
        return [f"the final answer is longer than {MAX_FINAL_CHARS} characters"]
    got = normalize_answer(final)
    if not got:
        return ["no final answer"]
    if "\n" in got:
        return ["the final answer must be one line"]
    if got.isascii() and got.isdigit() and puzzle.answer.isdigit():
        # Leading zeros aside, digit for digit: int() refuses more than 4300 digits with a ValueError.
        return [] if got.lstrip("0") == puzzle.answer.lstrip("0") else ["wrong answer"]
    return [] if got == puzzle.answer else ["wrong answer"]
