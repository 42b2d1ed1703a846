"""What a box may use, as plain data.

Every field carries its unit in its name and a default that is safe for running a
program a model wrote. A policy says nothing about *how* the bounds are enforced;
``command`` and ``seccomp`` turn it into a bwrap command line and a filter, and
``runner`` enforces the rest from the host side.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from farmd.errors import PolicyError

# Upper limits a policy may ask for: a typo must not hand one box the machine.
_CEILINGS: dict[str, float] = {
    "wall_time_s": 24 * 3600,
    "cpu_time_s": 24 * 3600,
    "cpus": 256,
    "memory_mb": 256 * 1024,
    "pids": 4096,
    "disk_mb": 64 * 1024,
    "disk_inodes": 1_000_000,
    "tmp_mb": 16 * 1024,
    "shm_mb": 16 * 1024,
    "open_files": 65536,
    "output_kb": 256 * 1024,
}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The box's own layout depends on these; a caller may not redirect them.
_RESERVED_ENV = frozenset({"HOME", "PATH", "TMPDIR", "PYTHONPATH", "PWD"})


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """The bounds of one box. Hitting any of them kills the whole box and is reported by name."""

    wall_time_s: float = 10.0
    """Real time from the moment the program is released until the box is killed."""
    cpu_time_s: float = 10.0
    """CPU time of every process in the box together (user + system)."""
    cpus: float = 1.0
    """CPU bandwidth cap, in cores; a box cannot take more than this share of the machine."""
    memory_mb: int = 512
    """Memory of every process in the box, page cache and what it writes to its tmpfs mounts included."""
    pids: int = 64
    """Processes and threads alive at once in the box."""
    disk_mb: int = 64
    """Size of the writable scratch directory (the working directory)."""
    disk_inodes: int = 4096
    """Files and directories the scratch directory may hold."""
    tmp_mb: int = 64
    """Size of the box's private /tmp."""
    shm_mb: int = 16
    """Size of the box's private /dev/shm."""
    open_files: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    output_kb: int = 1024
    """Captured bytes per stream (stdout, stderr); more than this kills the box."""
    env: tuple[tuple[str, str], ...] = field(default=())
    """Extra environment variables for the program. Nothing is inherited from farmd."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "env":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PolicyError(f"{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise PolicyError(f"{f.name} must be a positive finite number, got {value!r}")
            ceiling = _CEILINGS[f.name]
            if value > ceiling:
                raise PolicyError(f"{f.name}={value} is above the ceiling of {ceiling:g}")
        for name, value in self.env:
            if not _ENV_NAME.match(name):
                raise PolicyError(f"environment variable name {name!r} is not a valid identifier")
            if name in _RESERVED_ENV:
                raise PolicyError(f"environment variable {name} is set by the box and cannot be overridden")
            if "\0" in value:
                raise PolicyError(f"environment variable {name} holds a NUL byte")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * 1024 * 1024

    @property
    def disk_bytes(self) -> int:
        return self.disk_mb * 1024 * 1024

    @property
    def output_bytes(self) -> int:
        return self.output_kb * 1024

    def with_overrides(self, **changes: Any) -> SandboxPolicy:
        """A copy with ``changes`` applied; ``None`` values are ignored (handy for CLI flags)."""
        kept = {k: v for k, v in changes.items() if v is not None}
        if "env" in kept and isinstance(kept["env"], Mapping):
            kept["env"] = tuple(sorted(kept["env"].items()))
        return replace(self, **kept)

    def mount_shape(self) -> tuple[int, int, int, int]:
        """The part of a policy fixed when a box starts: its tmpfs sizes.

        A box started ahead of demand can serve any policy with the same shape;
        every other bound is applied when the program is released.
        """
        return (self.disk_mb, self.disk_inodes, self.tmp_mb, self.shm_mb)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["env"] = dict(self.env)
        return out


DEFAULT_POLICY = SandboxPolicy()

NAMED_POLICIES: dict[str, tuple[str, SandboxPolicy]] = {
    "default": ("A short program: 10 s, 512 MiB, 64 processes, 64 MiB scratch.", DEFAULT_POLICY),
    "tiny": (
        "A one-liner or a quick check: 2 s, 128 MiB, 16 processes, 8 MiB scratch.",
        SandboxPolicy(
            wall_time_s=2, cpu_time_s=2, memory_mb=128, pids=16, disk_mb=8, tmp_mb=8, shm_mb=4
        ),
    ),
    "build": (
        "Compiling and testing a small project: 120 s, 2 GiB, 256 processes, 512 MiB scratch.",
        SandboxPolicy(
            wall_time_s=120,
            cpu_time_s=240,
            cpus=2,
            memory_mb=2048,
            pids=256,
            disk_mb=512,
            disk_inodes=65536,
            tmp_mb=256,
            open_files=1024,
        ),
    ),
}
