"""Text from outside farm, as an operator's terminal shows it.

Anything a command prints that a client, a node, an attempt, a model or a contributed
environment could have chosen (consumer names, agent specs, env names, flags, reasons,
box output, server error details) goes through here: control characters, bidi overrides
and zero-width characters become visible escapes (``farmd.text.for_terminal``), and the
result is a ``rich.text.Text``, which rich never reads as markup, so a name like
``[/farm]`` is a name, not a closing tag that makes the command crash.

The rule for ``farmd/cli/``: markup strings hold only farm's own words; an untrusted value
goes in as ``text(value)`` (joined with ``Text.assemble``) or, outside rich, ``plain(value)``.
``--json`` output is exact and needs neither (JSON escapes every control character).
"""

from __future__ import annotations

from rich.text import Text

from farmd.text import for_terminal


def plain(value: object, *, inline: bool = True) -> str:
    """``value`` as safe terminal text; ``inline`` (names, cells) shows newlines and tabs as escapes too."""
    return for_terminal(str(value), inline=inline)


def text(value: object, style: str = "", *, inline: bool = True) -> Text:
    """``value`` as a rich ``Text``: safe to print, never parsed as markup, never turned into emoji."""
    return Text(plain(value, inline=inline), style=style)


def joined(values: object, sep: str = ",") -> Text:
    """A list of untrusted values (flags, reasons) as one cell."""
    items = values if isinstance(values, list | tuple) else [values]
    return text(sep.join(str(v) for v in items))
