"""Runs on explicit tasks, waited for and read back: what the warm-up's references and the evaluation share.

``SeededRuns.queue`` asks the farm for one run per level, each on the seeds given (one group of
``group_size`` attempts per seed); ``done`` polls them without blocking; ``wait`` blocks until they end;
``trajectories`` reads every stored trajectory of them, whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm_client import FarmClient
from farm_client.record import Trajectory

__all__ = ["RunsStopped", "RunsTimeout", "SeededRuns"]

_ENDED = ("succeeded", "failed", "cancelled")


class RunsTimeout(TimeoutError):
    """Runs did not end in the time given (the farm has no capacity for them, or no node runs the agent)."""


class RunsStopped(Exception):
    """Waiting for runs was stopped by whoever waited (``wait``'s ``stop``); the runs go on on the farm."""


@dataclass
class SeededRuns:
    """Runs of ``agent`` on ``env``, one per level, over the same seeds."""

    client: FarmClient
    env: str
    agent: str
    levels: tuple[int, ...]
    seeds: tuple[int, ...]
    group_size: int = 1
    run_ids: dict[int, int] = field(default_factory=dict)
    """Level -> the id of its run (``queue`` fills it)."""
    started: float = 0.0

    @classmethod
    def queue(cls, client: FarmClient, env: str, agent: str, levels: Iterable[int], seeds: Iterable[int],
              group_size: int = 1) -> SeededRuns:
        runs = cls(client, env, agent, tuple(levels), tuple(int(s) for s in seeds), group_size)
        if not runs.levels or not runs.seeds:
            raise ValueError("at least one level and one seed")
        runs.started = time.monotonic()
        for level in runs.levels:
            run = client.run(env, agent, len(runs.seeds) * group_size, group_size, difficulty=level,
                             seeds=runs.seeds)
            runs.run_ids[level] = int(run["id"])
        return runs

    def progress(self) -> list[dict[str, Any]]:
        return [self.client.get_run(run_id) for run_id in self.run_ids.values()]

    def done(self) -> bool:
        """Every run has ended (its jobs scored, failed for good or cancelled)."""
        return all(_ended(run) for run in self.progress())

    def wait(self, timeout_s: float, poll_s: float = 0.25, *, stop: threading.Event | None = None
             ) -> list[dict[str, Any]]:
        """Block until every run has ended; returns them. ``RunsTimeout`` after ``timeout_s``; ``RunsStopped`` once
        ``stop`` is set."""
        deadline = time.monotonic() + timeout_s
        while True:
            runs = self.progress()
            if all(_ended(run) for run in runs):
                return runs
            if time.monotonic() > deadline:
                left = sum(int(r["jobs"]) - _finished(r) for r in runs)
                raise RunsTimeout(f"{self.agent} on {self.env}: {left} of {sum(int(r['jobs']) for r in runs)} "
                                  f"jobs still open after {timeout_s:.0f} s (runs {sorted(self.run_ids.values())})")
            if stop is None:
                time.sleep(poll_s)
            elif stop.wait(poll_s):
                raise RunsStopped(f"{self.agent} on {self.env}: stopped waiting (runs {sorted(self.run_ids.values())})")

    def trajectories(self, *, full: bool = True) -> dict[int, list[Trajectory]]:
        """Level -> the stored trajectories of its run: whole records, or (``full`` False) their summaries, without
        the conversation, steps and answer (what a pass rate needs, and a fraction of what reading them costs)."""
        out: dict[int, list[Trajectory]] = {}
        for level, run_id in self.run_ids.items():
            rows = out.setdefault(level, [])
            for page in self.client.trajectory_pages(run_id=run_id, full=full):
                rows.extend(page)
        return out


def _finished(run: dict[str, Any]) -> int:
    return int(run["done"]) + int(run["failed"]) + int(run["cancelled"])


def _ended(run: dict[str, Any]) -> bool:
    return run["state"] in _ENDED or _finished(run) >= int(run["jobs"])


def pass_rates(by_level: Mapping[int, Sequence[Trajectory]]) -> dict[int, float | None]:
    """Level -> the share of its scored trajectories (verdict ``ok``) that passed; None with none scored."""
    out: dict[int, float | None] = {}
    for level, rows in by_level.items():
        scored = [t for t in rows if t.status == "ok"]
        out[level] = sum(t.passed for t in scored) / len(scored) if scored else None
    return out
