"""``for_terminal``: every character that can move a cursor, reorder or hide text is shown as an escape."""

from __future__ import annotations

import sys
import unicodedata

from farmd.text import for_terminal

# Controls, format characters (bidi marks and overrides, zero-width, soft hyphen, tag characters) and
# the line and paragraph separators: none is ever shown as itself.
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp")


def test_every_control_format_and_separator_character_is_escaped() -> None:
    leaked = [hex(cp) for cp in range(sys.maxunicode + 1)
              if unicodedata.category(chr(cp)) in _INVISIBLE and for_terminal(chr(cp)) == chr(cp)]
    assert leaked == []


def test_escapes_are_unambiguous_and_the_rest_is_kept() -> None:
    assert for_terminal("a\x1b[2J\u061c\u2028\U000e0041b") == "a\\x1b[2J\\u061c\\u2028\\U000e0041b"
    assert for_terminal("line\nnext\ttab", inline=False) == "line\nnext\ttab"
    assert for_terminal("line\nnext\ttab") == "line\\x0anext\\x09tab"
    assert for_terminal("naïve, 中文 ❤️ \\x1b") == "naïve, 中文 ❤️ \\x1b"
    assert for_terminal("\ud800") == "\ufffd"
