"""``shell``: solve a filesystem or text puzzle one shell command at a time.

A task is a small tree of files, generated from the task's public identity (seed,
difficulty), and a goal in words: find the line that holds a word, count matching
log lines, sum a CSV column, move files by a rule, list the distinct words of some
texts, edit a config file, pull fields out of a log. Seven families; the difficulty
(1..5) adds files, depth, near misses and a second step of reasoning.

Each action is ``sh -c COMMAND`` in a fresh box over the rollout's tree; only the
regular files and directories it leaves are carried to the next action (links,
FIFOs, hard-linked files, file modes, processes and /tmp are not). A task finishes
either with a final answer text (checked exactly) or with a final file state
(checked on the host against the state the generator computes: every expected
file's content, and for some tasks the exact set of files in the checked
directories). The verifier replays the attempt's actions in a fresh episode, so a
verdict depends only on the attempt.

Answers are built to need what the tree says, not what the prompt says: a line
number next to a path, a sum over filtered rows, moved files that keep their
contents; near misses sit next to every right answer so that hedging or guessing
fails. The tree is public, so every check is complete rather than sampled and the
verifier's key hides nothing here (see ``verify``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import re
import shlex
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from farmd.envs.base import Attempt, Environment, Episode, Observation, Task, TaskError, VerifyContext
from farmd.errors import FarmError
from farmd.sandbox import Sandbox, SandboxPolicy
from farmd.sandbox.result import WALL_TIME
from farmd.text import valid_text
from farmd.verifier.secret import public_rng
from farmd.verifier.verdict import (
    NO_ANSWER,
    SANDBOX_VIOLATION,
    SUSPECTED_HACK,
    TIMEOUT,
    Verdict,
    errored,
    failed,
)

MAX_STEPS = 30
"""Commands an episode may run; an attempt with more fails."""
MAX_COMMAND_BYTES = 16 * 1024
MAX_FINAL_CHARS = 4096
"""Longer final answers (of answer tasks) fail without a look."""
OUTPUT_CHARS = 4096
"""What an observation shows of a command's output: the head and the tail, with a marker between."""
_TAIL_CHARS = 1024
_NOTES_SHOWN = 8

STEP_POLICY = SandboxPolicy(wall_time_s=10, cpu_time_s=10, memory_mb=256, pids=64, disk_mb=32, disk_inodes=2048,
                            tmp_mb=16, shm_mb=4, output_kb=256)
"""One command's box. The tree carried between steps is bounded well below its disk (see TREE_*)."""
TREE_BYTES = 8 * 1024 * 1024
TREE_ENTRIES = 1000
TREE_DEPTH = 16
TREE_PATH_BYTES = 1024
"""Bounds of the tree carried between steps: what exceeds them is dropped, so that copying it into the
next box can never fail (the scratch disk is 32 MiB, and a host path has at most 4096 bytes)."""

Finish = Literal["answer", "files"]
CheckKind = Literal["bytes", "lines", "number", "ini"]

COMMON = (
    "You work in a shell. Each action is one command line, run with `sh -c` in a fresh sandbox whose working "
    "directory holds your files (`find . | sort` lists them). Only regular files and directories carry over "
    "from one command to the next: shell variables, the current directory, background processes, /tmp, "
    "symbolic links, FIFOs and set-id bits do not (a hard link becomes a second copy; execute bits stay). "
    "Tools: POSIX sh, coreutils, grep, sed, awk, find, sort, python3; no network. Each "
    f"command gets {STEP_POLICY.wall_time_s:g} seconds; at most {MAX_STEPS} commands."
)

WHOLE_WORD = "as a whole word: not preceded or followed by a letter, digit or underscore"


# -- puzzles ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What one file must hold at the end, and how it is compared."""

    kind: CheckKind
    """``bytes``: exactly; ``lines``: line by line, runs of blanks collapsed, blank lines at either end
    ignored; ``number``: the same decimal number; ``ini``: line by line, spaces around ``=`` ignored."""
    content: bytes


@dataclass(frozen=True)
class Puzzle:
    """A task's whole truth: the public tree and goal, and what the hidden check expects."""

    family: str
    goal: str
    answer_format: str
    finish: Finish
    files: Mapping[str, bytes]
    """The initial tree: relative path -> content."""
    actions: tuple[str, ...]
    """The reference's commands; for answer tasks the last one prints the answer."""
    answer: str = ""
    """The expected final answer (answer tasks)."""
    expected: Mapping[str, Expect] = field(default_factory=lambda: MappingProxyType({}))
    """Files the final tree must hold (file tasks)."""
    scope: tuple[str, ...] = ()
    """Directories whose regular files must be exactly the expected ones, nothing more."""


_WORD_LIST = """
able acid aged also area army away baby back ball band bank base bath bear beat bell belt best bird blow blue
boat body bone book boot born boss both bowl burn bush busy cake call calm came camp card care case cash cast
cell chat chip city club coal coat code cold come cook cool cope copy core cost crew crop dark date dawn deal
dear debt deep desk dial diet disk dock door dose down draw drop dual dust duty each earn ease east easy edge
else even ever face fact fair fall farm fast fate fear feed feel file fill film find fine fire firm fish five
flat flow food foot form fort four free fuel full fund gain game gate gave gear gift girl give glad goal gold
golf gone good gray grew grow gulf hair half hall hand hang hard head hear heat held help here hero hide high
hill hire hold hole home hope host hour huge hung hunt idea inch into iron item jump jury just keen keep kept
kick kind king knee knew know lack lady laid lake land lane last late lead left less life lift like line link
list live load loan lock long look lord lose loss lost love luck made mail main make male many mark mass meal
mean meat meet menu mild milk mill mind mine miss mode mood moon more most move much must name navy near neck
need news next nice nine none nose note once only open oral over pace pack page paid pain pair palm park part
pass past path peak pick pink pipe plan play plot plug plus poll pool poor port post pull pure push race rail
rain rank rare rate read real rear rely rent rest rice rich ride ring rise risk road rock role roll roof room
root rose rule rush safe said sake sale salt same sand save seat seed seek seem seen self sell send sent ship
shop shot show shut sick side sign site size skin slip slow snow soft soil sold sole some song soon sort soul
spot star stay step stop such suit sure take tale talk tall tank tape task team tell tend term test text than
that them then they thin this thus tide till time tiny told tone took tool tour town tree trip true tune turn
twin type unit upon used user vary vast very view vote wage wait wake walk wall want ward warm wash wave ways
weak wear week well went were west what when wide wife wild will wind wine wing wire wise wish with wood word
wore work yard year your zero zone account answer branch bridge button camera castle center chance change
charge cheese choice circle client coffee column corner county credit damage dinner doctor dollar driver
energy engine escape estate family father figure finger flight flower forest friend future garden ground
growth health height island kitchen leader letter listen market master matter member memory method middle
minute mirror moment monkey mother motion number object office orange palace parent people period person
planet player pocket poetry police potato random reason record region report result river rubber safety
salary school screen season second secret sector signal silver simple single sister source spirit spring
square status stone street stress string summer supply survey switch system table tennis theory ticket
timber tongue travel trophy turkey valley vendor victim violin vision volume wallet window winner winter
wonder worker writer yellow
"""
_WORDS = tuple(_WORD_LIST.split())
_DIRS = ("notes", "misc", "old", "archive", "reports", "drafts", "team", "alpha", "beta", "work", "docs",
         "shared", "ops", "lab", "q1", "q2", "2023", "2024", "spare", "inbox2")
_USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj",
          "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter")
_SERVICES = ("auth", "payments", "search", "billing", "mailer", "api")
_REGIONS = ("north", "south", "east", "west", "northwest", "southeast")
_PRODUCTS = ("apples", "pears", "plums", "figs", "kiwis")
_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def _q(text: str) -> str:
    return shlex.quote(text)


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _sentence(rng: random.Random, lo: int = 4, hi: int = 9) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _insert_word(rng: random.Random, line: str, word: str) -> str:
    words = line.split(" ")
    words.insert(rng.randint(0, len(words)), word)
    return " ".join(words)


def _whole_word(word: str) -> re.Pattern[str]:
    """What ``grep -w`` matches: ``word`` with no word character (letter, digit, underscore) either side."""
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])")


def _layout(rng: random.Random, root: str, n_files: int, depth: int, exts: tuple[str, ...],
            hidden: bool = False, names: tuple[str, ...] = _WORDS, unique_names: bool = False) -> list[str]:
    """``n_files`` distinct file paths under ``root``, in directories nested up to ``depth`` levels
    (with ``unique_names``, no two files share a name)."""
    dirs = [root]
    for _ in range(0 if depth <= 1 else max(1, n_files // 3)):
        parent = rng.choice([d for d in dirs if d.count("/") - root.count("/") < depth - 1])
        name = rng.choice(_DIRS) + (f"-{rng.randint(1, 9)}" if rng.random() < 0.3 else "")
        if hidden and rng.random() < 0.2:
            name = "." + name
        if f"{parent}/{name}" not in dirs:
            dirs.append(f"{parent}/{name}")
    taken = set(dirs)
    files: list[str] = []
    while len(files) < n_files:
        name = rng.choice(names) + rng.choice(exts)
        if hidden and rng.random() < 0.1:
            name = "." + name
        path = f"{rng.choice(dirs)}/{name}"
        if path not in taken and not (unique_names and name in taken):
            taken.update((path, name))
            files.append(path)
    return files


def _token(rng: random.Random) -> str:
    head = "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(3))
    return f"{head}-{''.join(rng.choice(_ALNUM) for _ in range(5))}"


def _one_off(rng: random.Random, token: str) -> str:
    """``token`` with one letter or digit changed."""
    spots = [i for i, c in enumerate(token) if c != "-"]
    i = rng.choice(spots)
    other = rng.choice([c for c in _ALNUM if c != token[i]])
    return token[:i] + other + token[i + 1:]


# find-token ------------------------------------------------------------------------------------------

def _find_token(rng: random.Random, d: int) -> Puzzle:
    n_files, depth, n_lines = [(4, 1, 8), (8, 2, 12), (14, 3, 16), (24, 4, 20), (36, 4, 24)][d - 1]
    paths = _layout(rng, "data", n_files, depth, (".txt", ".md", ".log", ""), hidden=d >= 4)
    texts = {p: [_sentence(rng) for _ in range(rng.randint(n_lines // 2, n_lines))] for p in paths}
    token = _token(rng)
    target = rng.choice(sorted(paths)[1:])  # never the first file: a guess at it must fail
    lineno = rng.randint(2, len(texts[target]))
    texts[target][lineno - 1] = _insert_word(rng, texts[target][lineno - 1], token)
    decoys: list[str] = []
    if d >= 2:
        decoys += [_one_off(rng, token) for _ in range(d)]
    if d >= 3:
        decoys += [token + rng.choice("abxyz019_"), rng.choice("abqz7_") + token, token.upper()]
    files: dict[str, bytes] = {}
    prompt_word = f"the word `{token}`"
    section = ""
    if d >= 4:
        sections = rng.sample(("current", "archive", "legacy", "staging", "backup", "mirror"), 3)
        section = sections[0]
        needles = {s: token if s == section else _token(rng) for s in sections}
        decoys += [needles[s] for s in sections[1:]]  # a wrong section's word is found too, elsewhere
        rng.shuffle(sections)
        lines = ["# what to search for"]
        for s in sections:
            lines += [f"[{s}]", f"owner = {rng.choice(_USERS)}", f"needle = {needles[s]}", ""]
        files["config/search.ini"] = _text(lines)
        prompt_word = f"the value of `needle` in the `[{section}]` section of `config/search.ini`"
    for decoy in decoys:
        p = rng.choice(paths)
        i = rng.randrange(len(texts[p]))
        if (p, i + 1) != (target, lineno):
            texts[p][i] = _insert_word(rng, texts[p][i], decoy)
    if d >= 5:  # a copy of the right file outside data/, which does not count
        files[f"backup/{target.split('/')[-1]}.bak"] = _text(texts[target])
    for p in paths:
        files[p] = _text(texts[p])
    found = [(p, i) for p in paths for i, line in enumerate(texts[p], 1) if _whole_word(token).search(line)]
    _ensure(found == [(target, lineno)], "find-token: the word must be on exactly one line")
    where = "Only files under `data/` count. " if d >= 4 else ""
    goal = (f"Exactly one line of one file under `data/` contains {prompt_word} ({WHOLE_WORD}). {where}"
            "Find that file and that line.")
    actions = [f"grep -rnwF -- {_q(token)} data | cut -d: -f1,2"]
    if d >= 4:
        actions.insert(0, f"sed -n '/^\\[{section}\\]/,/^\\[/p' config/search.ini")
    return Puzzle(
        family="find-token", goal=goal, finish="answer", files=MappingProxyType(files), actions=tuple(actions),
        answer=f"{target}:{lineno}",
        answer_format=("Finish with a final answer: the file's path relative to the working directory and the "
                       "line's number (counting from 1), joined by a colon, e.g. `data/notes/todo.txt:7`, and "
                       "nothing else. The files you leave are not checked."),
    )


# count-lines -----------------------------------------------------------------------------------------

def _log_line(rng: random.Random, level: str, svc: str, message: str) -> str:
    return (f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:"
            f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} {level} [{svc}] {message}")


def _count_lines(rng: random.Random, d: int) -> Puzzle:
    word = rng.choice(("ERROR", "WARN"))
    svc = rng.choice(_SERVICES) if d >= 4 else ""
    n_files, n_lines = [(2, 15), (3, 20), (5, 25), (7, 30), (10, 40)][d - 1]
    near = [word + "S", word + "_COUNT", word.lower(), "NO" + word, word + "2"]
    while True:  # redraw until the count is not a small constant a guess could hit
        files: dict[str, bytes] = {}
        logs = _layout(rng, "logs", n_files, 1 if d <= 2 else 2, (".log",), names=_SERVICES + _DIRS)
        extra: list[str] = []
        if d >= 2:
            extra += [f"logs/{rng.choice(('notes', 'todo', 'readme'))}.txt"]
        if d >= 3:
            extra += [f"{p}.1" for p in rng.sample(logs, 2)]
        for p in logs + extra:
            lines = []
            for _ in range(rng.randint(n_lines // 2, n_lines)):
                message = _sentence(rng, 3, 7)
                if d >= 3 and rng.random() < 0.25:
                    message = _insert_word(rng, message, rng.choice(near))
                if d >= 3 and rng.random() < 0.08:
                    message = _insert_word(rng, message, word)  # the word, at another level: it counts
                if d >= 4 and rng.random() < 0.2:
                    message = _insert_word(rng, message, svc)  # the service's name, not its tag
                level = rng.choice(("INFO", "DEBUG", "WARN", "ERROR", "INFO"))
                lines.append(_log_line(rng, level, rng.choice(_SERVICES), message))
            files[p] = _text(lines)
        pattern = _whole_word(word)
        count = sum(1 for p in logs for line in files[p].decode().splitlines()
                    if pattern.search(line) and (not svc or f"[{svc}]" in line))
        if count >= 3:
            break
    tag = f" and the service tag `[{svc}]`" if svc else ""
    logs_text = "find logs -type f -name '*.log' -exec cat {} +"
    pipeline = (f"{logs_text} | grep -w {word} | grep -cF {_q(f'[{svc}]')}" if svc
                else f"{logs_text} | grep -cw {word}")
    goal = (f"Count the lines, over every file under `logs/` (subdirectories included) whose name ends in "
            f"`.log`, that contain the word `{word}` (case-sensitive, {WHOLE_WORD}){tag}.")
    return Puzzle(
        family="count-lines", goal=goal, finish="answer", files=MappingProxyType(files), actions=(pipeline,),
        answer=str(count),
        answer_format="Finish with a final answer: the number alone, in decimal digits. The files you leave "
                      "are not checked.",
    )


# csv-sum ---------------------------------------------------------------------------------------------

_COLUMNS = ("id", "date", "region", "product", "amount", "qty")


def _csv_file(rng: random.Random, rows: list[dict[str, str]], d: int) -> bytes:
    columns = list(_COLUMNS)
    if d >= 3:
        rng.shuffle(columns)

    def pad(v: str) -> str:
        return f"{' ' * rng.randint(0, 2)}{v}{' ' * rng.randint(0, 2)}" if d >= 5 else v

    lines = [",".join(pad(c) for c in columns)] + [",".join(pad(r[c]) for c in columns) for r in rows]
    if d >= 4:
        for _ in range(rng.randint(1, 3)):
            lines.insert(rng.randint(0, len(lines)), rng.choice(("", f"# {_sentence(rng, 2, 5)}")))
    return _text(lines)


def _csv_sum(rng: random.Random, d: int) -> Puzzle:
    n_files, n_rows = [(1, 10), (1, 20), (1, 30), (3, 15), (4, 15)][d - 1]
    region = rng.choice(_REGIONS) if d >= 2 else ""
    product = rng.choice(_PRODUCTS) if d >= 5 else ""
    cents = d >= 3
    while True:
        files: dict[str, bytes] = {}
        every = Decimal(0)
        total = Decimal(0)
        matched = 0
        row_id = 1
        names = [f"sales/{n}.csv" for n in (["data"] if n_files == 1 else ["q1", "q2", "q3", "q4"][:n_files])]
        for name in names:
            rows = []
            for _ in range(n_rows):
                amount = Decimal(rng.randint(100, 50000)) / 100 if cents else Decimal(rng.randint(1, 500))
                if d >= 5 and rng.random() < 0.2:
                    amount = -amount  # a refund
                row = {"id": str(row_id), "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                       "region": rng.choice(_REGIONS), "product": rng.choice(_PRODUCTS),
                       "amount": f"{amount:.2f}" if cents else str(amount), "qty": str(rng.randint(1, 20))}
                rows.append(row)
                row_id += 1
                every += amount
                if (not region or row["region"] == region) and (not product or row["product"] == product):
                    total += amount
                    matched += 1
            files[name] = _csv_file(rng, rows, d)
        if matched >= 2 and total != 0 and (not region or total != every):
            break
    if d >= 5:
        files["sales/notes.txt"] = _text([f"target for {region}: {rng.randint(1000, 9999)}", _sentence(rng)])
    where = "the rows"
    if region:
        where += f" whose `region` is exactly `{region}`"
    if product:
        where += f" and whose `product` is exactly `{product}`"
    rules = ["Every `.csv` file under `sales/` starts with a header line naming its columns, then has one row "
             "per line (no quoted fields)."]
    if d >= 3:
        rules.append("Columns may come in any order" + (", and each file has its own." if d >= 4 else "."))
    if d >= 4:
        rules.append("Lines that are blank or start with `#` are neither header nor rows.")
    if d >= 5:
        rules.append("Fields may have spaces around them; amounts may be negative.")
    goal = " ".join(rules) + f" Write the sum of the `amount` column over {where}, in every such file, to `total.txt`."
    fmt = f"{total:.2f}" if cents else str(total)
    code = (
        "import csv, decimal, glob, sys\n"
        "region, product = sys.argv[1:]\n"
        "t = decimal.Decimal(0)\n"
        "for p in sorted(glob.glob(\"sales/**/*.csv\", recursive=True)):\n"
        "    lines = [l for l in open(p) if l.strip() and not l.lstrip().startswith(\"#\")]\n"
        "    rows = csv.reader(lines)\n"
        "    head = [c.strip() for c in next(rows)]\n"
        "    for row in rows:\n"
        "        r = dict(zip(head, (c.strip() for c in row)))\n"
        "        if region in (\"\", r[\"region\"]) and product in (\"\", r[\"product\"]):\n"
        "            t += decimal.Decimal(r[\"amount\"])\n"
        "print(t)\n"
    )
    return Puzzle(
        family="csv-sum", goal=goal, finish="files", files=MappingProxyType(files),
        actions=(f"python3 -c {_q(code)} {_q(region)} {_q(product)} > total.txt",),
        expected=MappingProxyType({"total.txt": Expect("number", f"{fmt}\n".encode())}),
        answer_format=("Finish by leaving `total.txt` holding the number alone (decimal notation, e.g. `12.5` or "
                       "`12.50`; no thousands separators). The final file state is checked; the final answer "
                       "text is ignored."),
    )


# move-files ------------------------------------------------------------------------------------------

def _body(rng: random.Random, i: int) -> list[str]:
    return [f"id: {i}", _sentence(rng)]


@dataclass
class _Moves:
    files: dict[str, bytes]
    final: dict[str, bytes]
    goal: str
    action: str
    scope: tuple[str, ...]


def _rename_jpeg(rng: random.Random, d: int) -> _Moves:
    paths = _layout(rng, "photos", [5, 9][d - 1], d, (".jpeg", ".jpeg", ".png", ".gif"))
    if d >= 2:  # near misses: the extension's letters elsewhere in the name
        paths += ["photos/jpeg-notes.txt", f"photos/{rng.choice(_WORDS)}.jpeg.bak"]
    paths += [f"photos/{w}.jpeg" for w in rng.sample(_WORDS, 1) if f"photos/{w}.jpeg" not in paths]
    files = {p: _text(_body(rng, i)) for i, p in enumerate(paths)}
    final = {(p[:-len(".jpeg")] + ".jpg" if p.endswith(".jpeg") else p): c for p, c in files.items()}
    sub = " (in subdirectories too)" if d >= 2 else ""
    goal = (f"Rename every file under `photos/`{sub} whose name ends in `.jpeg` so that it ends in `.jpg` "
            "instead, in the same directory; leave every other file as it is.")
    action = "find photos -type f -name '*.jpeg' | while IFS= read -r f; do mv -- \"$f\" \"${f%.jpeg}.jpg\"; done"
    return _Moves(files, final, goal, action, ("photos",))


def _collect_drafts(rng: random.Random) -> _Moves:
    paths = _layout(rng, "inbox", 12, 2, (".txt", ".md"), names=tuple(rng.sample(_WORDS, 12)), unique_names=True)
    files: dict[str, bytes] = {}
    final: dict[str, bytes] = {}
    for i, p in enumerate(paths):  # unique names: flattening never collides
        head, tail = p.rsplit("/", 1)
        prefix = rng.choice(("draft_", "draft_", "", "final_draft_", "notes_"))
        path = f"{head}/{prefix}{tail}"
        files[path] = _text(_body(rng, i))
        final[f"drafts/{tail}" if prefix == "draft_" else path] = files[path]
    goal = ("Move every file under `inbox/` (subdirectories included) whose name starts with `draft_` into the "
            "directory `drafts/` (create it), dropping the `draft_` prefix from its name; leave every other file "
            "where it is.")
    action = ("mkdir -p drafts && find inbox -type f -name 'draft_*' | while IFS= read -r f; do b=${f##*/}; "
              "mv -- \"$f\" \"drafts/${b#draft_}\"; done")
    return _Moves(files, final, goal, action, ("inbox", "drafts"))


def _sort_by_extension(rng: random.Random) -> _Moves:
    paths = _layout(rng, "inbox", 16, 3, (".txt", ".csv", ".log", ".tar.gz", ""),
                    names=tuple(rng.sample(_WORDS, 16)), unique_names=True)
    files = {p: _text(_body(rng, i)) for i, p in enumerate(paths)}
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
    paths = _layout(rng, "inbox", 20, 3, (".txt", ".md"), names=tuple(rng.sample(_WORDS, 20)), unique_names=True)
    files: dict[str, bytes] = {}
    final: dict[str, bytes] = {}
    for i, p in enumerate(paths):
        y, m = rng.randint(2019, 2024), rng.randint(1, 12)
        date = f"{y}-{m:02d}-{rng.randint(1, 28):02d}"
        kind = rng.choice(("dated", "dated", "dated", "undated", "late", "other"))
        first = {"dated": f"date: {date}", "undated": "date: unknown", "late": f"title: {rng.choice(_WORDS)}",
                 "other": f"updated: {date}"}[kind]
        lines = [first, *_body(rng, i)]
        if kind == "late":
            lines.insert(1, f"date: {date}")  # not on the first line: the file stays
        files[p] = _text(lines)
        final[f"archive/{y}/{m:02d}/{p.rsplit('/', 1)[1]}" if kind == "dated" else p] = files[p]
    goal = ("Some files under `inbox/` (subdirectories included) have a first line of the form "
            "`date: YYYY-MM-DD`. Move each of them to `archive/YYYY/MM/NAME` (NAME: its file name; YYYY and MM "
            "from that date). Create the directories you need; leave every other file where it is.")
    action = ("find inbox -type f | while IFS= read -r f; do d=$(sed -n "
              "'1s/^date: \\([0-9]\\{4\\}\\)-\\([0-9]\\{2\\}\\)-[0-9]\\{2\\}$/\\1\\/\\2/p' \"$f\"); "
              "if [ -n \"$d\" ]; then mkdir -p \"archive/$d\" && mv -- \"$f\" \"archive/$d/${f##*/}\"; fi; done")
    return _Moves(files, final, goal, action, ("inbox", "archive"))


def _move_files(rng: random.Random, d: int) -> Puzzle:
    moves = (_rename_jpeg(rng, d) if d <= 2 else
             {3: _collect_drafts, 4: _sort_by_extension, 5: _archive_by_date}[d](rng))
    _ensure(len(moves.final) == len(moves.files) and moves.final.keys() != moves.files.keys(),
            "move-files: targets must not collide, and something must move")
    checked = ", ".join(f"`{s}/`" for s in moves.scope)
    return Puzzle(
        family="move-files", goal=moves.goal, finish="files", files=MappingProxyType(moves.files),
        actions=(moves.action,), expected=MappingProxyType({p: Expect("bytes", c) for p, c in moves.final.items()}),
        scope=moves.scope,
        answer_format=(f"Finish by leaving the files in place. The final state of {checked} is checked: exactly "
                       "the files the rule gives, each with its original contents (empty directories do not "
                       "matter). The final answer text is ignored."),
    )


# distinct-words --------------------------------------------------------------------------------------

def _prose(rng: random.Random, vocabulary: list[str], n_words: int, d: int) -> str:
    out: list[str] = []
    start = True
    for _ in range(n_words):
        roll = rng.random()
        if roll < 0.05:
            word = str(rng.randint(1, 999))
        elif d >= 2 and roll < 0.12:
            word = f"{rng.choice(vocabulary)}-{rng.choice(vocabulary)}"
        else:
            word = rng.choice(vocabulary)
        if d >= 3 and (start or rng.random() < 0.1):
            word = word.capitalize() if rng.random() < 0.8 else word.upper()
        start = False
        punct = rng.choice((" ", " ", " ", " ", ", ", ". ", "; ", "! ", "? "))
        start = punct in (". ", "! ", "? ")
        out.append(word + punct)
    return "".join(out).strip() + "\n"


def _distinct_words(rng: random.Random, d: int) -> Puzzle:
    n_files, n_words = [(1, 40), (3, 40), (4, 50), (5, 50), (6, 40)][d - 1]
    vocabulary = rng.sample(_WORDS, [60, 80, 100, 120, 50][d - 1])
    names = tuple(rng.sample(_WORDS, 12))
    paths = ([f"texts/{n}.txt" for n in names[:n_files]] if d <= 3
             else _layout(rng, "texts", n_files, 2, (".txt",), names=names))
    files = {p: _prose(rng, vocabulary, n_words, d).encode() for p in paths}
    if d >= 4:
        for p in _layout(rng, "texts", 2, 2, (".md",), names=names):
            files[p] = _prose(rng, rng.sample(_WORDS, 30), n_words, d).encode()
    per_file = [set(re.findall(r"[a-z]+", files[p].decode().lower())) for p in paths]
    if d >= 5:
        seen = Counter(w for words in per_file for w in words)
        wanted = sorted(w for w, n in seen.items() if n >= 2)
    else:
        wanted = sorted(set().union(*per_file))
        if d >= 4:
            wanted = [w for w in wanted if len(w) >= 5]
    _ensure(len(wanted) >= 3, "distinct-words: the list must not be trivial")
    which = "every file under `texts/`" if d <= 3 else "every file under `texts/` (subdirectories included) " \
        "whose name ends in `.txt`"
    lower = " after converting the text to lower case" if d >= 3 else ""
    rule = {4: " Keep only words of at least 5 letters.",
            5: " Keep only words that appear in at least two different files."}.get(d, "")
    goal = (f"A word is a maximal run of the letters a-z{lower}. Write every distinct word found in {which} to "
            f"`words.txt`, one per line, sorted in byte order (as `LC_ALL=C sort` does), without duplicates.{rule}")
    split = "tr A-Z a-z | tr -cs a-z '\\n'" if d >= 3 else "tr -cs a-z '\\n'"
    if d <= 3:
        action = f"cat texts/*.txt | {split} | grep . | LC_ALL=C sort -u > words.txt"
    elif d == 4:
        action = (f"find texts -type f -name '*.txt' -exec cat {{}} + | {split} | grep -E '^.{{5,}}$' | "
                  "LC_ALL=C sort -u > words.txt")
    else:
        action = ("for f in $(find texts -type f -name '*.txt'); do tr A-Z a-z < \"$f\" | tr -cs a-z '\\n' | "
                  "grep . | LC_ALL=C sort -u; done | LC_ALL=C sort | uniq -d > words.txt")
    return Puzzle(
        family="distinct-words", goal=goal, finish="files", files=MappingProxyType(files), actions=(action,),
        expected=MappingProxyType({"words.txt": Expect("lines", _text(wanted))}),
        answer_format="Finish by leaving `words.txt` as described. The final file state is checked; the final "
                      "answer text is ignored.",
    )


# edit-config -----------------------------------------------------------------------------------------

_SECTIONS: dict[str, tuple[str, ...]] = {
    "server": ("port", "host", "workers", "timeout"),
    "database": ("port", "host", "user", "pool"),
    "cache": ("size", "ttl", "host", "port"),
    "logging": ("level", "path", "rotate", "timeout"),
    "admin": ("port", "user", "timeout", "workers"),
    "host": ("cpus", "memory", "name"),
    "auth": ("timeout", "retries", "realm", "port"),
    "queue": ("workers", "size", "retries", "host"),
}
_NUMERIC = frozenset({"port", "workers", "timeout", "pool", "size", "ttl", "rotate", "cpus", "memory", "retries"})


def _value(rng: random.Random, key: str) -> str:
    if key in _NUMERIC:
        return str(rng.randint(2, 9000))
    return {"host": f"{rng.choice(_WORDS)}.local", "user": rng.choice(_USERS), "path": f"/var/log/{rng.choice(_WORDS)}",
            "level": rng.choice(("info", "debug", "warn")), "realm": rng.choice(_WORDS).upper(),
            "name": rng.choice(_WORDS)}[key]


def _ini(sections: list[tuple[str, list[tuple[str, str]]]], header: str) -> list[str]:
    lines = [f"# {header}", ""]
    for name, body in sections:
        lines.append(f"[{name}]")
        lines += [f"{k} = {v}" if k != "#" else v for k, v in body]
        lines.append("")
    return lines


def _config_sections(rng: random.Random, d: int) -> tuple[list[str], str, list[str]]:
    """Section names, the target section, and the numeric key of it to set literally."""
    while True:
        names = rng.sample(sorted(_SECTIONS), [2, 3, 4, 6, 6][d - 1])
        if d >= 5 and "host" not in names:
            names[-1] = "host"  # where the computed edit reads `cpus`
        target = rng.choice([n for n in names if n != "host"] or names)
        # At level 5 `workers` is the computed edit, so the literal edits are of other keys.
        keys = [k for k in _SECTIONS[target] if k in _NUMERIC and (d < 5 or k != "workers")]
        shared = [k for k in keys if any(k in _SECTIONS[n] for n in names if n != target)]
        if d in (2, 3) and not shared:
            continue  # the same key must appear in another section, to be left alone
        if (d == 4 and len(keys) < 2) or (d >= 5 and ("workers" not in _SECTIONS[target] or not keys)):
            continue
        return names, target, (shared if d >= 2 and shared else keys)


def _config_files(rng: random.Random, names: list[str], target: str, d: int) -> dict[str, list[str]]:
    """Which sections go in which file: one file up to level 3, three under `etc/conf.d/` beyond."""
    if d <= 3:
        return {"etc/app.ini": names}
    rng.shuffle(names)
    cut = sorted(rng.sample(range(1, len(names)), 2))
    parts = [names[:cut[0]], names[cut[0]:cut[1]], names[cut[1]:]]
    groups = {f"etc/conf.d/{i}0-{tag}.ini": part for i, (tag, part) in
              enumerate(zip(("base", "net", "extra"), parts, strict=True), 1)}
    home = next(p for p, g in groups.items() if target in g)
    if d >= 5 and "host" in groups[home]:  # [host] must live in another file: swap it for a section there
        other = next(p for p in groups if p != home)
        i = groups[home].index("host")
        groups[home][i], groups[other][0] = groups[other][0], groups[home][i]
    return groups


def _config_action(target: str, new: dict[str, str], d: int) -> str:
    exprs = []
    for k, v in new.items():
        if d >= 5 and k == "workers":  # double quotes: the shell computes the value
            exprs.append(f'-e "/^\\[{target}\\]/,/^\\[/ s/^workers = .*/workers = $((2 * c))/"')
        else:
            exprs.append(f"-e '/^\\[{target}\\]/,/^\\[/ s/^{k} = .*/{k} = {v}/'")
    if d <= 3:
        return f"sed -i {' '.join(exprs)} etc/app.ini"
    action = f"f=$(grep -l '^\\[{target}\\]' etc/conf.d/*.ini) && sed -i {' '.join(exprs)} \"$f\""
    if d >= 5:
        action = "c=$(sed -s -n '/^\\[host\\]/,/^\\[/ s/^cpus = //p' etc/conf.d/*.ini) && " + action
    return action


def _edit_config(rng: random.Random, d: int) -> Puzzle:
    names, target, candidates = _config_sections(rng, d)
    first = rng.choice(candidates)
    bodies: dict[str, list[tuple[str, str]]] = {}
    for n in names:
        bodies[n] = [(k, _value(rng, k)) for k in _SECTIONS[n]]
        rng.shuffle(bodies[n])
    old = dict(bodies[target])
    edited = [first]
    if d == 4:
        edited.append(rng.choice([k for k in _SECTIONS[target] if k in _NUMERIC and k != first]))
    new = {k: str(int(old[k]) + rng.randint(1, 500)) for k in edited}
    if d >= 5:
        cpus = int(dict(bodies["host"])["cpus"]) % 64 + 2
        bodies["host"] = [("#", f"# cpus = {cpus + 7}"), *((k, str(cpus) if k == "cpus" else v)
                                                           for k, v in bodies["host"])]
        new["workers"] = str(2 * cpus)
    if d >= 3:  # near misses in the target section: the key commented out, and a longer key
        body = bodies[target]
        body.insert(rng.randint(0, len(body)), ("#", f"# {first} = {rng.randint(2, 9000)}"))
        body.insert(rng.randint(0, len(body)),
                    (f"{first}_{rng.choice(('max', 'min', 'backup'))}", str(rng.randint(2, 9000))))
    files: dict[str, bytes] = {}
    final: dict[str, bytes] = {}
    for path, group in _config_files(rng, names, target, d).items():
        header = f"{path.rsplit('/', 1)[1]}: {_sentence(rng, 2, 4)}"
        files[path] = _text(_ini([(n, bodies[n]) for n in group], header))
        after = [(n, [(k, new[k]) if n == target and k in new else (k, v) for k, v in bodies[n]]) for n in group]
        final[path] = _text(_ini(after, header))
    _ensure(files != final, "edit-config: the edit must change something")
    changes = [f"`{k}` to `{v}`" for k, v in new.items() if not (d >= 5 and k == "workers")]
    if d >= 5:
        changes.append("`workers` to twice the value of `cpus` in section `[host]`")
    where = "`etc/app.ini`" if d <= 3 else "the INI files under `etc/conf.d/` (the one that has it)"
    goal = (f"In section `[{target}]` of {where}, set {' and '.join(changes)}. Change nothing else: every other "
            "line of every file under `etc/` must stay as it is (spaces around `=` and at line ends do not "
            "matter), and leave no other files under `etc/`.")
    return Puzzle(
        family="edit-config", goal=goal, finish="files", files=MappingProxyType(files),
        actions=(_config_action(target, new, d),),
        expected=MappingProxyType({p: Expect("ini", c) for p, c in final.items()}), scope=("etc",),
        answer_format="Finish by leaving the edited files in place. The final state of `etc/` is checked; the "
                      "final answer text is ignored.",
    )


# log-fields ------------------------------------------------------------------------------------------

_STATUSES = (200, 200, 200, 201, 204, 301, 304, 400, 401, 403, 404, 500, 500, 502, 503, 504)


def _access_line(rng: random.Random, req: str, status: int, user: str, shuffle: bool) -> str:
    fields = [f"req={req}", f"method={rng.choice(('GET', 'POST', 'PUT', 'DELETE'))}",
              f"path=/api/{rng.choice(_WORDS)}/{rng.randint(1, 999)}", f"status={status}",
              f"ms={rng.randint(1, 999)}", f"user={user}"]
    if shuffle:
        rng.shuffle(fields)
    stamp = f"2024-03-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
    return " ".join([stamp, *fields])


def _log_fields(rng: random.Random, d: int) -> Puzzle:
    n_files, n_lines = [(1, 20), (1, 30), (3, 20), (4, 20), (5, 20)][d - 1]
    users = rng.sample(_USERS, 6)
    only_500 = d <= 2
    while True:
        files: dict[str, bytes] = {}
        failed_ids: list[str] = []
        per_user: Counter[str] = Counter()
        names = ["logs/access.log"] if n_files == 1 else [f"logs/access-{i}.log" for i in range(1, n_files + 1)]
        for name in names:
            lines = []
            for _ in range(n_lines):
                req = "".join(rng.choice("0123456789abcdef") for _ in range(8))
                status, user = rng.choice(_STATUSES), rng.choice(users)
                lines.append(_access_line(rng, req, status, user, shuffle=d >= 2))
                if status == 500 or (not only_500 and 500 <= status <= 599):
                    failed_ids.append(req)
                    per_user[user] += 1
            files[name] = _text(lines)
        if d >= 3:
            files["logs/access.log.bak"] = _text([_access_line(rng, "deadbeef", 500, users[0], True)])
        if len(failed_ids) >= 2 and len(per_user) >= 2:
            break
    status_rule = "status is `500`" if only_500 else "status is in the 500s (500 to 599)"
    scope = "`logs/access.log`" if n_files == 1 else "the files under `logs/` whose name ends in `.log` (in name order)"
    extract = ("awk '{s = \"\"; for (i = 2; i <= NF; i++) { k = $i; sub(/=.*/, \"\", k); v = $i; sub(/^[^=]*=/, \"\", v); "
               "if (k == \"status\") s = v; else if (k == \"req\") r = v; else if (k == \"user\") u = v } "
               f"if (s ~ /{'^500$' if only_500 else '^5[0-9][0-9]$'}/) print {'u' if d >= 4 else 'r'} }}' "
               + ("logs/access.log" if n_files == 1 else "logs/*.log"))
    intro = (f"Each line of {scope} is a timestamp followed by `key=value` fields"
             + (" in any order" if d >= 2 else "") + f". A request failed when its {status_rule}. ")
    if d <= 3:
        out, lines_out = "failed.txt", failed_ids
        goal = intro + (f"Write the `req` value of every failed request to `{out}`, one per line, in the order "
                        "they appear" + (" (files in name order, then line by line)." if n_files > 1 else "."))
        action = f"{extract} > {out}"
    elif d == 4:
        out, lines_out = "users.txt", sorted(per_user)
        goal = intro + (f"Write every `user` that has at least one failed request to `{out}`, one per line, sorted "
                        "in byte order, without duplicates.")
        action = f"{extract} | LC_ALL=C sort -u > {out}"
    else:
        out = "report.txt"
        ranked = sorted(per_user.items(), key=lambda kv: (-kv[1], kv[0]))
        lines_out = [f"{u} {n}" for u, n in ranked]
        goal = intro + (f"For every `user` with at least one failed request, write a line `USER COUNT` (COUNT: that "
                        f"user's failed requests) to `{out}`, sorted by COUNT, largest first, then by USER in "
                        "byte order.")
        action = f"{extract} | LC_ALL=C sort | uniq -c | awk '{{print $2, $1}}' | LC_ALL=C sort -k2,2nr -k1,1 > {out}"
    return Puzzle(
        family="log-fields", goal=goal, finish="files", files=MappingProxyType(files), actions=(action,),
        expected=MappingProxyType({out: Expect("lines", _text(lines_out))}),
        answer_format=f"Finish by leaving `{out}` as described. The final file state is checked; the final "
                      "answer text is ignored.",
    )


FAMILIES: tuple[tuple[str, Callable[[random.Random, int], Puzzle]], ...] = (
    ("find-token", _find_token),
    ("count-lines", _count_lines),
    ("csv-sum", _csv_sum),
    ("move-files", _move_files),
    ("distinct-words", _distinct_words),
    ("edit-config", _edit_config),
    ("log-fields", _log_fields),
)


class GeneratorBug(FarmError):
    """A generated puzzle broke one of its own invariants (a bug in this module, never the attempt's fault)."""


def _ensure(ok: bool, message: str) -> None:
    if not ok:
        raise GeneratorBug(message)


def family_of(seed: int, difficulty: int) -> str:
    """Which family a task belongs to: a rotation, so that a few seeds of each level cover every family."""
    return FAMILIES[(seed + 3 * (difficulty - 1)) % len(FAMILIES)][0]


@functools.lru_cache(maxsize=512)
def build_puzzle(env: str, version: str, seed: int, difficulty: int) -> Puzzle:
    """The puzzle of a task, from its public identity only (deterministic)."""
    family = family_of(seed, difficulty)
    make = dict(FAMILIES)[family]
    return make(public_rng(env, version, seed, difficulty, family), difficulty)


# -- checks --------------------------------------------------------------------------------------------

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


def _read_regular(tree: Path, rel: str) -> bytes | None:
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
        got = _read_regular(tree, rel)
        if got is None:
            problems.append(f"{rel}: missing (or not a regular file)")
            continue
        why = matches(expect, got)
        if why is not None:
            problems.append(f"{rel}: {why}")
    return problems


def _shown(path: str) -> str:
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")[:200]


# -- episodes ------------------------------------------------------------------------------------------

def _command_problem(command: str) -> str | None:
    if "\0" in command:
        return "the command holds a NUL byte"
    try:
        size = len(command.encode("utf-8"))
    except UnicodeEncodeError:
        return "the command is not valid UTF-8 text"
    if size > MAX_COMMAND_BYTES:
        return f"the command is longer than {MAX_COMMAND_BYTES} bytes"
    return None


def _shorten(text: str, limit: int = OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = text[:limit - _TAIL_CHARS]
    tail = text[-_TAIL_CHARS:]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"


@dataclass
class _TreeBudget:
    """What the carried tree has used so far; each entry is admitted or refused, with why."""

    entries: int = 0
    size: int = 0

    def directory(self, rel: bytes) -> str | None:
        if rel.count(b"/") + 1 > TREE_DEPTH:
            return f"deeper than {TREE_DEPTH} directories"
        return self._admit(rel, 0)

    def file(self, rel: bytes, st: os.stat_result) -> str | None:
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if self.size + st.st_size > TREE_BYTES:
            return f"the tree would exceed {TREE_BYTES // (1024 * 1024)} MiB"
        return self._admit(rel, st.st_size)

    def _admit(self, rel: bytes, size: int) -> str | None:
        if len(rel) > TREE_PATH_BYTES:
            return f"path longer than {TREE_PATH_BYTES} bytes"
        if self.entries >= TREE_ENTRIES:
            return f"more than {TREE_ENTRIES} files and directories"
        self.entries += 1
        self.size += size
        return None


def _bound_tree(root: Path) -> list[tuple[str, str]]:
    """Drop whatever takes the tree past its bounds, in name order; returns (path, why) of each drop.

    Walks by descriptor, so neither depth nor path length can make it fail.
    """
    dropped: list[tuple[str, str]] = []
    budget = _TreeBudget()
    prefix = len(os.fsencode(root)) + 1
    for dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        rel_dir = os.fsencode(dirpath)[prefix:]
        dirnames.sort()  # pruning dirnames in place keeps fwalk out of what is dropped
        for name in list(dirnames):
            rel = os.path.join(rel_dir, os.fsencode(name)) if rel_dir else os.fsencode(name)
            why = budget.directory(rel)
            if why is not None:
                shutil.rmtree(name, dir_fd=dirfd)
                dirnames.remove(name)
                dropped.append((rel.decode("utf-8", "backslashreplace"), why))
        for name in sorted(filenames):
            rel = os.path.join(rel_dir, os.fsencode(name)) if rel_dir else os.fsencode(name)
            why = budget.file(rel, os.stat(name, dir_fd=dirfd, follow_symlinks=False))
            if why is not None:
                os.unlink(name, dir_fd=dirfd)
                dropped.append((rel.decode("utf-8", "backslashreplace"), why))
    return dropped


class ShellEpisode(Episode):
    """A rollout's working tree and the commands run over it, one fresh box each.

    Create it with ``await ShellEpisode.start(...)``; ``close()`` removes the tree.
    """

    def __init__(self, sandbox: Sandbox, root: Path, max_steps: int = MAX_STEPS) -> None:
        self._sandbox = sandbox
        self._root = root
        self.tree = root / "tree"
        self.max_steps = max_steps
        self.steps = 0
        self.violations: list[str] = []
        """``"step N: bound"`` for every bound a step's box hit."""
        self.timed_out = False
        self.dropped: dict[str, str] = {}
        """Every path some step left that was not carried on, with why (the latest reason wins)."""
        self._closed = False
        self._lock = asyncio.Lock()  # one command at a time: each starts from the tree the last one left

    @classmethod
    async def start(cls, sandbox: Sandbox, files: Mapping[str, bytes], scratch_dir: Path | None = None,
                    max_steps: int = MAX_STEPS) -> ShellEpisode:
        root = await asyncio.to_thread(_new_root, files, scratch_dir)
        return cls(sandbox, root, max_steps)

    async def act(self, action: str) -> Observation:
        """Run one command; what it printed (shortened) and its exit status come back, plus notes on bounds
        it hit and on files that do not carry over. Raises SandboxError only when the sandbox fails."""
        async with self._lock:
            return await self._act(action)

    async def _act(self, action: str) -> Observation:
        if self._closed:
            raise TaskError("this episode is closed")
        if self.steps >= self.max_steps:
            return Observation(f"[not run: all {self.max_steps} commands are used]", None, done=True)
        self.steps += 1
        done = self.steps >= self.max_steps
        problem = _command_problem(action)
        if problem is not None:
            return Observation(f"[not run: {problem}]", None, done=done)
        keep = self._root / f"step-{self.steps}"
        result = await self._sandbox.run(["sh", "-c", action], STEP_POLICY, files=self.tree, keep=keep)
        skipped = list(result.harvest.skipped) if result.harvest is not None else []
        skipped += await asyncio.to_thread(self._adopt, keep)
        for path, why in skipped:
            self.dropped[path] = why
        for bound in result.violations:
            self.violations.append(f"step {self.steps}: {bound}")
        self.timed_out = self.timed_out or result.timed_out or WALL_TIME in result.violations
        return Observation(self._render(result.stdout, result.stderr, result.violations, result.exit_code,
                                        result.signal, skipped), result.exit_code, done=done,
                           violations=list(result.violations))

    def _adopt(self, keep: Path) -> list[tuple[str, str]]:
        keep.mkdir(exist_ok=True)
        dropped = _bound_tree(keep)
        shutil.rmtree(self.tree)
        keep.rename(self.tree)
        return dropped

    def _render(self, stdout: bytes, stderr: bytes, violations: list[str], exit_code: int | None,
                signal: int | None, skipped: list[tuple[str, str]]) -> str:
        out = stdout.decode("utf-8", errors="replace")
        err = stderr.decode("utf-8", errors="replace")
        if out and err and not out.endswith("\n"):
            out += "\n"
        notes = []
        if violations:
            notes.append(f"[the command hit its box's bound on {', '.join(violations)} and was stopped; the files it "
                         "left are kept]")
        elif exit_code is None and signal is not None:
            notes.append(f"[killed by signal {signal}]")
        if skipped:
            shown = ", ".join(f"{p} ({why})" for p, why in skipped[:_NOTES_SHOWN])
            more = f" and {len(skipped) - _NOTES_SHOWN} more" if len(skipped) > _NOTES_SHOWN else ""
            notes.append(f"[not carried to the next command: {shown}{more}]")
        body = _shorten(out + err)
        return "\n".join([body.rstrip("\n"), *notes]) if notes else body

    async def close(self) -> None:
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await asyncio.to_thread(shutil.rmtree, self._root, True)


def _new_root(files: Mapping[str, bytes], scratch_dir: Path | None) -> Path:
    if scratch_dir is not None:
        scratch_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="farm-shell-", dir=scratch_dir))
    try:
        tree = root / "tree"
        tree.mkdir()
        for rel, content in files.items():
            path = tree / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


# -- the environment -----------------------------------------------------------------------------------

_LINK_REASONS = ("symbolic link", "not a regular file", "hard link")


class Shell(Environment):
    """Filesystem and text puzzles solved with shell commands, checked on the final answer or file state."""

    name = "shell"
    version = "1"
    verifier_version = "1"
    max_difficulty = 5
    exploit_kind = "shell"

    def puzzle(self, seed: int, difficulty: int) -> Puzzle:
        """The whole truth of a task (its tree, goal and expected result); public data only."""
        self.check_difficulty(difficulty)
        return build_puzzle(self.name, self.version, seed, difficulty)

    def generate(self, seed: int, difficulty: int) -> Task:
        puzzle = self.puzzle(seed, difficulty)
        # Single output files are named; where whole directories are checked, the directories are.
        outputs = sorted(puzzle.expected) if puzzle.finish == "files" and not puzzle.scope else []
        return Task(
            env=self.name, env_version=self.version, seed=seed, difficulty=difficulty,
            prompt=f"{puzzle.goal}\n\n{COMMON}", answer_format=puzzle.answer_format, kind="actions",
            metadata={"family": puzzle.family, "finish": puzzle.finish, "outputs": outputs,
                      "checked_dirs": list(puzzle.scope), "max_steps": MAX_STEPS, "files": len(puzzle.files)},
        )

    def reference(self, task: Task) -> Attempt:
        puzzle = self.puzzle(task.seed, task.difficulty)
        return Attempt(final=puzzle.answer, actions=list(puzzle.actions))

    async def episode(self, task: Task, ctx: VerifyContext) -> ShellEpisode:
        puzzle = self.puzzle(task.seed, task.difficulty)
        return await ShellEpisode.start(ctx.sandbox, puzzle.files, ctx.scratch_dir)

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        """Replay the actions in a fresh episode, then check the final answer or the final tree.

        Everything is computed from the task's public identity: the agent saw the whole tree, so there is
        nothing to hide, and ``ctx.key`` is not used; guessing is defeated by exact, complete checks instead.
        """
        v = self.verifier_version
        try:
            puzzle = self.puzzle(task.seed, task.difficulty)
        except (TaskError, GeneratorBug) as exc:
            return errored(v, f"cannot rebuild the task: {exc}")
        actions = list(attempt.actions)
        if not actions and not attempt.final.strip():
            return failed(v, "no actions and no answer", flags=(NO_ANSWER,))
        if len(actions) > MAX_STEPS:
            return failed(v, f"{len(actions)} actions: at most {MAX_STEPS} are allowed")
        # Replayed as valid text (verify_safely repairs and flags it; this is for callers that come here
        # directly): a command holding a lone surrogate could not even be written into the box.
        repaired = [valid_text(str(action))[0] for action in actions]
        try:
            episode = await ShellEpisode.start(ctx.sandbox, puzzle.files, ctx.scratch_dir)
        except (FarmError, OSError) as exc:
            return errored(v, f"cannot start an episode: {exc}")
        try:
            for action in repaired:
                await episode.act(action)
            return await self.judge_episode(task, episode, attempt.final, ctx)
        except (FarmError, OSError) as exc:
            return errored(v, f"the replay failed: {type(exc).__name__}: {exc}")
        finally:
            await episode.close()

    async def judge_episode(self, task: Task, episode: Episode, final: str, ctx: VerifyContext) -> Verdict:
        """The verdict on an episode the agent has just played (a rollout's, not a replay)."""
        v = self.verifier_version
        if not isinstance(episode, ShellEpisode):
            return errored(v, "not a shell episode")
        final = valid_text(final)[0]
        try:
            puzzle = self.puzzle(task.seed, task.difficulty)
            problems = (_check_answer(puzzle, final) if puzzle.finish == "answer"
                        else await asyncio.to_thread(check_tree, puzzle, episode.tree))
            planted = await asyncio.to_thread(_planted, puzzle, episode)
        except (TaskError, GeneratorBug, OSError) as exc:
            return errored(v, f"cannot check the episode: {type(exc).__name__}: {exc}")
        return _verdict(v, puzzle, episode, problems, planted)


def _check_answer(puzzle: Puzzle, final: str) -> list[str]:
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


def _planted(puzzle: Puzzle, episode: ShellEpisode) -> dict[str, str]:
    """Expected files that are absent because a step left a link or a special file there instead."""
    return {p: why for p in puzzle.expected if (why := episode.dropped.get(p, "")) in _LINK_REASONS
            and _read_regular(episode.tree, p) is None}


def _verdict(version: str, puzzle: Puzzle, episode: ShellEpisode, problems: list[str],
             planted: dict[str, str]) -> Verdict:
    verdict = failed(version)
    verdict.details = {"family": puzzle.family, "steps": episode.steps}
    if episode.violations:
        verdict.flag(SANDBOX_VIOLATION)
        verdict.details["violations"] = episode.violations[:10]
    if episode.timed_out:
        verdict.flag(TIMEOUT)
    # A link or special file left where the check expects a regular file is an attempt at the checker.
    if planted:
        verdict.flag(SUSPECTED_HACK)
        path, why = next(iter(planted.items()))
        problems = [f"{path} was left as a {why}: only regular files count", *problems]
    if problems:
        verdict.reasons = problems[:5]
        return verdict
    verdict.passed = True
    verdict.reward = 1.0
    verdict.reasons = ["the final answer is right" if puzzle.finish == "answer" else "the final files are right"]
    return verdict
