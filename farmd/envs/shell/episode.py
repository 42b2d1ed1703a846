"""An episode: commands run one fresh box each over a rollout's tree."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from pathlib import Path

from farmd.envs.base import Episode, Observation
from farmd.envs.shell.rules import (
    MAX_COMMAND_BYTES,
    MAX_STEPS,
    NOTES_SHOWN,
    OUTPUT_CHARS,
    STEP_POLICY,
    TAIL_CHARS,
)
from farmd.envs.shell.tree import bound_tree, new_root
from farmd.errors import TaskError
from farmd.sandbox import Sandbox, SandboxPolicy
from farmd.sandbox.result import WALL_TIME


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
    head = text[:limit - TAIL_CHARS]
    tail = text[-TAIL_CHARS:]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"


class ShellEpisode(Episode):
    """A rollout's working tree and the commands run over it, one fresh box each.

    Create it with ``await ShellEpisode.start(...)``; ``close()`` removes the tree.
    """

    action_noun = "command"
    max_steps: int

    def __init__(self, sandbox: Sandbox, root: Path, max_steps: int = MAX_STEPS,
                 policy: SandboxPolicy = STEP_POLICY) -> None:
        self._sandbox = sandbox
        self._root = root
        self.tree = root / "tree"
        self.max_steps = max_steps
        self.policy = policy
        """Each command's box (the task's prompt states its time: tests alone pass another)."""
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
                    max_steps: int = MAX_STEPS, policy: SandboxPolicy = STEP_POLICY) -> ShellEpisode:
        root = await asyncio.to_thread(new_root, files, scratch_dir)
        return cls(sandbox, root, max_steps, policy)

    async def step(self, action: str) -> Observation:
        """Run one command; what it printed (shortened) and its exit status come back, plus notes on bounds
        it hit and on files that do not carry over. Raises SandboxError only when the sandbox fails. (A
        command past the budget never comes here: ``Episode.act`` refuses it and counts the ask.)"""
        async with self._lock:
            return await self._step(action)

    async def _step(self, action: str) -> Observation:
        if self._closed:
            raise TaskError("this episode is closed")
        self.steps += 1
        done = self.steps >= self.max_steps
        problem = _command_problem(action)
        if problem is not None:
            return Observation(f"[not run: {problem}]", None, done=done)
        keep = self._root / f"step-{self.steps}"
        result = await self._sandbox.run(["sh", "-c", action], self.policy, files=self.tree, keep=keep)
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
        dropped = bound_tree(keep)
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
            shown = ", ".join(f"{p} ({why})" for p, why in skipped[:NOTES_SHOWN])
            more = f" and {len(skipped) - NOTES_SHOWN} more" if len(skipped) > NOTES_SHOWN else ""
            notes.append(f"[not carried to the next command: {shown}{more}]")
        body = _shorten(out + err)
        return "\n".join([body.rstrip("\n"), *notes]) if notes else body

    async def close(self) -> None:
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await asyncio.to_thread(shutil.rmtree, self._root, True)
