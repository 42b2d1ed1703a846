"""``make bench``: every figure side by side with its baseline, measured in one run."""

from __future__ import annotations

import argparse
import json
import sys

import uvloop
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench import sandbox_bench, verifier_bench


def main() -> None:
    parser = argparse.ArgumentParser(description="farm's benchmarks")
    parser.add_argument("--only", choices=("sandbox", "verifier"), help="run one part")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--n", type=int, default=60, help="repetitions of each latency figure")
    parser.add_argument("--boxes", type=int, default=200, help="programs per throughput figure")
    parser.add_argument("--verifications", type=int, default=30, help="tasks per environment")
    args = parser.parse_args()
    console = Console(stderr=args.json, highlight=False)
    out: dict[str, object] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        if args.only in (None, "sandbox"):
            out["sandbox"] = sandbox_bench.report(uvloop.run(sandbox_bench.measure(args.n, args.boxes, progress)))
        if args.only in (None, "verifier"):
            out["verifier"] = uvloop.run(verifier_bench.measure(args.verifications, progress))
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if "sandbox" in out:
        sandbox_bench.render(out["sandbox"], console)  # type: ignore[arg-type]
    if "verifier" in out:
        verifier_bench.render(out["verifier"], console)  # type: ignore[arg-type]


main()
