"""``make tour``: every environment at work, with scripted agents: a smoke test of a whole farm.

Starts ``farmd serve`` with the defaults (data in ./farm-data), queues a mixed
workload (the ``reference`` and ``random`` agents over every built-in environment,
in groups) through the same client a trainer uses, shows it live (rollouts/s, pass
rate by environment and level, the task bank's band, the queue), and ends with
``farmctl status``. farmd then stops; the data dir stays for ``farmctl export --data``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from farmd.cli.local_farmd import LocalFarmd
from farmd.cli.shown import plain, text
from farmd.cli.status_view import band_table, pass_table
from farmd.envs import get, names
from farmd.errors import FarmdFailed

BIN = Path(sys.executable).parent

# Rollouts per wave for each environment, sized so the whole job takes a few minutes on
# two cores: environments verified in-process are cheap; boxes and long puzzles are not.
_PER_WAVE = {"rg:basic_arithmetic": 32, "rg:chain_sum": 32, "rg:countdown": 16, "rg:zebra_puzzles": 4,
             "py-func": 16, "shell": 8, "kernel": 4}
_DEFAULT_PER_WAVE = 8
_GROUP = 4
_WAVES = 12
_SKILLED = "skilled:3"
"""A stand-in policy whose pass rate falls with difficulty, so the task bank has a band to find."""


def _per_wave(env: str, scale: float) -> int:
    return max(_GROUP, int(_PER_WAVE.get(env, _DEFAULT_PER_WAVE) * scale) // _GROUP * _GROUP)


def workload(scale: float, n_waves: int = _WAVES) -> list[list[tuple[str, str, int]]]:
    """Waves of (env, agent, rollouts). The first holds the controls (``reference``, which must
    pass, and ``random``, which must fail) over every environment; every wave has the stand-in
    policy. Later waves are queued as earlier ones drain, so the task bank samples them knowing
    what it has seen: that is how the band is found and the level moves."""
    waves = []
    for wave in range(n_waves):
        jobs = []
        for env in names():
            n = _per_wave(env, scale)
            if wave == 0:
                jobs += [(env, "reference", n), (env, "random", n)]
            jobs.append((env, _SKILLED, n))
        waves.append(jobs)
    return waves


def live_view(bar: Progress, info: dict[str, Any], rate: float, elapsed: float) -> Group:
    q = info["queue"]
    head = (f"[bold]{rate:.1f} rollouts/s[/bold] (last 5 s)   queue depth {q['queued']}   running {q['leased']}   "
            f"elapsed {elapsed:.0f}s")
    return Group(bar, head, pass_table(info), band_table(info))


def run(data_dir: Path, scale: float, n_waves: int, console: Console) -> int:
    from farm_client import FarmClient

    try:
        farmd = LocalFarmd(data_dir)
    except FarmdFailed as exc:
        console.print(text(exc, "red", inline=False))  # ends with farmd's log, which quotes attempts
        return 1
    addr = farmd.addr
    console.print(Text.assemble(("farm", "bold"), f": farmd {farmd.proc.pid} at ", text(addr), ", data in ",
                                text(data_dir), ", log in ", text(farmd.log_path)))
    try:
        with FarmClient(addr) as client:
            info = client.status()
            before = info["queue"]["done"] + info["queue"]["failed"]
            waves = workload(scale, n_waves)
            total = sum(n for wave in waves for _, _, n in wave)
            runs: list[int] = []

            def submit(wave: list[tuple[str, str, int]]) -> None:
                for env, agent, n in wave:
                    runs.append(client.run(env, agent, n, group_size=_GROUP)["id"])

            submit(waves.pop(0))
            console.print(f"queueing {total} rollouts in groups of {_GROUP}, in {n_waves} waves: the reference and "
                          f"random agents over {len(names())} environments, and a stand-in policy ({_SKILLED}) "
                          f"for the task bank to place")
            bar = Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                           TimeElapsedColumn())
            task = bar.add_task("rollouts", total=total, note="")
            started = time.monotonic()
            history: list[tuple[float, int]] = []
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                while True:
                    p = client.progress(runs)
                    info = client.status()
                    now = time.monotonic()
                    ended = p["done"] + p["failed"]
                    if waves and info["queue"]["queued"] < 2 * max(1, info["workers"]) * _GROUP:
                        submit(waves.pop(0))  # the queue runs low: the next wave, sampled by a wiser bank
                        continue
                    history = [(t, n) for t, n in history if now - t <= 5] + [(now, ended)]
                    span = now - history[0][0]
                    rate = (ended - history[0][1]) / span if span > 0 else 0.0
                    bar.update(task, completed=ended, note=f"{p['passed']} passed, {p['failed']} failed")
                    live.update(live_view(bar, info, rate, now - started))
                    if not waves and ended >= p["jobs"]:
                        break
                    time.sleep(0.5)
            elapsed = time.monotonic() - started
            console.print(f"{total} rollouts in {elapsed:.0f}s ({total / elapsed:.1f}/s); "
                          f"{p['passed']} passed, {p['failed']} failed for infrastructure reasons "
                          f"(never scored); {before} were already in this data dir")
        console.rule("farmctl status")
        sys.stdout.flush()
        subprocess.run([str(BIN / "farmctl"), "--addr", addr, "status"], check=False)
        return 0 if p["failed"] == 0 else 1
    finally:
        farmd.stop()
        shown = plain(data_dir)
        console.print(Text(f"farmd stopped; the data stays in {shown}. Try:\n"
                           f"  .venv/bin/farmctl export --data {shown} --format jsonl --out farm.jsonl\n"
                           f"  .venv/bin/farmd serve --data {shown}   # and then .venv/bin/farmctl status"))


def main() -> None:
    parser = argparse.ArgumentParser(prog="make tour", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("FARM_DATA", "farm-data")))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every environment's rollouts by this")
    parser.add_argument("--waves", type=int, default=_WAVES, help="waves of the stand-in policy (at least 1)")
    args = parser.parse_args()
    for env in names():
        get(env)  # an environment that cannot load fails here, before farmd starts
    sys.exit(run(args.data, args.scale, max(1, args.waves), Console(highlight=False, emoji=False)))


if __name__ == "__main__":
    main()
