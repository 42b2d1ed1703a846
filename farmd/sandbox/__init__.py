"""Boxes for untrusted code: bubblewrap + seccomp + cgroups, one entry point.

    async with Sandbox() as sandbox:
        result = await sandbox.run(["python3", "main.py"], SandboxPolicy(wall_time_s=5), files={...})

See ``runner`` for a box's life and ``policy`` for what it may use.
"""

from farmd.sandbox.config import SandboxConfig
from farmd.sandbox.host import Check, check_host
from farmd.sandbox.policy import DEFAULT_POLICY, NAMED_POLICIES, SandboxPolicy
from farmd.sandbox.result import BoxResult
from farmd.sandbox.runner import Sandbox

__all__ = [
    "DEFAULT_POLICY",
    "NAMED_POLICIES",
    "BoxResult",
    "Check",
    "Sandbox",
    "SandboxConfig",
    "SandboxPolicy",
    "check_host",
]
