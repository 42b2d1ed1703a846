"""The seven puzzle families, and the rotation that picks a task's family from its identity."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from farmd.envs.shell.puzzle import Puzzle
from farmd.envs.shell.puzzles import (
    count_lines,
    csv_sum,
    distinct_words,
    edit_config,
    find_token,
    log_fields,
    move_files,
)
from farmd.verifier.secret import public_rng

FAMILIES: tuple[tuple[str, Callable[[random.Random, int], Puzzle]], ...] = (
    ("find-token", find_token.make),
    ("count-lines", count_lines.make),
    ("csv-sum", csv_sum.make),
    ("move-files", move_files.make),
    ("distinct-words", distinct_words.make),
    ("edit-config", edit_config.make),
    ("log-fields", log_fields.make),
)


def family_of(seed: int, difficulty: int) -> str:
    """Which family a task belongs to: a rotation, so that a few seeds of each level cover every family."""
    return FAMILIES[(seed + 3 * (difficulty - 1)) % len(FAMILIES)][0]


@functools.lru_cache(maxsize=512)
def build_puzzle(env: str, version: str, seed: int, difficulty: int) -> Puzzle:
    """The puzzle of a task, from its public identity only (deterministic)."""
    family = family_of(seed, difficulty)
    make = dict(FAMILIES)[family]
    return make(public_rng(env, version, seed, difficulty, family), difficulty)
