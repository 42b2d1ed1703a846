"""Leftovers of boxes whose farmd died: names that carry their owner's pid."""

from __future__ import annotations

import os


def box_name_owner(name: str) -> int | None:
    """The farmd pid in a box name (``<pid>-<n>`` or ``box-<pid>-<n>``), or None."""
    parts = name.removeprefix("box-").split("-")
    return int(parts[0]) if parts and parts[0].isdigit() else None


def owner_alive(name: str) -> bool:
    """True if the farmd that made ``name`` still runs (or the name is not a box's)."""
    pid = box_name_owner(name)
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
