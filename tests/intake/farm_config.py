"""The farm.toml intake's end-to-end tests run on: the same checks a farm gives a new contributor, at fewer seeds
and attacker proposals (a cheaper test), and a credential per role when the test names some."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHEAP_INTAKE = "[intake]\nseeds = [2, 2, 2]\nattack_budget = [2, 2, 2]\ntier2_tasks = 1\ntier2_sample = 8\n"


def intake_farm_toml(path: Path, tokens: dict[str, str] | None = None, roles: dict[str, str] | None = None) -> Path:
    """Write ``path``: ``CHEAP_INTAKE``, and a ``[[credentials]]`` entry for each name of ``tokens`` (its token),
    holding its role in ``roles``. No tokens: a farm without credentials."""
    tokens, roles = tokens or {}, roles or {}
    path.write_text(CHEAP_INTAKE + "".join(
        f'\n[[credentials]]\nname = "{who}"\nroles = ["{roles[who]}"]\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n' for who, token in tokens.items()))
    return path
