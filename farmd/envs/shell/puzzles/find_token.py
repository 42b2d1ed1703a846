"""find-token: one line of one file holds a word; answer its path and line number."""

from __future__ import annotations

import random
from types import MappingProxyType

from farmd.envs.shell.puzzle import Puzzle, ensure
from farmd.envs.shell.words import (
    USERS,
    WHOLE_WORD,
    insert_word,
    layout,
    new_token,
    one_off,
    quoted,
    sentence,
    text_lines,
    whole_word,
)


def make(rng: random.Random, d: int) -> Puzzle:
    n_files, depth, n_lines = [(4, 1, 8), (8, 2, 12), (14, 3, 16), (24, 4, 20), (36, 4, 24)][d - 1]
    paths = layout(rng, "data", n_files, depth, (".txt", ".md", ".log", ""), hidden=d >= 4)
    texts = {p: [sentence(rng) for _ in range(rng.randint(n_lines // 2, n_lines))] for p in paths}
    token = new_token(rng)
    target = rng.choice(sorted(paths)[1:])  # never the first file: a guess at it must fail
    lineno = rng.randint(2, len(texts[target]))
    texts[target][lineno - 1] = insert_word(rng, texts[target][lineno - 1], token)
    decoys: list[str] = []
    if d >= 2:
        decoys += [one_off(rng, token) for _ in range(d)]
    if d >= 3:
        decoys += [token + rng.choice("abxyz019_"), rng.choice("abqz7_") + token, token.upper()]
    files: dict[str, bytes] = {}
    prompt_word = f"the word `{token}`"
    section = ""
    if d >= 4:
        sections = rng.sample(("current", "archive", "legacy", "staging", "backup", "mirror"), 3)
        section = sections[0]
        needles = {s: token if s == section else new_token(rng) for s in sections}
        decoys += [needles[s] for s in sections[1:]]  # a wrong section's word is found too, elsewhere
        rng.shuffle(sections)
        lines = ["# what to search for"]
        for s in sections:
            lines += [f"[{s}]", f"owner = {rng.choice(USERS)}", f"needle = {needles[s]}", ""]
        files["config/search.ini"] = text_lines(lines)
        prompt_word = f"the value of `needle` in the `[{section}]` section of `config/search.ini`"
    for decoy in decoys:
        p = rng.choice(paths)
        i = rng.randrange(len(texts[p]))
        if (p, i + 1) != (target, lineno):
            texts[p][i] = insert_word(rng, texts[p][i], decoy)
    if d >= 5:  # a copy of the right file outside data/, which does not count
        files[f"backup/{target.split('/')[-1]}.bak"] = text_lines(texts[target])
    for p in paths:
        files[p] = text_lines(texts[p])
    found = [(p, i) for p in paths for i, line in enumerate(texts[p], 1) if whole_word(token).search(line)]
    ensure(found == [(target, lineno)], "find-token: the word must be on exactly one line")
    where = "Only files under `data/` count. " if d >= 4 else ""
    goal = (f"Exactly one line of one file under `data/` contains {prompt_word} ({WHOLE_WORD}). {where}"
            "Find that file and that line.")
    actions = [f"grep -rnwF -- {quoted(token)} data | cut -d: -f1,2"]
    if d >= 4:
        actions.insert(0, f"sed -n '/^\\[{section}\\]/,/^\\[/p' config/search.ini")
    return Puzzle(
        family="find-token", goal=goal, finish="answer", files=MappingProxyType(files), actions=tuple(actions),
        answer=f"{target}:{lineno}",
        answer_format=("Finish with a final answer: the file's path relative to the working directory and the "
                       "line's number (counting from 1), joined by a colon, e.g. `data/notes/todo.txt:7`, and "
                       "nothing else. The files you leave are not checked."),
        answer_form=r"[^\s:]+:[0-9]+",
    )
