"""Text an attacker would like an operator's terminal to show raw, and how farm must show it instead.

``[/farm]`` is a rich closing tag with no opening one (raises if read as markup); ``\\x1b[2J``
clears the screen; ``\\x1b]0;...\\x07`` retitles the window; ``\\x9b`` is the one-byte CSI;
U+202E reverses what follows (Trojan Source); U+200B hides; ``:smile:`` would become an emoji.
"""

from __future__ import annotations

HOSTILE = "[/farm]\x1b[2J\x1b]0;pwned\x07\x9b31m\u202e\u200b:smile:"
SHOWN = "[/farm]\\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\u202e\\u200b:smile:"
"""``HOSTILE`` as an operator sees it: every unsafe character a visible escape, the rest as it was."""

UNSAFE = ("\x1b", "\x07", "\x9b", "\u202e", "\u200b")


def assert_shown_safely(output: str | bytes) -> None:
    """``output`` holds no unsafe character and shows the hostile text escaped, verbatim."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    for char in UNSAFE:
        assert char not in text, f"{char!r} reached the terminal: {text[-2000:]!r}"
    assert SHOWN in text, f"the hostile text is not shown escaped: {text[-3000:]!r}"
