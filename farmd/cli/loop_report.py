"""The report of a learning loop: what the trainer's metrics log and the farm's samples say, as a
learning-curve PNG and a short summary.

Two inputs, both JSON lines: the trainer's ``metrics.jsonl`` (``farm_trainer.metrics`` documents its
records: ``step``, ``eval``, ``publish``, ``warmup``) and the farm's ``farm.jsonl``, which ``make run``
appends while it watches (``FarmSample``: wall time, rollouts stored, the task bank's level, band
occupancy, informative fraction). Reading tolerates a torn last line (a writer killed mid-line).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HELD_OUT_GAIN_GOAL = 0.10
"""How far the held-out pass rate at the starting level must rise for the loop to count as learning: about
three standard errors of one evaluation (300 seeds, some 300 distinct problems, at a pass rate near 0.3)."""


@dataclass(frozen=True, slots=True)
class FarmSample:
    """What ``make run`` saw of the farm at one moment."""

    time: float
    rollouts: int
    """Trajectories the farm had stored (every agent's)."""
    level: int
    """The task bank's difficulty level of the training environment."""
    band_occupancy: float | None
    informative_fraction: float | None
    policy_version: int


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON object in ``path`` (none when it is missing); a torn or foreign line is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def append_sample(path: Path, sample: FarmSample) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(sample)) + "\n")


@dataclass
class Summary:
    """The loop in numbers; ``lines()`` says it in words."""

    seconds: float = 0.0
    rollouts: int = 0
    trajectories_used: int = 0
    versions: int = 0
    learner_steps: int = 0
    start_level: int = 1
    end_level: int = 1
    held_out_start: float | None = None
    """Greedy pass rate on held-out problems at the starting level, right after the warm-up."""
    held_out_end: float | None = None
    held_out_best: float | None = None
    """The best of the evaluations after the first: a policy a few steps old swings by several points."""
    held_out_by_level: dict[str, float | None] = field(default_factory=dict)
    train_start: float | None = None
    """Sampled pass rate at the starting level over the first steps."""
    train_end: float | None = None
    """... and over the last steps at that level."""
    informative_fraction: float | None = None
    """Of the groups the trainer received, the share whose rewards differed."""
    staleness_mean: float | None = None
    staleness_max: int | None = None
    produced_per_s: float = 0.0
    consumed_per_s: float = 0.0
    steps_per_s: float = 0.0
    versions_stamped: int | None = None
    """For a model server's loop: the versions its trajectories were stamped with, read back from the server."""
    unstamped_share: float | None = None
    """... and the share stamped 0 (sampled across a weight load, or before the first)."""

    @property
    def held_out_gain(self) -> float | None:
        if self.held_out_start is None or self.held_out_end is None:
            return None
        return self.held_out_end - self.held_out_start

    @property
    def learned(self) -> bool:
        gain = self.held_out_gain
        return gain is not None and gain >= HELD_OUT_GAIN_GOAL

    @property
    def level_moved(self) -> bool:
        return self.end_level > self.start_level

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(held_out_gain=self.held_out_gain, learned=self.learned, level_moved=self.level_moved)
        return out

    def lines(self) -> list[str]:
        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{100 * x:.0f}%"

        gain = self.held_out_gain
        return [
            f"{self.rollouts} rollouts in {self.seconds:.0f}s ({self.produced_per_s:.0f}/s produced, "
            f"{self.consumed_per_s:.0f}/s consumed by the trainer); {self.versions} policy versions, "
            f"{self.learner_steps} learner steps ({self.steps_per_s:.1f}/s)",
            f"held-out pass rate at level {self.start_level} (greedy, problems never trained on): "
            f"{pct(self.held_out_start)} -> {pct(self.held_out_end)} (best {pct(self.held_out_best)})"
            + ("" if gain is None else f" ({100 * gain:+.0f} points; goal +{100 * HELD_OUT_GAIN_GOAL:.0f}: "
                                        f"{'met' if self.learned else 'MISSED'})"),
            f"training pass rate at level {self.start_level} (sampled): {pct(self.train_start)} -> "
            f"{pct(self.train_end)}",
            f"task bank level: {self.start_level} -> {self.end_level} "
            f"({'moved up' if self.level_moved else 'DID NOT MOVE'})",
            f"informative groups {pct(self.informative_fraction)}; staleness mean "
            f"{'n/a' if self.staleness_mean is None else f'{self.staleness_mean:.2f}'}, max "
            f"{'n/a' if self.staleness_max is None else self.staleness_max} versions",
        ] + ([] if self.versions_stamped is None else [
            f"versions loaded into the server and stamped on what it sampled: {self.versions_stamped}; "
            f"{pct(self.unstamped_share)} of its trajectories stamped 0 (sampled across a weight load)"])


def _window_rate(steps: Sequence[dict[str, Any]], level: str) -> float | None:
    """Pass rate at ``level`` over ``steps``, each batch weighted by its size."""
    passed = total = 0.0
    for s in steps:
        rate = (s.get("pass_rate_by_level") or {}).get(level)
        n = s.get("batch_trajectories", 0)
        if rate is not None and n:
            passed += rate * n
            total += n
    return passed / total if total else None


def summarize(metrics: Sequence[dict[str, Any]], farm: Sequence[dict[str, Any]], start_level: int = 1) -> Summary:
    steps = [r for r in metrics if r.get("kind") == "step"]
    evals = [r for r in metrics if r.get("kind") == "eval"]
    publishes = [r for r in metrics if r.get("kind") == "publish"]
    s = Summary(start_level=start_level, end_level=start_level)
    level = str(start_level)
    if farm:
        s.seconds = farm[-1]["time"] - farm[0]["time"]
        s.rollouts = farm[-1]["rollouts"] - farm[0]["rollouts"]
        s.start_level = int(farm[0]["level"])
        s.end_level = max(int(f["level"]) for f in farm)
        level = str(s.start_level)
        s.produced_per_s = s.rollouts / s.seconds if s.seconds > 0 else 0.0
    if evals:
        s.held_out_start = (evals[0].get("pass_rate_by_level") or {}).get(level)
        s.held_out_end = (evals[-1].get("pass_rate_by_level") or {}).get(level)
        later = [r for e in evals[1:] if (r := (e.get("pass_rate_by_level") or {}).get(level)) is not None]
        s.held_out_best = max(later, default=None)
        s.held_out_by_level = dict(evals[-1].get("pass_rate_by_level") or {})
    if steps:
        s.trajectories_used = int(steps[-1].get("trajectories", 0))
        s.learner_steps = int(steps[-1].get("learner_step", 0))
        window = max(1, len(steps) // 5)
        at_level = [x for x in steps if (x.get("pass_rate_by_level") or {}).get(level) is not None]
        s.train_start = _window_rate(at_level[:window], level)
        s.train_end = _window_rate(at_level[-window:], level)
        groups = sum(int(x.get("groups", 0)) for x in steps)
        used = sum(int(x.get("groups_used", 0)) for x in steps)
        s.informative_fraction = used / groups if groups else None
        stale = [x["staleness_mean"] for x in steps if x.get("staleness_mean") is not None]
        s.staleness_mean = sum(stale) / len(stale) if stale else None
        s.staleness_max = max((int(x["staleness_max"]) for x in steps if x.get("staleness_max") is not None),
                              default=None)
        span = steps[-1]["time"] - steps[0]["time"]
        if span > 0:
            first = int(steps[0].get("trajectories", 0))
            s.consumed_per_s = (s.trajectories_used - first) / span
            s.steps_per_s = (s.learner_steps - int(steps[0].get("learner_step", 0))) / span
    s.versions = len({p.get("version") for p in publishes})
    return s


def plot(metrics: Sequence[dict[str, Any]], farm: Sequence[dict[str, Any]], out: Path, title: str) -> Path:
    """The learning curve: pass rate and difficulty against rollouts and against wall time."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    steps = [r for r in metrics if r.get("kind") == "step"]
    evals = [r for r in metrics if r.get("kind") == "eval"]
    t0 = min([r["time"] for r in (*steps, *evals, *farm)], default=0.0)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), constrained_layout=True)
    levels = sorted({k for r in (*steps, *evals) for k in (r.get("pass_rate_by_level") or {})}, key=int)
    colors = {lv: plt.get_cmap("tab10")(i) for i, lv in enumerate(levels)}
    def consumed(r: dict[str, Any]) -> float:
        return float(r.get("trajectories", 0))

    def elapsed(r: dict[str, Any]) -> float:
        return float(r["time"]) - t0

    axes_x: tuple[tuple[str, Callable[[dict[str, Any]], float]], ...] = (
        ("rollouts consumed by the trainer", consumed), ("wall time (s)", elapsed))
    for col, (xname, x_of) in enumerate(axes_x):
        ax = axes[0][col]
        for lv in levels:
            pts = [(x_of(r), r["pass_rate_by_level"][lv]) for r in steps
                   if (r.get("pass_rate_by_level") or {}).get(lv) is not None]
            if pts:
                xs, ys = zip(*_smooth(pts), strict=True)
                ax.plot(xs, ys, color=colors[lv], alpha=0.8, label=f"training, level {lv} (sampled)")
            pts = [(x_of(r), r["pass_rate_by_level"][lv]) for r in evals
                   if (r.get("pass_rate_by_level") or {}).get(lv) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, "o--", color=colors[lv], label=f"held-out, level {lv} (greedy)")
        ax.set_xlabel(xname)
        ax.set_ylabel("pass rate")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title(f"pass rate against {xname.split(' (')[0]}")
        lvl = ax.twinx()
        if farm:
            fx = [f["rollouts"] - farm[0]["rollouts"] if col == 0 else f["time"] - t0 for f in farm]
            lvl.step(fx, [f["level"] for f in farm], where="post", color="black", lw=2, alpha=0.6,
                     label="task bank level")
        lvl.set_ylabel("task bank level (black)")
        lvl.set_ylim(0.5, 5.5)
    ax = axes[1][0]
    if steps:
        informative = [(elapsed(r), r["groups_used"] / r["groups"] if r.get("groups") else math.nan) for r in steps]
        ax.plot(*zip(*_smooth(informative), strict=True), label="informative groups")
    if farm:
        occ = [(f["time"] - t0, f["band_occupancy"]) for f in farm if f.get("band_occupancy") is not None]
        if occ:
            ax.plot(*zip(*occ, strict=True), label="band occupancy")
    ax.set_ylim(0, 1.05)  # a full band (1.0) is a line of its own, not the frame's edge
    ax.set_xlabel("wall time (s)")
    ax.set_title("where the learning signal is")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1][1]
    if steps:
        times = [elapsed(r) for r in steps]
        ax.plot(times, [r.get("policy_version", 0) for r in steps], label="policy version")
        ax2 = ax.twinx()
        ax2.plot(times, [r.get("staleness_mean") or 0 for r in steps], color="tab:red", alpha=0.6,
                 label="staleness (versions)")
        ax2.set_ylabel("staleness (red)")
    ax.set_xlabel("wall time (s)")
    ax.set_title("policy versions published, and how old the trained-on trajectories were")
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _smooth(points: Iterable[tuple[float, float]], window: int = 8) -> list[tuple[float, float]]:
    """A trailing mean over ``window`` points: one batch's pass rate is noisy."""
    pts = [(x, y) for x, y in points if y is not None and not (isinstance(y, float) and math.isnan(y))]
    out = []
    for i, (x, _) in enumerate(pts):
        recent = [y for _, y in pts[max(0, i - window + 1): i + 1]]
        out.append((x, sum(recent) / len(recent)))
    return out
