"""The shape of a contributed environment's answers, as intake's attacks and canaries write wrong ones.

A reference's final text is a frame around an answer: ``<answer>42</answer>``, ``42``, ``RESULT: 42``. The
attacks that submit some other answer (a constant, another task's, a leak found in the prompt, a near miss)
keep the frame and change what is inside it, so that a verifier which reads the frame is judged on the
answer, not on a format it would refuse anyway. Pure text work, no boxes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from farmd.verifier.answer import extract_single_answer

_INTEGER = re.compile(r"[+-]?\d+")
_DIGITS = re.compile(r"\d+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_BLOCK = re.compile(r"<answer\b[^<>]*>(.*?)</answer\s*>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Frame:
    """A final text as ``before + core + after``."""

    before: str
    core: str
    after: str

    def holding(self, core: str) -> str:
        """The same frame around another answer."""
        return self.before + core + self.after


def frame(final: str) -> Frame:
    """``final`` split around its answer: the content of its one ``<answer>`` block, else the stripped text."""
    inside, _ = extract_single_answer(final)
    block = _BLOCK.search(final) if inside else None
    if block is not None:
        content = block.group(1)
        start = block.start(1) + (len(content) - len(content.lstrip()))
        end = start + len(content.strip())
        return Frame(final[:start], final[start:end], final[end:])
    stripped = final.strip()
    if not stripped:
        return Frame(final, "", "")
    start = final.find(stripped)
    return Frame(final[:start], stripped, final[start + len(stripped):])


def same(a: str, b: str) -> bool:
    """Whether two finals are the same attempt (intake's one rule: equal after trimming)."""
    return a.strip() == b.strip()


def near_miss(final: str, entry_point: str | None = None) -> str:
    """A wrong answer made from the right one, in its frame: an integer moved by one, else the last number in
    it moved by one, else its last word reversed, else a character added. For code (``entry_point``), the
    reference with the function redefined to return None: code that looks right and answers nothing."""
    if entry_point:
        return f"{final.rstrip()}\n\n\ndef {entry_point}(*args, **kwargs):\n    return None\n"
    f = frame(final)
    core = f.core
    if _INTEGER.fullmatch(core):
        wrong = str(int(core) + 1)
    elif (digits := list(_DIGITS.finditer(core))):
        last = digits[-1]
        wrong = core[:last.start()] + str(int(last.group()) + 1) + core[last.end():]
    elif (words := [w for w in _WORD.finditer(core) if len(set(w.group().lower())) > 1]):
        last = words[-1]
        wrong = core[:last.start()] + last.group()[::-1] + core[last.end():]
    else:
        wrong = core + "x"
    if wrong.strip() == core.strip():  # a reversed word that reads the same either way
        wrong = core + "x"
    return f.holding(wrong)
