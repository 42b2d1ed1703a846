"""count-lines: count the log lines with a word (and a service tag); answer the number."""

from __future__ import annotations

import random
from types import MappingProxyType

from farmd.envs.shell.puzzle import Puzzle
from farmd.envs.shell.words import (
    DIRS,
    SERVICES,
    WHOLE_WORD,
    insert_word,
    layout,
    quoted,
    sentence,
    text_lines,
    whole_word,
)


def _log_line(rng: random.Random, level: str, svc: str, message: str) -> str:
    return (f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:"
            f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} {level} [{svc}] {message}")


def make(rng: random.Random, d: int) -> Puzzle:
    word = rng.choice(("ERROR", "WARN"))
    svc = rng.choice(SERVICES) if d >= 4 else ""
    n_files, n_lines = [(2, 15), (3, 20), (5, 25), (7, 30), (10, 40)][d - 1]
    near = [word + "S", word + "_COUNT", word.lower(), "NO" + word, word + "2"]
    while True:  # redraw until the count is not a small constant a guess could hit
        files: dict[str, bytes] = {}
        logs = layout(rng, "logs", n_files, 1 if d <= 2 else 2, (".log",), names=SERVICES + DIRS)
        extra: list[str] = []
        if d >= 2:
            extra += [f"logs/{rng.choice(('notes', 'todo', 'readme'))}.txt"]
        if d >= 3:
            extra += [f"{p}.1" for p in rng.sample(logs, 2)]
        for p in logs + extra:
            lines = []
            for _ in range(rng.randint(n_lines // 2, n_lines)):
                message = sentence(rng, 3, 7)
                if d >= 3 and rng.random() < 0.25:
                    message = insert_word(rng, message, rng.choice(near))
                if d >= 3 and rng.random() < 0.08:
                    message = insert_word(rng, message, word)  # the word, at another level: it counts
                if d >= 4 and rng.random() < 0.2:
                    message = insert_word(rng, message, svc)  # the service's name, not its tag
                level = rng.choice(("INFO", "DEBUG", "WARN", "ERROR", "INFO"))
                lines.append(_log_line(rng, level, rng.choice(SERVICES), message))
            files[p] = text_lines(lines)
        pattern = whole_word(word)
        count = sum(1 for p in logs for line in files[p].decode().splitlines()
                    if pattern.search(line) and (not svc or f"[{svc}]" in line))
        if count >= 3:
            break
    tag = f" and the service tag `[{svc}]`" if svc else ""
    logs_text = "find logs -type f -name '*.log' -exec cat {} +"
    pipeline = (f"{logs_text} | grep -w {word} | grep -cF {quoted(f'[{svc}]')}" if svc
                else f"{logs_text} | grep -cw {word}")
    goal = (f"Count the lines, over every file under `logs/` (subdirectories included) whose name ends in "
            f"`.log`, that contain the word `{word}` (case-sensitive, {WHOLE_WORD}){tag}.")
    return Puzzle(
        family="count-lines", goal=goal, finish="answer", files=MappingProxyType(files), actions=(pipeline,),
        answer=str(count),
        answer_format="Finish with a final answer: the number alone, in decimal digits. The files you leave "
                      "are not checked.",
        answer_form="[0-9]+",
    )
