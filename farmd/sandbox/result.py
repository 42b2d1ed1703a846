"""What a box run gives back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from farmd.sandbox.scratch import Harvest

# Names used in BoxResult.violations, one per bound or policy a box can hit.
WALL_TIME = "wall_time"
CPU_TIME = "cpu_time"
MEMORY = "memory"
PIDS = "pids"
DISK = "disk"
TMP = "tmp"
SHM = "shm"
OUTPUT = "output"
SYSCALL = "syscall"
"""A syscall of a foreign ABI (or another seccomp kill) ended a process."""
INIT = "init"
"""The box's init (which reports how the program ended) was killed: the program's status is unknown."""


@dataclass(slots=True)
class BoxResult:
    """The outcome of one program in one box. A program's failure is a result, never an exception."""

    exit_code: int | None
    """The program's exit status, or None if it ended by a signal."""
    signal: int | None
    """The signal that ended the program (9 when farm killed the box for a bound), else None."""
    timed_out: bool
    oom: bool
    output_truncated: bool
    stdout: bytes
    stderr: bytes
    wall_s: float
    """From the program's release to its end, as the host saw it."""
    cpu_s: float
    """CPU time of every process in the box (the cgroup's count)."""
    max_rss_mb: float
    """Peak resident set of the program (and the children it waited for)."""
    violations: list[str] = field(default_factory=list)
    memory_peak_mb: float = 0.0
    """Peak memory of the whole box as the memory cgroup saw it: every process, tmpfs, page cache."""
    start_latency_s: float = 0.0
    """From asking for the program to run to its process existing."""
    warm: bool = False
    """True when the program ran in a box started ahead of demand."""
    harvest: Harvest | None = None

    @property
    def outcome(self) -> str:
        """One word for how the box ended: the first bound it hit, else exit_0, exit_nonzero or signal."""
        if self.violations:
            return self.violations[0]
        if self.exit_code is None:
            return "signal"
        return "exit_0" if self.exit_code == 0 else "exit_nonzero"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "oom": self.oom,
            "output_truncated": self.output_truncated,
            "stdout": self.stdout.decode("utf-8", errors="replace"),
            "stderr": self.stderr.decode("utf-8", errors="replace"),
            "wall_s": round(self.wall_s, 6),
            "cpu_s": round(self.cpu_s, 6),
            "max_rss_mb": round(self.max_rss_mb, 3),
            "violations": list(self.violations),
            "memory_peak_mb": round(self.memory_peak_mb, 3),
            "start_latency_s": round(self.start_latency_s, 6),
            "warm": self.warm,
        }
        if self.harvest is not None:
            out["files_out"] = self.harvest.copied
            out["files_skipped"] = [{"path": p, "reason": r} for p, r in self.harvest.skipped]
        return out
