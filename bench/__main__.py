"""``make bench``: every figure side by side with its baseline, measured in one run."""

from __future__ import annotations

import argparse
import json
import sys

import uvloop
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench import (
    atropos_bench,
    failover_bench,
    farm_bench,
    fleet_bench,
    fleet_sim_bench,
    kernel_speed_bench,
    loop_bench,
    sandbox_bench,
    sandbox_fusion_bench,
    store_bench,
    verifier_bench,
    vllm_bench,
)


def main() -> None:
    parser = argparse.ArgumentParser(description="farm's benchmarks")
    parser.add_argument("--only", choices=("sandbox", "verifier", "kernel-speed", "farm", "store", "loop", "fleet",
                                           "fleet-sim", "failover", "atropos", "sandbox-fusion", "vllm"), help="run one part")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--n", type=int, default=60, help="repetitions of each latency figure")
    parser.add_argument("--boxes", type=int, default=200, help="programs per throughput figure")
    parser.add_argument("--verifications", type=int, default=30, help="tasks per environment")
    parser.add_argument("--kernel-runs", type=int, default=20, help="runs of each kernel speed figure")
    parser.add_argument("--rollouts", type=int, default=200, help="py-func rollouts through farmd and inline")
    parser.add_argument("--trajectories", type=int, default=20_000, help="trajectories into and out of the store")
    parser.add_argument("--latency-s", type=float, default=10.0, help="seconds of rollouts per latency figure")
    parser.add_argument("--store-trajectories", type=int, default=2048,
                        help="trainer-sized trajectories per round of the store figures")
    parser.add_argument("--store-rounds", type=int, default=5, help="rounds of the store figures (medians)")
    parser.add_argument("--loop-minutes", type=float, default=3.0,
                        help="budget of each learning loop through farmd (band, uniform, held at level 1); "
                             "the one process runs half the held one's")
    parser.add_argument("--fleet-repeats", type=int, default=3,
                        help="trials of each fleet figure, one node and two (medians)")
    parser.add_argument("--failover-repeats", type=int, default=2,
                        help="failover: trials of each way through a killed coordinator (medians; the worst too)")
    parser.add_argument("--atropos-groups", type=int, default=200, help="groups pushed a round to each Atropos server")
    parser.add_argument("--atropos-rounds", type=int, default=6, help="rounds of the Atropos figures (medians)")
    parser.add_argument("--sf-calls", type=int, default=200,
                        help="calls per throughput figure of the SandboxFusion API (and of the subprocess beside)")
    parser.add_argument("--vllm-rollouts", type=int, default=256, help="prompts a round, through farm and straight")
    parser.add_argument("--vllm-concurrency", type=int, default=16, help="requests at once, both ways")
    parser.add_argument("--vllm-rounds", type=int, default=7, help="rounds of each, alternating (medians)")
    parser.add_argument("--vllm-loop-minutes", type=float, default=4.0,
                        help="budget of the vLLM loop and of the tiny loop beside it (0: no loops)")
    fleet_sim_bench.main_args(parser)
    args = parser.parse_args()
    console = Console(stderr=args.json, highlight=False)
    out: dict[str, object] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        if args.only in (None, "sandbox"):
            out["sandbox"] = sandbox_bench.report(uvloop.run(sandbox_bench.measure(args.n, args.boxes, progress)))
        if args.only in (None, "verifier"):
            out["verifier"] = uvloop.run(verifier_bench.measure(args.verifications, progress))
        if args.only in (None, "kernel-speed"):
            out["kernel_speed"] = uvloop.run(kernel_speed_bench.measure(args.kernel_runs, progress))
        if args.only in (None, "farm"):
            out["farm"] = farm_bench.measure(args.rollouts, args.trajectories, args.latency_s, progress)
        if args.only in (None, "store"):
            out["store"] = store_bench.measure(args.store_trajectories, args.store_rounds, progress)
        if args.only in (None, "loop"):
            out["loop"] = loop_bench.measure(args.loop_minutes, progress)
        if args.only in (None, "fleet"):
            out["fleet"] = fleet_bench.measure(args.fleet_repeats, progress)
        if args.only in (None, "fleet-sim"):
            out["fleet_sim"] = fleet_sim_bench.run(args, progress)
        if args.only in (None, "failover"):
            out["failover"] = failover_bench.measure(args.failover_repeats, progress)
        if args.only in (None, "atropos"):
            out["atropos"] = atropos_bench.measure(args.atropos_groups, args.atropos_rounds, progress)
        if args.only in (None, "sandbox-fusion"):
            out["sandbox_fusion"] = sandbox_fusion_bench.measure(args.n, args.sf_calls, progress)
        if args.only in (None, "vllm"):
            out["vllm"] = vllm_bench.measure(args.vllm_rollouts, args.vllm_concurrency, args.vllm_rounds,
                                             args.vllm_loop_minutes, progress)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if "sandbox" in out:
        sandbox_bench.render(out["sandbox"], console)  # type: ignore[arg-type]
    if "verifier" in out:
        verifier_bench.render(out["verifier"], console)  # type: ignore[arg-type]
    if "kernel_speed" in out:
        kernel_speed_bench.render(out["kernel_speed"], console)  # type: ignore[arg-type]
    if "farm" in out:
        farm_bench.render(out["farm"], console)  # type: ignore[arg-type]
    if "store" in out:
        store_bench.render(out["store"], console)  # type: ignore[arg-type]
    if "loop" in out:
        loop_bench.render(out["loop"], console)  # type: ignore[arg-type]
    if "fleet" in out:
        fleet_bench.render(out["fleet"], console)  # type: ignore[arg-type]
    if "fleet_sim" in out:
        fleet_sim_bench.render(out["fleet_sim"], console)  # type: ignore[arg-type]
    if "failover" in out:
        failover_bench.render(out["failover"], console)  # type: ignore[arg-type]
    if "atropos" in out:
        atropos_bench.render(out["atropos"], console)  # type: ignore[arg-type]
    if "sandbox_fusion" in out:
        sandbox_fusion_bench.render(out["sandbox_fusion"], console)  # type: ignore[arg-type]
    if "vllm" in out:
        vllm_bench.render(out["vllm"], console)  # type: ignore[arg-type]


main()
