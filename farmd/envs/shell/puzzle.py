"""What a generated task is: the public tree and goal, and what the hidden check expects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from farmd.errors import GeneratorBug

Finish = Literal["answer", "files"]
CheckKind = Literal["bytes", "lines", "number", "ini"]


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
    left_alone: str = ""
    """The words (in ``goal`` or ``answer_format``) that tell the agent to leave alone what the task does not
    ask it to change: required where ``scope`` is checked, and held as a rule of the task (``disturbed``)."""
    answer_form: str = ""
    """The form ``answer_format`` asks the final answer to take, as a regular expression its compared text
    (``normalize_answer``) must match in full (answer tasks; one without is a generator bug): a rule of the
    task, held apart from whether the answer is right (``Shell.rules``)."""

    def __post_init__(self) -> None:
        if self.scope:
            ensure(bool(self.left_alone) and self.left_alone in f"{self.goal}\n{self.answer_format}",
                   f"{self.family}: a task whose directories are checked whole must say, in words it holds, that "
                   "nothing else may change")
        if self.finish == "answer":
            ensure(bool(self.answer_form) and re.fullmatch(self.answer_form, self.answer) is not None,
                   f"{self.family}: an answer task's answer must have the form its answer_format states")


def ensure(ok: bool, message: str) -> None:
    if not ok:
        raise GeneratorBug(message)
