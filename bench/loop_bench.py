"""The learning loop, measured: band against uniform sampling, and the farm against no farm.

Three runs of one recipe (the tiny policy, its warm-up, the GRPO learner), each on the same budget:

- through farmd with the task bank's band sampling (``make run``'s loop);
- through farmd with uniform sampling (fresh tasks at levels drawn uniformly, no band, no curriculum);
- in one process with no farm (``bench.inprocess_loop``: no daemon, no store, no stream, no boxes).

Reported side by side: the share of groups whose rewards differ (the learning signal), the held-out
pass rate reached at level 1, the trainer's consumption rate against the farm's production rate, and
the wall time the farm takes to reach the held-out gain the in-process loop reaches, as a ratio.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import inprocess_loop
from bench.common import verdicts
from farmd.cli.loop_report import read_jsonl
from farmd.cli.main_job import LoopFiles, run_loop

GOALS = {"informative": 0.7, "farm_over_inprocess": 2.0}


def _held_out_curve(data: Path) -> list[tuple[float, float]]:
    """(seconds since the first evaluation, held-out pass rate at level 1) of a farm loop."""
    evals = [r for r in read_jsonl(LoopFiles(data).metrics) if r.get("kind") == "eval"]
    if not evals:
        return []
    t0 = evals[0]["time"]
    return [(r["time"] - t0, (r.get("pass_rate_by_level") or {}).get("1") or 0.0) for r in evals]


def _time_to(curve: list[tuple[float, float]], gain: float) -> float | None:
    if not curve:
        return None
    start = curve[0][1]
    return next((t for t, rate in curve if rate - start >= gain - 1e-9), None)


def measure(minutes: float, progress: Progress) -> dict[str, Any]:
    task = progress.add_task("learning loop: band, uniform, in process", total=3)
    out: dict[str, Any] = {"minutes": minutes}
    with tempfile.TemporaryDirectory(prefix="farm-loop-bench-") as tmp:
        for sampling in ("band", "uniform"):
            data = Path(tmp) / sampling
            summary = run_loop(data, minutes, sampling=sampling, trainer_args=("--eval-every-s", "10"))
            out[sampling] = {**summary.to_json(), "curve": _held_out_curve(data)}
            progress.advance(task)
    # The in-process loop gets what the farm's trainer had for RL: the budget less its warm-up and end.
    rl_s = max(30.0, minutes * 60 - 40)
    curve = inprocess_loop.run(rl_s, eval_every_s=10)
    out["inprocess"] = {"curve": [(t, rate) for t, _, rate in curve.points],
                        "completions": curve.points[-1][1] if curve.points else 0}
    progress.advance(task)
    return out


def render(rep: dict[str, Any], console: Console) -> None:
    band, uniform, inproc = rep["band"], rep["uniform"], rep["inprocess"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.0f}%"

    table = Table("figure", "band", "uniform", "band / uniform", "goal",
                  title=f"the learning loop through farmd, {rep['minutes']:g} minutes each, same seeds")
    table.add_row("groups with differing rewards", pct(band["informative_fraction"]),
                  pct(uniform["informative_fraction"]),
                  _ratio(band["informative_fraction"], uniform["informative_fraction"]),
                  f"band >= {pct(GOALS['informative'])}")
    table.add_row("held-out pass rate, level 1, start -> end (best)",
                  f"{pct(band['held_out_start'])} -> {pct(band['held_out_end'])} ({pct(band['held_out_best'])})",
                  f"{pct(uniform['held_out_start'])} -> {pct(uniform['held_out_end'])} "
                  f"({pct(uniform['held_out_best'])})",
                  f"{100 * ((band['held_out_gain'] or 0) - (uniform['held_out_gain'] or 0)):+.0f} points",
                  "band gains more")
    table.add_row("task bank level at the end", str(band["end_level"]), str(uniform["end_level"]), "", "")
    table.add_row("rollouts produced /s", f"{band['produced_per_s']:.0f}", f"{uniform['produced_per_s']:.0f}",
                  _ratio(band["produced_per_s"], uniform["produced_per_s"]), "")
    table.add_row("trajectories consumed by the trainer /s", f"{band['consumed_per_s']:.0f}",
                  f"{uniform['consumed_per_s']:.0f}", "", "")
    table.add_row("consumed / produced", _ratio(band["consumed_per_s"], band["produced_per_s"]),
                  _ratio(uniform["consumed_per_s"], uniform["produced_per_s"]), "", "")
    console.print(table)

    # The gain the farm must reach is the one process's, whole: the smaller of the two would let a farm that barely
    # learns pass (it reaches its own small gain early, as the one process does).
    target = max(0.0, (inproc["curve"][-1][1] - inproc["curve"][0][1]) if inproc["curve"] else 0.0)
    band_curve = [tuple(p) for p in band["curve"]]
    farm_s = _time_to(band_curve, target) if target > 0 else None  # type: ignore[arg-type]
    local_s = _time_to([tuple(p) for p in inproc["curve"]], target) if target > 0 else None  # type: ignore[misc]
    farm_span = band_curve[-1][0] if band_curve else 0.0
    never = farm_s is None and target > 0 and local_s
    table = Table("loop", "held-out gain at the end", f"seconds to +{100 * target:.0f} points", "farm / in process",
                  "goal", title="the same recipe with no farm (one process: no daemon, no boxes, no stream)")
    table.add_row("through farmd (band)", f"{100 * (band['held_out_gain'] or 0):+.0f} points",
                  f"not within {farm_span:.0f}" if never else "n/a" if farm_s is None else f"{farm_s:.0f}",
                  "not reached" if never else _ratio(farm_s, local_s),
                  f"<= {GOALS['farm_over_inprocess']:g}")
    table.add_row("in one process", f"{100 * target:+.0f} points", "n/a" if local_s is None else f"{local_s:.0f}",
                  "1.00", "")
    console.print(table)
    ratio = farm_s / local_s if farm_s is not None and local_s else None
    verdicts(console, {
        "band keeps groups informative": (band["informative_fraction"] or 0) >= GOALS["informative"],
        "band learns faster than uniform": (band["held_out_gain"] or 0) > (uniform["held_out_gain"] or 0),
        "farm within 2x of no farm": ratio is not None and ratio <= GOALS["farm_over_inprocess"],
    }, [
        "held-out pass rates are measured on 300 seeds at level 1 (about 0.03 of noise each): a single "
        "run's gain is a noisy figure; the curve in each data dir's report says more",
        "through farmd the sampler (farmd) and the learner (the trainer) take turns in two processes, each with "
        "torch on every core in its turn, as the one process does; every rollout also pays its lease, record, "
        "store write, stream read and protos (a step is about 2.7 times the one process's: docs/trainers.md)",
        "the farm's evaluations (every 10 s, 600 greedy rollouts) run through the same farm, beside training",
        "the farm loop's time to a gain is read at its evaluations (every 10 s)",
    ], how=" (read from the loops' own reports)")


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"
