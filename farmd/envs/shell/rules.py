"""What an episode may do: the bounds of a step, of the carried tree and of an attempt, and the prompt's
words for them (one place, so that the prompt cannot drift from what is enforced)."""

from __future__ import annotations

from farmd.envs.base import budget_words, time_words
from farmd.sandbox import SandboxPolicy

ACTION_NOUN = "command"
MAX_STEPS = 30
"""Commands an attempt may ask for; one that asks for more gets 0 (``rule_broken``), even if the extra ones were
refused unrun."""
MAX_COMMAND_BYTES = 16 * 1024
MAX_FINAL_CHARS = 4096
"""Longer final answers (of answer tasks) fail without a look."""
OUTPUT_CHARS = 4096
"""What an observation shows of a command's output: the head and the tail, with a marker between."""
TAIL_CHARS = 1024
NOTES_SHOWN = 8

STEP_POLICY = SandboxPolicy(wall_time_s=10, cpu_time_s=10, memory_mb=256, pids=64, disk_mb=32, disk_inodes=2048,
                            tmp_mb=16, shm_mb=4, output_kb=256)
"""One command's box. The tree carried between steps is bounded well below its disk (see TREE_*)."""
TREE_BYTES = 8 * 1024 * 1024
TREE_ENTRIES = 1000
TREE_DEPTH = 16
TREE_PATH_BYTES = 1024
"""Bounds of the tree carried between steps: what exceeds them is dropped, so that copying it into the
next box can never fail (the scratch disk is 32 MiB, and a host path has at most 4096 bytes)."""


COMMON = (
    "You work in a shell. Each action is one command line, run with `sh -c` in a fresh sandbox whose working "
    "directory holds your files (`find . | sort` lists them). Only regular files and directories carry over "
    "from one command to the next: shell variables, the current directory, background processes, /tmp, "
    "symbolic links, FIFOs and set-id bits do not (a hard link becomes a second copy; execute bits stay). "
    "Tools: POSIX sh, coreutils, grep, sed, awk, find, sort, python3; no network. "
    f"{time_words(STEP_POLICY.wall_time_s, ACTION_NOUN)}; {budget_words(MAX_STEPS, ACTION_NOUN)}."
)
"""What every task says of its episode; its last sentence states the rules ``Shell.rules`` holds (the episode
environment's own: in the words it checks for)."""
