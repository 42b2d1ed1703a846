"""JSON for bodies of megabytes: orjson where it is exact, the standard library elsewhere.

orjson reads and writes the Atropos API's groups several times faster than ``json`` (float reprs and
integer lists are most of their bytes). It is stricter in reading (no ``NaN``/``Infinity`` literals, no lone
surrogates, no integers past 64 bits) and lossy in writing (a NaN becomes ``null``). So a body orjson will
not read is read by ``json`` (its refusal then names the field and why, not "not JSON"), and what was read
that way is written back by ``json`` too: only values orjson read are written by it. One difference is
kept: orjson reads an integer past 64 bits as a float (``json`` as an int); every integer farm checks is
refused past 64 bits either way.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def parse(data: bytes) -> tuple[Any, bool]:
    """The value, and whether orjson read it (so ``dump(value, exact=True)`` gives it back unchanged)."""
    try:
        return orjson.loads(data), True
    except orjson.JSONDecodeError:
        return json.loads(data), False


def dump(value: Any, *, exact: bool) -> bytes:
    """Compact UTF-8 JSON; by orjson only when ``exact`` (the value came from ``parse`` by orjson, or holds
    nothing but finite numbers, valid text and 64-bit integers)."""
    if exact:
        try:
            return orjson.dumps(value)
        except (orjson.JSONEncodeError, TypeError):
            pass
    return json.dumps(value, separators=(",", ":")).encode()
