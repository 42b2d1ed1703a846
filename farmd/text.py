"""Text that came from outside farm, made safe once at the boundary where it enters.

Untrusted text arrives from boxes (bytes), model endpoints (JSON, which may hold lone
surrogates such as ``"\\ud800"``), API clients and contributed environments. A lone
surrogate is a valid Python ``str`` and valid JSON, but protobuf, SQLite's UTF-8 and
every encoder refuse it, so one such string stored would break every later read of
the record. ``valid_text`` repairs it (U+FFFD) and says how many characters it
replaced, so the repair can be recorded; ``clip`` bounds a string with a visible
marker. ``for_terminal`` is for the other end: text shown to an operator, with
control characters and invisible reordering characters made visible, so a name
or an attempt's output can never move the cursor, retitle a window or hide text.

Standard library only: every layer of farm may import this.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"

# Lone (or mis-paired) surrogates: the only str contents that cannot be encoded as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")

# Every control (C0 but tab and newline, DEL, C1), format character and line or paragraph separator
# of Unicode (categories Cc, Cf, Zl, Zp): bidirectional marks, overrides and isolates, which reorder
# what a terminal shows ("Trojan Source"); zero-width characters, the BOM, the soft hyphen and the
# tag characters, which hide text; U+2028/U+2029, which some terminals and editors break lines at.
_FORMAT = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e"
           "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
           "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f")
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_FORMAT}]")
_UNSAFE_INLINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_FORMAT}]")
_HEX = frozenset("0123456789abcdef")


def valid_text(text: str) -> tuple[str, int]:
    """``text`` with every character UTF-8 cannot encode replaced by U+FFFD, and how many were."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.subn(REPLACEMENT, text)
    return text, 0


def valid_tree(value: Any) -> tuple[Any, int]:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string and key made valid text.

    Returns the value itself when nothing needed repair, so the common case allocates nothing.
    """
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, list | tuple):
        items = [valid_tree(v) for v in value]
        replaced = sum(n for _, n in items)
        return ([v for v, _ in items] if replaced else value), replaced
    if isinstance(value, dict):
        pairs = [(valid_text(k) if isinstance(k, str) else (k, 0), valid_tree(v)) for k, v in value.items()]
        replaced = sum(kn + vn for (_, kn), (_, vn) in pairs)
        return ({k: v for (k, _), (v, _) in pairs} if replaced else value), replaced
    return value, 0


def is_sha256(text: str) -> bool:
    """Whether ``text`` is a sha256 as farm writes one: 64 lowercase hex digits."""
    return len(text) == 64 and set(text) <= _HEX


def decode(data: bytes) -> tuple[str, int]:
    """``data`` as text (invalid UTF-8 sequences become U+FFFD), and how many characters were replaced."""
    text = data.decode("utf-8", "replace")
    return text, (text.count(REPLACEMENT) - data.count(REPLACEMENT.encode())) if REPLACEMENT in text else 0


def clip(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to at most ``max_chars`` characters (a marker says how much went), and whether it was."""
    if len(text) <= max_chars:
        return text, False
    marker = f"\n[... {len(text) - max_chars} more characters not kept]"
    keep = max(0, max_chars - len(marker))
    return text[:keep] + marker[: max_chars - keep], True



def bounded(text: str, max_chars: int) -> str:
    """``text`` as farm keeps what it did not write: valid UTF-8, and at most ``max_chars`` characters."""
    return clip(valid_text(text)[0], max_chars)[0]

def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def for_terminal(text: str, *, inline: bool = True) -> str:
    """``text`` safe to print: control and invisible reordering characters shown as escapes.

    ``inline`` (for table cells and names) escapes newlines and tabs too. The result is
    plain text: callers that print through rich must still not let it be read as markup
    (``rich.text.Text(...)`` or ``rich.markup.escape``).
    """
    pattern = _UNSAFE_INLINE if inline else _UNSAFE
    return pattern.sub(_visible, valid_text(text)[0])
