"""distinct-words: list the distinct words of some texts into ``words.txt``."""

from __future__ import annotations

import random
import re
from collections import Counter
from types import MappingProxyType

from farmd.envs.shell.puzzle import Expect, Puzzle, ensure
from farmd.envs.shell.words import (
    WORDS,
    layout,
    text_lines,
)


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


def make(rng: random.Random, d: int) -> Puzzle:
    n_files, n_words = [(1, 40), (3, 40), (4, 50), (5, 50), (6, 40)][d - 1]
    vocabulary = rng.sample(WORDS, [60, 80, 100, 120, 50][d - 1])
    names = tuple(rng.sample(WORDS, 12))
    paths = ([f"texts/{n}.txt" for n in names[:n_files]] if d <= 3
             else layout(rng, "texts", n_files, 2, (".txt",), names=names))
    files = {p: _prose(rng, vocabulary, n_words, d).encode() for p in paths}
    if d >= 4:
        for p in layout(rng, "texts", 2, 2, (".md",), names=names):
            files[p] = _prose(rng, rng.sample(WORDS, 30), n_words, d).encode()
    per_file = [set(re.findall(r"[a-z]+", files[p].decode().lower())) for p in paths]
    if d >= 5:
        seen = Counter(w for words in per_file for w in words)
        wanted = sorted(w for w, n in seen.items() if n >= 2)
    else:
        wanted = sorted(set().union(*per_file))
        if d >= 4:
            wanted = [w for w in wanted if len(w) >= 5]
    ensure(len(wanted) >= 3, "distinct-words: the list must not be trivial")
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
        expected=MappingProxyType({"words.txt": Expect("lines", text_lines(wanted))}),
        answer_format="Finish by leaving `words.txt` as described. The final file state is checked; the final "
                      "answer text is ignored.",
    )
