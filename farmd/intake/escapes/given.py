"""What a payload is given: the names the lines before it define, declared here for lint only.

A payload's program starts with these as Python literals (``_constants`` writes each with ``repr``),
then its prelude, then its body; the modules in ``python/`` and ``kernel/`` import them from here above
their payload line, so ruff and mypy know their types, and the box never sees that import. The values
here are placeholders, never used: ``tests/intake/test_escapes_library.py`` checks that this module
declares exactly the names a program is given.
"""

from __future__ import annotations

NAME: str = ""
"""The escape's name."""
NONCE: str = ""
"""The red-team run's nonce (``Marker.nonce``)."""
DATA_DIR: str = ""
"""The coordinator's data directory, when known ("" otherwise)."""
PORTS: list[int] = []
"""The ports to knock on (``Marker.ports``)."""
KEY_FILE: str = ""
"""The verifier key's file name in a data directory."""
BUDGET_S: float = 0.0
"""How long the payload keeps trying, by its own clock."""
CLAIM: str = ""
"""The verdict a forger claims, as JSON text."""
LEFT_FILE: str = ""
LEFT_PROC: str = ""
LEFT_MOUNT: str = ""
LEFT_CGROUP: str = ""
LEFT_VERDICT: str = ""
"""The names of what it tries to leave behind (``leftover_name``)."""
COMMANDS: list[str] = []
"""A kernel payload's shell commands, run through libc's ``system()`` (kernel payloads only)."""
