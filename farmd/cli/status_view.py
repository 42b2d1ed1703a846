"""How a farm's status reads to a person: shared by ``farmctl status`` and ``make run``'s live view."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.table import Table


def _pct(x: object) -> str:
    return f"{x:.2f}" if isinstance(x, float) else "-"


def headline(info: dict[str, Any], addr: str) -> list[str]:
    iso = "[green]yes[/green]" if info["isolation_ok"] else "[red]NO: it refuses to run untrusted code[/red]"
    lines = [f"[bold]farmd {info['version']}[/bold] on {info['node']} at {addr}, up {info['uptime_s']:.0f}s; "
             f"policy version {info.get('policy_version', 0)}",
             f"workers: {info['workers']}   boxes at once: {info['max_boxes']}   isolation: {iso}"]
    lines += [f"  missing {c['name']}: {c['detail']}" for c in info["isolation"] if not c["ok"]]
    return lines


def queue_line(info: dict[str, Any]) -> str:
    q = info["queue"]
    return (f"queue: {q['queued']} queued, {q['leased']} running, {q['done']} done, {q['failed']} failed   "
            f"throughput: {info['throughput_per_s']:.1f} rollouts/s (last minute)")


def pass_table(info: dict[str, Any]) -> Table:
    table = Table("env", "level", "trajectories", "passed", "pass rate", "mean reward", "verifier errors",
                  title="pass rate by environment and level", title_justify="left")
    for r in info["pass_rates"]:
        rate = r["passed"] / r["trajectories"] if r["trajectories"] else 0.0
        table.add_row(r["env"], str(r["difficulty"]), str(r["trajectories"]), str(r["passed"]), f"{rate:.2f}",
                      f"{r['mean_reward']:.3f}" if r["mean_reward"] is not None else "-", str(r["errors"]))
    return table


def band_table(info: dict[str, Any]) -> Table:
    band = Table("env", "level", "tasks", "in band", "band occupancy", "informative groups", "retired",
                 title="task bank: the productive band (pass rate near one half)", title_justify="left")
    for env, b in info.get("bank", {}).get("envs", {}).items():
        if b.get("tasks"):
            band.add_row(env, str(b.get("level")), str(b.get("tasks")), str(b.get("in_band")),
                         _pct(b.get("band_occupancy")), _pct(b.get("informative_fraction")), str(b.get("retired")))
    return band


def status_view(info: dict[str, Any], addr: str) -> list[RenderableType]:
    parts: list[RenderableType] = list(headline(info, addr))
    if "queue" in info:
        parts += [queue_line(info), pass_table(info), band_table(info)]
        if info.get("consumers"):
            parts.append("consumers: " + ", ".join(f"{k} at {v}" for k, v in info["consumers"].items())
                         + f" (stream at {info.get('last_seq', 0)})")
    return parts
