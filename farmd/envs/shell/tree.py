"""The working tree carried from one step to the next, held to its bounds."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from farmd.envs.shell.rules import TREE_BYTES, TREE_DEPTH, TREE_ENTRIES, TREE_PATH_BYTES


@dataclass
class TreeBudget:
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


def bound_tree(root: Path) -> list[tuple[str, str]]:
    """Drop whatever takes the tree past its bounds, in name order; returns (path, why) of each drop.

    Walks by descriptor, so neither depth nor path length can make it fail.
    """
    dropped: list[tuple[str, str]] = []
    budget = TreeBudget()
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


def new_root(files: Mapping[str, bytes], scratch_dir: Path | None) -> Path:
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
