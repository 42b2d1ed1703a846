"""Held-out evaluation through the farm: the published policy, greedy, on problems it never trained on.

``evaluate`` queues runs of ``torch:NAME?temperature=0`` on explicit seeds of ``arith:heldout`` (whose
problems are disjoint from ``arith``'s) at each level, one attempt per seed, waits, and reports the pass
rate per level and the policy version(s) the trajectories were sampled with. The trainer's subscription is
another agent spec (``torch:NAME``) and other environments, so these trajectories never reach its stream.
``start_evaluation`` is the same without blocking; while training, the trainer waits for it in a thread of its own
(``farm_trainer.background``) and reads back summaries, which is all a pass rate needs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from farm_client import FarmClient

from farm_trainer.runs import SeededRuns, pass_rates

__all__ = ["EvalResult", "PendingEval", "eval_agent", "evaluate", "start_evaluation"]


def eval_agent(name: str) -> str:
    """The agent spec of a greedy evaluation of policy line ``name``."""
    return f"torch:{name}?temperature=0"


@dataclass(frozen=True)
class EvalResult:
    env: str
    agent: str
    pass_rate: dict[int, float | None]
    """Level -> share of its scored trajectories that passed (None when none was scored)."""
    policy_version: int
    """The version most of the trajectories carried (0 with none)."""
    policy_versions: dict[int, int]
    """Every version the trajectories carried -> how many: a publish during the runs shows here."""
    trajectories: int
    errors: int
    """Trajectories whose verdict is an error: no score, left out of the pass rates."""
    failed: int
    """Jobs that failed for good (infrastructure): no trajectory."""
    seconds: float

    @property
    def overall(self) -> float | None:
        """The mean of the levels' pass rates (levels have the same number of seeds)."""
        rates = [r for r in self.pass_rate.values() if r is not None]
        return sum(rates) / len(rates) if rates else None


@dataclass
class PendingEval:
    """An evaluation queued on the farm: ``done()`` polls, ``result()`` reads (once done)."""

    runs: SeededRuns

    def done(self) -> bool:
        return self.runs.done()

    def wait(self, timeout_s: float, *, stop: threading.Event | None = None) -> EvalResult:
        """The result, once every run has ended (``RunsTimeout`` after ``timeout_s``; ``RunsStopped`` once ``stop``
        is set)."""
        self.runs.wait(timeout_s, stop=stop)
        return self.result()

    def result(self) -> EvalResult:
        progress = self.runs.progress()
        by_level = self.runs.trajectories(full=False)
        rows = [t for level in by_level.values() for t in level]
        versions = Counter(t.policy_version for t in rows)
        return EvalResult(env=self.runs.env, agent=self.runs.agent, pass_rate=pass_rates(by_level),
                          policy_version=versions.most_common(1)[0][0] if versions else 0,
                          policy_versions=dict(sorted(versions.items())), trajectories=len(rows),
                          errors=sum(t.status != "ok" for t in rows),
                          failed=sum(int(r["failed"]) for r in progress),
                          seconds=time.monotonic() - self.runs.started)


def start_evaluation(client: FarmClient, name: str, env: str = "arith:heldout", levels: Iterable[int] = (1, 2),
                     seeds_per_level: int = 200, *, agent: str | None = None) -> PendingEval:
    """Queue the evaluation runs (seeds ``0 .. seeds_per_level - 1`` at each level) and return at once. ``agent``:
    the greedy agent spec, when the policy is sampled by something else than ``torch:NAME`` (a model server)."""
    return PendingEval(SeededRuns.queue(client, env, agent or eval_agent(name), levels, range(seeds_per_level)))


def evaluate(client: FarmClient, name: str, env: str = "arith:heldout", levels: Iterable[int] = (1, 2),
             seeds_per_level: int = 200, *, timeout_s: float = 600.0) -> EvalResult:
    """Greedy pass rate of the newest policy published as ``name`` on ``env``'s seeds, per level."""
    return start_evaluation(client, name, env, levels, seeds_per_level).wait(timeout_s)
