"""What a node knows about itself, as plain data for the API to report."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from farmd import __version__
from farmd.sandbox import Check


@dataclass
class NodeInfo:
    workers: int
    max_boxes: int
    isolation: list[Check]
    name: str = field(default_factory=socket.gethostname)
    version: str = __version__
    started_at: float = field(default_factory=time.monotonic)

    @property
    def isolation_ok(self) -> bool:
        return all(c.ok for c in self.isolation)

    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at
