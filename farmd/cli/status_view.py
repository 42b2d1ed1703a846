"""How a farm's status reads to a person: shared by ``farmctl status`` and ``make run``'s live view.

Every name in a status reply may have been chosen by someone else (a consumer's name by
a trainer, a node's by its operator, an environment's by a contributor): each goes in
as ``shown.text``, so it is shown, never obeyed.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from farmd.cli.shown import plain, text


def _pct(x: object) -> str:
    return f"{x:.2f}" if isinstance(x, float) else "-"


def headline(info: dict[str, Any], addr: str) -> list[Text]:
    iso = Text("yes", "green") if info["isolation_ok"] else Text("NO: it refuses to run untrusted code", "red")
    lines = [Text.assemble(Text.assemble("farmd ", text(info["version"]), style="bold"), " on ", text(info["node"]),
                           " at ", text(addr), f", up {info['uptime_s']:.0f}s; "
                           f"policy version {info.get('policy_version', 0)}"),
             Text.assemble(f"workers: {info['workers']}   boxes at once: {info['max_boxes']}   isolation: ", iso)]
    lines += [Text.assemble("  missing ", text(c["name"]), ": ", text(c["detail"]))
              for c in info["isolation"] if not c["ok"]]
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
        table.add_row(text(r["env"]), str(r["difficulty"]), str(r["trajectories"]), str(r["passed"]), f"{rate:.2f}",
                      f"{r['mean_reward']:.3f}" if r["mean_reward"] is not None else "-", str(r["errors"]))
    return table


def band_table(info: dict[str, Any]) -> Table:
    band = Table("env", "level", "tasks", "in band", "band occupancy", "informative groups", "retired",
                 title="task bank: the productive band (pass rate near one half)", title_justify="left")
    for env, b in info.get("bank", {}).get("envs", {}).items():
        if b.get("tasks"):
            band.add_row(text(env), str(b.get("level")), str(b.get("tasks")), str(b.get("in_band")),
                         _pct(b.get("band_occupancy")), _pct(b.get("informative_fraction")), str(b.get("retired")))
    return band


def consumers_table(info: dict[str, Any]) -> Table:
    """Each trainer's cursor: where it has acked to, what it has not taken yet, its streams."""
    rows = info["consumers"]
    if isinstance(rows, dict):  # a farmd from before consumers had more to say than their cursor
        rows = [{"name": name, "cursor": cursor} for name, cursor in rows.items()]
    table = Table("consumer", "cursor", "lag", "streams", "state", title_justify="left",
                  title=f"consumers (the stream is at {info.get('last_seq', 0)})")
    for c in rows:
        name = Text.assemble(text(c["name"]), " (whole groups)" if c.get("whole_groups") else "")
        table.add_row(name, str(c.get("cursor", "-")), str(c.get("lag", "-")), str(c.get("streams", "-")),
                      text(c.get("state", "-")))
    return table


def human_bytes(n: object) -> str:
    """A byte count as a person reads it (1.5 MB, 2.4 GB); "-" for none."""
    if not isinstance(n, int | float) or isinstance(n, bool):
        return "-"
    size, sign = float(abs(n)), "-" if n < 0 else ""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.1f} {unit}"
        size /= 1000
    return "-"  # unreachable: TB ends the loop


def disk_line(info: dict[str, Any]) -> str | None:
    """The disk the store and the policies take, and how fast it grows (None: a farmd too old to say)."""
    d = info.get("disk")
    if not d:
        return None
    growth = [d.get("store_growth_bytes_per_hour"), d.get("policy_growth_bytes_per_hour")]
    grows = ("growing " + human_bytes(sum(growth)) + "/hour (store " + human_bytes(growth[0]) + ", policies "
             + human_bytes(growth[1]) + f"; over the last {d['growth_window_s']:.0f}s)") if None not in growth \
        else "growth not measured yet"
    return (f"disk: store {human_bytes(d['store_bytes'])}, policies {human_bytes(d['policy_bytes'])} "
            f"({d['policies_kept']} versions kept, {d['policies_pinned']} pinned, {d['policies_removed']} removed "
            f"({human_bytes(d['policy_bytes_removed'])}); the newest {d['policy_keep_newest']} of each line kept); "
            f"{grows}")


def _ago(at: object) -> str:
    return f"{max(0.0, time.time() - at):.0f}s ago" if isinstance(at, int | float) else "-"


def nodes_table(info: dict[str, Any]) -> Table:
    """The fleet: each node's slots, what it runs and ran, when it last spoke, which policies it holds."""
    table = Table("node", "address", "state", "capacity", "in flight", "done", "failed", "checked", "refused",
                  "last heartbeat", "policies cached", "isolation", title="nodes", title_justify="left")
    for n in info.get("nodes", []):
        state = Text(n["state"], {"connected": "green", "lost": "red", "quarantined": "bold red"}.get(n["state"],
                                                                                                  "yellow"))
        iso = Text("yes", "green") if n["isolation_ok"] else Text("NO", "red")
        versions = ", ".join(str(v) for v in n["policy_versions"][-5:]) or "-"
        disagreed = n.get("disagreed", 0)
        checked = Text(f"{n.get('checked', 0)}" + (f" ({disagreed} wrong)" if disagreed else ""),
                       "red" if disagreed else "")
        refused = Text(str(n.get("refused", 0)), "red" if n.get("refused") else "")
        table.add_row(text(n["name"]), text(n["address"]), state, str(n["capacity"]), str(n["in_flight"]),
                      str(n["done"]), str(n["failed"]), checked, refused, _ago(n.get("last_heartbeat")), versions, iso)
    return table


def quarantine_lines(info: dict[str, Any]) -> list[Text]:
    """Why each quarantined node is (the reason quotes what a node sent: shown, never obeyed)."""
    return [Text.assemble(Text("quarantined ", "bold red"), text(n["name"]), ": ", text(n.get("quarantine_reason", "")),
                          " (farmctl nodes clear ", text(n["name"]), " lets it join again)")
            for n in info.get("nodes", []) if n["state"] == "quarantined"]


def error_line(error: dict[str, Any]) -> Text:
    """A job's error as farm sent it (``farm_client.error_dict``): its code and reason, then what the worker said
    (which may quote an endpoint or a node: shown, never read as markup)."""
    reason = f" {error['reason']}" if error.get("reason") else ""
    return Text.assemble((f"{error['code']}{reason}", "bold"), ": ", text(error.get("message", "")))


def failures_lines(info: dict[str, Any]) -> list[Text]:
    """The newest job failures, each with its run: the cause a failed run's count does not say."""
    rows = info.get("recent_failures") or []
    if not rows:
        return []
    lines = [Text("latest job failures (infrastructure: never scored)", "bold")]
    for f in rows:
        ago = max(0.0, time.time() - f["at"])
        where = f"run {f['run_id']} " if f["run_id"] else ""
        end = "failed" if f["final"] else "retried"
        lines.append(Text.assemble(f"  {ago:.0f}s ago: {where}job {f['job_id']} attempt {f['attempt']} {end}: ",
                                   error_line(f["error"])))
    return lines


def _waited(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


def standby_line(info: dict[str, Any]) -> str | None:
    """The coordinators standing by to take over (None: a store only this coordinator can serve, or an older
    farmd that does not say)."""
    if not info.get("shared_store"):
        return None
    standbys = info.get("standbys") or []
    if not standbys:
        return "standby coordinators: none (if this one stops, nothing serves until it is started again)"
    now = time.time()
    waiting = ", ".join(f"{plain(s['address']) or '?'} waiting {_waited(now - s['since'])}" for s in standbys)
    return f"standby coordinators: {len(standbys)} ({waiting})"


def status_view(info: dict[str, Any], addr: str) -> list[RenderableType]:
    parts: list[RenderableType] = list(headline(info, addr))
    if "queue" in info:
        parts += [queue_line(info)]
        parts += [line for line in (disk_line(info), standby_line(info)) if line is not None]
        if info.get("nodes"):
            parts.append(nodes_table(info))
            parts += quarantine_lines(info)
        parts += [pass_table(info), band_table(info)]
        if info.get("consumers"):
            parts.append(consumers_table(info))
        parts += failures_lines(info)
    return parts
