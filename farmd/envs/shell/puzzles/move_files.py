"""move-files: move or rename files by a rule; the checked directories must match exactly."""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import MappingProxyType

from farmd.envs.shell.puzzle import Expect, Puzzle, ensure
from farmd.envs.shell.words import (
    WORDS,
    layout,
    sentence,
    text_lines,
)


def _body(rng: random.Random, i: int) -> list[str]:
    return [f"id: {i}", sentence(rng)]


LEFT_ALONE = "the files the rule gives, each with its original contents"


@dataclass
class _Moves:
    files: dict[str, bytes]
    final: dict[str, bytes]
    goal: str
    action: str
    scope: tuple[str, ...]


def _rename_jpeg(rng: random.Random, d: int) -> _Moves:
    paths = layout(rng, "photos", [5, 9][d - 1], d, (".jpeg", ".jpeg", ".png", ".gif"))
    if d >= 2:  # near misses: the extension's letters elsewhere in the name
        paths += ["photos/jpeg-notes.txt", f"photos/{rng.choice(WORDS)}.jpeg.bak"]
    paths += [f"photos/{w}.jpeg" for w in rng.sample(WORDS, 1) if f"photos/{w}.jpeg" not in paths]
    files = {p: text_lines(_body(rng, i)) for i, p in enumerate(paths)}
    final = {(p[:-len(".jpeg")] + ".jpg" if p.endswith(".jpeg") else p): c for p, c in files.items()}
    sub = " (in subdirectories too)" if d >= 2 else ""
    goal = (f"Rename every file under `photos/`{sub} whose name ends in `.jpeg` so that it ends in `.jpg` "
            "instead, in the same directory; leave every other file as it is.")
    action = "find photos -type f -name '*.jpeg' | while IFS= read -r f; do mv -- \"$f\" \"${f%.jpeg}.jpg\"; done"
    return _Moves(files, final, goal, action, ("photos",))


def _collect_drafts(rng: random.Random) -> _Moves:
    paths = layout(rng, "inbox", 12, 2, (".txt", ".md"), names=tuple(rng.sample(WORDS, 12)), unique_names=True)
    files: dict[str, bytes] = {}
    final: dict[str, bytes] = {}
    for i, p in enumerate(paths):  # unique names: flattening never collides
        head, tail = p.rsplit("/", 1)
        prefix = rng.choice(("draft_", "draft_", "", "final_draft_", "notes_"))
        path = f"{head}/{prefix}{tail}"
        files[path] = text_lines(_body(rng, i))
        final[f"drafts/{tail}" if prefix == "draft_" else path] = files[path]
    goal = ("Move every file under `inbox/` (subdirectories included) whose name starts with `draft_` into the "
            "directory `drafts/` (create it), dropping the `draft_` prefix from its name; leave every other file "
            "where it is.")
    action = ("mkdir -p drafts && find inbox -type f -name 'draft_*' | while IFS= read -r f; do b=${f##*/}; "
              "mv -- \"$f\" \"drafts/${b#draft_}\"; done")
    return _Moves(files, final, goal, action, ("inbox", "drafts"))


def _sort_by_extension(rng: random.Random) -> _Moves:
    paths = layout(rng, "inbox", 16, 3, (".txt", ".csv", ".log", ".tar.gz", ""),
                    names=tuple(rng.sample(WORDS, 16)), unique_names=True)
    files = {p: text_lines(_body(rng, i)) for i, p in enumerate(paths)}
    final = {}
    for p, content in files.items():
        base = p.rsplit("/", 1)[1]
        final[f"sorted/{base.rsplit('.', 1)[1] if '.' in base else 'none'}/{base}"] = content
    goal = ("Move every file under `inbox/` (subdirectories included) to `sorted/EXT/NAME`, where NAME is its "
            "file name and EXT the part of the name after its last dot, or `none` if the name has no dot. Create "
            "the directories you need; no file may stay under `inbox/`.")
    action = ("find inbox -type f | while IFS= read -r f; do b=${f##*/}; case $b in *.*) e=${b##*.};; "
              "*) e=none;; esac; mkdir -p \"sorted/$e\" && mv -- \"$f\" \"sorted/$e/$b\"; done")
    return _Moves(files, final, goal, action, ("inbox", "sorted"))


def _archive_by_date(rng: random.Random) -> _Moves:
    paths = layout(rng, "inbox", 20, 3, (".txt", ".md"), names=tuple(rng.sample(WORDS, 20)), unique_names=True)
    files: dict[str, bytes] = {}
    final: dict[str, bytes] = {}
    for i, p in enumerate(paths):
        y, m = rng.randint(2019, 2024), rng.randint(1, 12)
        date = f"{y}-{m:02d}-{rng.randint(1, 28):02d}"
        kind = rng.choice(("dated", "dated", "dated", "undated", "late", "other"))
        first = {"dated": f"date: {date}", "undated": "date: unknown", "late": f"title: {rng.choice(WORDS)}",
                 "other": f"updated: {date}"}[kind]
        lines = [first, *_body(rng, i)]
        if kind == "late":
            lines.insert(1, f"date: {date}")  # not on the first line: the file stays
        files[p] = text_lines(lines)
        final[f"archive/{y}/{m:02d}/{p.rsplit('/', 1)[1]}" if kind == "dated" else p] = files[p]
    goal = ("Some files under `inbox/` (subdirectories included) have a first line of the form "
            "`date: YYYY-MM-DD`. Move each of them to `archive/YYYY/MM/NAME` (NAME: its file name; YYYY and MM "
            "from that date). Create the directories you need; leave every other file where it is.")
    action = ("find inbox -type f | while IFS= read -r f; do d=$(sed -n "
              "'1s/^date: \\([0-9]\\{4\\}\\)-\\([0-9]\\{2\\}\\)-[0-9]\\{2\\}$/\\1\\/\\2/p' \"$f\"); "
              "if [ -n \"$d\" ]; then mkdir -p \"archive/$d\" && mv -- \"$f\" \"archive/$d/${f##*/}\"; fi; done")
    return _Moves(files, final, goal, action, ("inbox", "archive"))


def make(rng: random.Random, d: int) -> Puzzle:
    moves = (_rename_jpeg(rng, d) if d <= 2 else
             {3: _collect_drafts, 4: _sort_by_extension, 5: _archive_by_date}[d](rng))
    ensure(len(moves.final) == len(moves.files) and moves.final.keys() != moves.files.keys(),
            "move-files: targets must not collide, and something must move")
    checked = ", ".join(f"`{s}/`" for s in moves.scope)
    return Puzzle(
        family="move-files", goal=moves.goal, finish="files", files=MappingProxyType(moves.files),
        actions=(moves.action,), expected=MappingProxyType({p: Expect("bytes", c) for p, c in moves.final.items()}),
        scope=moves.scope,
        answer_format=(f"Finish by leaving the files in place. The final state of {checked} is checked: exactly "
                       f"{LEFT_ALONE} (empty directories do not matter). The final answer text is ignored."),
        left_alone=LEFT_ALONE,
    )
