"""Boxes for untrusted code: bubblewrap + seccomp + cgroups, one entry point.

    async with Sandbox() as sandbox:
        result = await sandbox.run(["python3", "main.py"], SandboxPolicy(wall_time_s=5), files={...})

See ``runner`` for a box's life and ``policy`` for what it may use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from farmd.sandbox.config import SandboxConfig
    from farmd.sandbox.host import Check, check_host
    from farmd.sandbox.policy import DEFAULT_POLICY, NAMED_POLICIES, SandboxPolicy
    from farmd.sandbox.result import BoxResult
    from farmd.sandbox.runner import BoxSession, Sandbox

# Loaded when first asked for: ``farmd.config`` reads ``farmd.sandbox.config`` on every start (every farmctl
# call included), and the box machinery behind the rest costs a tenth of a second to import.
_WHERE = {"SandboxConfig": "config", "Check": "host", "check_host": "host", "DEFAULT_POLICY": "policy",
          "NAMED_POLICIES": "policy", "SandboxPolicy": "policy", "BoxResult": "result", "Sandbox": "runner",
          "BoxSession": "runner"}

__all__ = [
    "DEFAULT_POLICY",
    "NAMED_POLICIES",
    "BoxResult",
    "BoxSession",
    "Check",
    "Sandbox",
    "SandboxConfig",
    "SandboxPolicy",
    "check_host",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
