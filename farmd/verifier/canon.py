"""Comparing a submission's claimed values with expected ones, on the host, strictly.

Values arrive as canonical JSON (see ``judge.canon``): exact builtin types, floats
and tuples tagged. Equality is structural and type-exact (``True`` is not ``1``,
a tuple is not a list); the submission's own ``__eq__`` never runs anywhere.
"""

from __future__ import annotations

import json
import math
from typing import Any

from farmd.errors import BadClaim, NotCanonical
from farmd.verifier import judge

__all__ = ["canon", "parse_claim", "strict_equal"]


def canon(value: Any) -> Any:
    """The canonical form of a value computed on the host (the same function the judge uses in the box).
    ``NotCanonical`` when it has none: the box's own kind of it (the judge imports nothing of farmd) made
    farm's."""
    try:
        return judge.canon(value)
    except judge.NotCanonical as exc:
        raise NotCanonical(str(exc)) from None


def parse_claim(text: str) -> Any:
    """Parse a runner's claimed value; anything malformed (or abusive) is BadClaim."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadClaim(f"unparseable value ({type(exc).__name__})") from None


def strict_equal(got: Any, want: Any, *, rel_tol: float = 0.0, abs_tol: float = 0.0) -> bool:
    """Type-exact structural equality of canonical values; floats within the given tolerance.

    NaN never equals anything; ``not err <= tol`` style, so a NaN error fails.
    """
    if type(got) is not type(want):
        return False
    if isinstance(want, list):
        return len(got) == len(want) and all(
            strict_equal(g, w, rel_tol=rel_tol, abs_tol=abs_tol) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict):
        if got.keys() != want.keys():
            return False
        if set(want) == {"f"}:
            return _float_equal(got["f"], want["f"], rel_tol, abs_tol)
        return all(strict_equal(got[k], want[k], rel_tol=rel_tol, abs_tol=abs_tol) for k in want)
    return bool(got == want)


def _float_equal(got: object, want: object, rel_tol: float, abs_tol: float) -> bool:
    if not isinstance(got, str) or not isinstance(want, str):
        return False
    try:
        g, w = float(got), float(want)
    except ValueError:
        return False
    if math.isnan(g) or math.isnan(w):
        return False
    if math.isinf(w) or math.isinf(g):
        return g == w
    err = abs(g - w)
    return err <= max(abs_tol, rel_tol * abs(w))
