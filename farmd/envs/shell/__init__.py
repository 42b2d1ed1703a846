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

from farmd.envs.shell.checks import check_tree, matches, normalize_answer
from farmd.envs.shell.env import Shell
from farmd.envs.shell.episode import ShellEpisode
from farmd.envs.shell.puzzle import Expect, Puzzle
from farmd.envs.shell.puzzles import FAMILIES, build_puzzle, family_of
from farmd.envs.shell.rules import COMMON, MAX_STEPS, OUTPUT_CHARS, STEP_POLICY, TREE_BYTES, TREE_ENTRIES

__all__ = ["COMMON", "FAMILIES", "MAX_STEPS", "OUTPUT_CHARS", "STEP_POLICY", "TREE_BYTES", "TREE_ENTRIES", "Expect",
           "Puzzle", "Shell", "ShellEpisode", "build_puzzle", "check_tree", "family_of", "matches",
           "normalize_answer"]
