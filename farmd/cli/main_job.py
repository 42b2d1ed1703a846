"""``make run``: the farm's main job — a small language model that learns through the farm.

Starts ``farmd serve`` on a data dir with the embedded defaults plus the loop's settings (``loop_toml``:
the trainer's policy ``torch:tiny`` is what demand produces, on ``arith``, band sampling), then the
reference trainer beside it (``python -m farm_trainer``: a supervised warm-up on reference solutions of
training seeds, then GRPO on the trajectories farmd streams it, a new policy version published after
every batch). While they run it shows the loop live; at the end it writes a report to DATA/report/: the
learning curve (``learning-curve.png``: pass rate and difficulty against rollouts and wall time) and a
summary (``summary.txt``, ``summary.json``). farmd then stops; the data dir stays for ``farmctl export``.

With ``--engine vllm`` (``make run ENGINE=vllm``) the policy is a Hugging Face model (a small Llama built here,
``farm_trainer.hf``) that a vLLM server samples: the job starts the server (``farmd.cli.vllm_server``) beside farmd,
whose ``[endpoints.vllm]`` names it and serves the line ``policy``; demand queues ``openai:policy@vllm`` jobs, a
group's first requests one request for ``n`` choices; the trainer (``--hf-model``) learns from the server's own
token ids and logprobs, publishes the weights after every batch, and farmd loads each version into the server
and stamps what it samples with the version read back from it. The job stops the server at the end.

``run_loop`` is the same loop for the benchmarks (band against uniform sampling) and the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from farmd.cli.local_farmd import LocalFarmd
from farmd.cli.loop_report import FarmSample, Summary, append_sample, plot, read_jsonl, summarize
from farmd.cli.shown import plain, text
from farmd.cli.vllm_server import VllmServer, ensure_model
from farmd.errors import FarmdFailed, LoopFailed, VllmFailed
from farmd.private import FILE_MODE, make_dir

POLICY = "tiny"
AGENT = f"torch:{POLICY}"
VLLM_POLICY = "policy"
"""The line the vLLM loop's trainer publishes, and the model name its server serves the weights under."""
VLLM_AGENT = f"openai:{VLLM_POLICY}@vllm"
VLLM_BATCH = 256
"""Trajectories per trainer step of the vLLM loop: 32 groups of 8 (the server samples fewer a second than the
tiny loop's worker, so a smaller batch keeps versions coming)."""
ENV = "arith"
CONSUMER = "trainer"
DEFAULT_MINUTES = 5.0
_END_S = 25.0
"""Of the budget, what the trainer leaves for its final held-out evaluation and the report."""
_SAMPLE_S = 1.0
"""How often the job reads the farm's status (the console, the report's samples). Each read is a few ms of farmd's
CPU, and farmd working while the trainer learns slows the trainer's torch threads several times that (docs/trainers.md):
at 0.5 s, about one learning step in three or four had one land in it."""
BATCH = 512
"""Trajectories per trainer step: 64 groups of 8. Measured in one process on arith, 512 a step learned
faster per completion and more steadily than 256 (greedy held-out 0.18 -> 0.45 within 72k completions,
against 0.18 -> 0.35 in 117k)."""


def lockstep_threads() -> int:
    """torch threads for each side of the tiny loop, which takes turns (lockstep): every core, up to four (the
    tiny LM's matrices are too small for more to help)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def loop_toml(sampling: str = "band", workers: int = 512, buffer: int = 2 * BATCH, *, per_version: int = BATCH,
              lag: int = 0, agent: str = AGENT, endpoint: str = "", keep_policies: int | None = None,
              torch_threads: int = 1, max_level: int = 0) -> str:
    """farmd's settings for the loop; everything else is farmd's embedded default. ``endpoint``: the
    ``[endpoints.vllm]`` table of the vLLM loop (``vllm_endpoint``). ``keep_policies``: the policy versions whose
    content is kept (None: farmd's default, the newest few). ``per_version``, ``lag``: demand rollouts per policy
    version (0: no limit), and how many versions what the trainer learns from may be behind it. ``max_level``: the
    task bank's highest level (0: arith's own)."""
    keep = "" if keep_policies is None else f"policy_keep_newest = {keep_policies}\n"
    cap = "" if not max_level else f"""# Held at level {max_level}: the curriculum stops here (make bench sets it to compare the farm with one process,
# which has no curriculum).
max_level = {max_level}
"""
    threads = "" if torch_threads == 1 else f"""# Lockstep: the trainer waits while the farm samples and the farm waits while it learns, so each may use
# every core in its turn (measured here: a batch of 512 sampled in 0.21 s on two threads, 0.33 s on one).
torch_threads = {torch_threads}
"""
    return f"""# Written by make run: the learning loop's farm. Everything not set here is farmd's default.
[farm]
# Rollout slots. A torch rollout holds no box: its agent samples every waiting rollout in one batch,
# so the more that wait together, the fewer forward passes.
workers = {workers}
{threads}
[scheduler]
# What production makes when the trainer's buffer runs low: its own policy on its environment.
demand_agent = "{agent}"
demand_envs = ["{ENV}"]
demand_consumers = ["{CONSUMER}"]
# One trainer batch per policy version, queued the moment the version is published, and lockstep (lag 0):
# each batch is sampled by the version the trainer then learns from. Before, a buffer alone kept production
# running while the trainer gathered, and what it learned from was 1.3 versions old on average, 2 at most;
# in one process, two versions behind learned less than half as much per rollout as none. Lag 1 (sampling
# the next batch while the trainer learns) made 40% more rollouts a second here, but moved the policy
# further from its samples each step (4x the KL, 20% of tokens clipped) and held out worse: 4-minute runs
# ended at +3 and +7 held-out points after their level-up, against +17 and +37 in lockstep.
demand_buffer = {buffer}
demand_per_version = {per_version}
demand_lag = {lag}
group_size = 8
{keep}
[taskbank]
sampling = "{sampling}"
# Every task fresh: at the current level, and once the level has moved up, 40% at the levels below
# (measured here: trained on the new level alone, the policy lost the old one). No known task comes back
# (max_groups_per_task = 1, so the band picks none): arith has thousands of problems at a level, each
# cheap, and a tiny model learns a problem it sees again by heart. Measured on 2 December, 4 minutes each:
# with 70% of each sample band tasks handed out twice at most, held-out at level 1 went 15% -> 29%; with
# every task fresh, 19% -> 57%, and 74% of groups still split (57% with the band). No re-checks: a retired
# arith task is one the policy nearly always fails or passes.
explore_share = 0.3
review_share = 0.4
recheck_share = 0.0
max_groups_per_task = 1
# A version per trainer step, several a second: evidence must outlive a few dozen of them.
keep_per_version = 0.99
# The tiny policy's sampled pass rate climbs a few points a minute: the level moves up once fresh tasks
# pass 40% of the time, while the level above (which the warm-up showed it) still splits groups (the
# default, 0.8, suits larger models that learn a level in the time). Lower, and the loop leaves level 1
# before it has learned it: measured here at 0.35, the held-out pass rate there fell back once it moved.
mastery_pass_rate = 0.5
level_min_groups = 32
{cap}{endpoint}"""


def vllm_endpoint(url: str, in_flight: int = 64) -> str:
    """The vLLM loop's ``[endpoints.vllm]``: the server the job started, serving the line ``policy``."""
    return f"""
[endpoints.vllm]
# The vLLM server this job started. It serves the policy line "{VLLM_POLICY}" under the model name "{VLLM_POLICY}":
# farmd loads each version the trainer publishes into it (reload from DATA/weights) and stamps what it samples
# with the version it reads back from the server.
url = "{url}"
serves = "{VLLM_POLICY}"
# An answer is a few digits and </s>; a group of 8 asks as one request for 8 choices, at temperature 1 (the
# logprobs vLLM returns are the unscaled model's: the trainer's ratio starts at 1).
max_tokens = 8
temperature = 1.0
n = 8
seed = 1
max_in_flight = {in_flight}
"""


@dataclass
class LoopFiles:
    data_dir: Path

    @property
    def trainer_dir(self) -> Path:
        return self.data_dir / "trainer"

    @property
    def metrics(self) -> Path:
        return self.trainer_dir / "metrics.jsonl"

    @property
    def report_dir(self) -> Path:
        return self.data_dir / "report"

    @property
    def farm_samples(self) -> Path:
        return self.report_dir / "farm.jsonl"


class _Watch:
    """Reads the farm and the trainer's log as the loop runs, and keeps the farm's samples."""

    def __init__(self, client: Any, files: LoopFiles) -> None:
        self.client = client
        self.files = files
        self.samples: list[FarmSample] = []
        self.status: dict[str, Any] = {}
        self.metrics: list[dict[str, Any]] = []

    def poll(self) -> None:
        info = self.client.status()
        bank = info["bank"]["envs"].get(ENV, {})
        sample = FarmSample(time=time.time(), rollouts=info["last_seq"], level=int(bank.get("level", 1)),
                            band_occupancy=bank.get("band_occupancy"),
                            informative_fraction=bank.get("informative_fraction"),
                            policy_version=int(info["policy_version"]))
        self.samples.append(sample)
        append_sample(self.files.farm_samples, sample)
        self.status = info
        self.metrics = read_jsonl(self.files.metrics)

    def rate(self, span_s: float = 5.0) -> float:
        recent = [s for s in self.samples if self.samples[-1].time - s.time <= span_s]
        if len(recent) < 2 or recent[-1].time <= recent[0].time:
            return 0.0
        return (recent[-1].rollouts - recent[0].rollouts) / (recent[-1].time - recent[0].time)

    def view(self, bar: Progress) -> Group:
        steps = [r for r in self.metrics if r.get("kind") == "step"]
        evals = [r for r in self.metrics if r.get("kind") == "eval"]
        last = self.samples[-1] if self.samples else None
        recent = steps[-10:]
        steps_per_s = 0.0
        if len(recent) >= 2 and recent[-1]["time"] > recent[0]["time"]:
            steps_per_s = (recent[-1]["learner_step"] - recent[0]["learner_step"]) / (recent[-1]["time"]
                                                                                     - recent[0]["time"])
        stale = [r["staleness_mean"] for r in recent if r.get("staleness_mean") is not None]
        phase = "warming up" if not steps else "learning"
        head = Text.assemble(
            (f"policy v{last.policy_version if last else 0}", "bold"), f"  {phase}   ",
            (f"{self.rate():.0f} rollouts/s", "bold"), f"   {steps_per_s:.1f} trainer steps/s   ",
            f"task bank level {last.level if last else '-'}   band occupancy {_pct(last.band_occupancy if last else None)}"
            f"   informative groups {_pct(last.informative_fraction if last else None)}   staleness "
            f"{(sum(stale) / len(stale)) if stale else 0:.2f} versions")
        table = Table("pass rate", *[f"level {lv}" for lv in range(1, 6)], title=None, box=None)
        by_level: dict[str, list[float]] = {}
        for r in recent:
            for lv, rate in (r.get("pass_rate_by_level") or {}).items():
                if rate is not None:
                    by_level.setdefault(lv, []).append(rate)
        table.add_row("training (sampled, last batches)",
                      *[_pct(sum(v) / len(v)) if (v := by_level.get(str(lv))) else "-" for lv in range(1, 6)])
        for label, record in (("held-out (greedy) at start", evals[0] if evals else None),
                              ("held-out (greedy) latest", evals[-1] if len(evals) > 1 else None)):
            rates = (record or {}).get("pass_rate_by_level") or {}
            version = f" v{record.get('eval_policy_version')}" if record else ""
            table.add_row(label + version, *[_pct(rates.get(str(lv))) for lv in range(1, 6)])
        return Group(bar, head, table)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def run_loop(data_dir: Path, minutes: float, *, sampling: str = "band", console: Console | None = None,
             trainer_args: tuple[str, ...] = (), workers: int = 512, http: str | None = None,
             engine: str = "tiny", keep_policies: int | None = None, max_level: int = 0) -> Summary:
    """Run the loop for ``minutes`` on ``data_dir`` and return its summary (the report is written too).
    ``http``: where farmd serves its web console (HOST:PORT; None: no console). ``engine``: ``tiny`` (farm's own
    LM, sampled in farmd's worker) or ``vllm`` (a Hugging Face model a vLLM server samples). ``max_level``: the task
    bank's highest level (0: the environment's)."""
    from farm_client import FarmClient

    files = LoopFiles(data_dir)
    make_dir(data_dir)
    make_dir(files.report_dir)
    config = data_dir / "farm.toml"
    server: VllmServer | None = None
    stamps: dict[int, int] = {}
    name, batch, extra = POLICY, BATCH, tuple(trainer_args)
    budget_s = max(60.0, minutes * 60)
    started_at = time.monotonic()
    if engine == "vllm":
        model = ensure_model(data_dir / "model")
        server = VllmServer(model, (VLLM_POLICY,), data_dir / "vllm.log", wait=False)
        name, batch = VLLM_POLICY, VLLM_BATCH
        # lr 1e-4, not the tiny LM's 5e-4: measured here, 5e-4 moved this model too far a step (approximate KL
        # to the sampling policy 0.05-0.09, a fifth of the tokens clipped) and the held-out pass rate fell 18% ->
        # 13% in 4 minutes; 1e-4 took it 18% -> 32%.
        extra = ("--hf-model", str(model), "--agent", VLLM_AGENT, "--eval-agent", f"{VLLM_AGENT}?temperature=0",
                 "--lr", "1e-4", "--threads", "1", *extra)
        config.write_text(loop_toml(sampling, 64, VLLM_BATCH * 3 // 2, per_version=0, agent=VLLM_AGENT,
                                    endpoint=vllm_endpoint(server.url), keep_policies=keep_policies,
                                    max_level=max_level))
    else:
        threads = lockstep_threads()
        extra = ("--threads", str(threads), *extra)  # argparse: the caller's own --threads comes later and wins
        config.write_text(loop_toml(sampling, workers, keep_policies=keep_policies, torch_threads=threads,
                                    max_level=max_level))
    try:
        farmd = LocalFarmd(data_dir, "--config", str(config), *(("--http", http) if http else ()))
    except BaseException:
        if server is not None:
            server.stop()
        raise
    trainer: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    try:
        if server is not None:
            if console is not None:
                console.print(Text.assemble(("vLLM", "bold"), f": server {server.proc.pid} at ", text(server.url),
                                            " starting, log in ", text(server.log_path)))
            server.wait_ready()
            # The server's start comes out of the budget: the job ends when it was told to.
            budget_s = max(60.0, budget_s - (time.monotonic() - started_at))
        if console is not None:
            console.print(Text.assemble(("farm", "bold"), f": farmd {farmd.proc.pid} at ", text(farmd.addr),
                                        ", data in ", text(data_dir), ", log in ", text(farmd.log_path)))
            if farmd.console:
                console.print(Text.assemble(("console", "bold"), ": ", (f"http://{farmd.console}/", "underline"),
                                            "  (the farm, trajectories, training and intake, live)"))
        fd = os.open(data_dir / "trainer.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        log = os.fdopen(fd, "ab")
        trainer = subprocess.Popen(
            [sys.executable, "-m", "farm_trainer", "--addr", farmd.addr, "--name", name, "--env", ENV,
             "--consumer", CONSUMER, "--dir", str(files.trainer_dir),
             "--minutes", f"{(budget_s - _END_S) / 60:.3f}", "--eval-seeds", "300",
             "--eval-every-s", "30", "--batch-size", str(batch), "--json", *extra],
            stdout=subprocess.PIPE, stderr=log, env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                                                     "TOKENIZERS_PARALLELISM": "false"})
        with FarmClient(farmd.addr) as client:
            watch = _Watch(client, files)
            bar = Progress(TextColumn("loop"), BarColumn(), TimeElapsedColumn(), TextColumn("of"),
                           TextColumn(f"{budget_s / 60:.1f} min"), TimeRemainingColumn())
            task = bar.add_task("loop", total=budget_s)
            started = time.monotonic()
            live = Live(console=console, refresh_per_second=2, transient=False) if console else None
            if live is not None:
                live.start()
            try:
                while trainer.poll() is None:
                    watch.poll()
                    bar.update(task, completed=min(budget_s, time.monotonic() - started))
                    if live is not None:
                        live.update(watch.view(bar))
                    time.sleep(_SAMPLE_S)
                watch.poll()
            finally:
                if live is not None:
                    live.stop()
        out = ""
        if trainer.stdout is not None:
            with trainer.stdout:
                out = trainer.stdout.read().decode(errors="replace")
        if trainer.wait() != 0:
            tail = (data_dir / "trainer.log").read_text(errors="replace")[-3000:]
            raise LoopFailed(f"the trainer exited {trainer.returncode}:\n{tail}\n{out[-1000:]}")
        if server is not None:
            with FarmClient(farmd.addr) as client:
                stamps = _stamps(client)
    finally:
        if trainer is not None:
            if trainer.poll() is None:
                trainer.terminate()
                trainer.wait(60)
            if trainer.stdout is not None:
                trainer.stdout.close()
        if log is not None:
            log.close()
        farmd.stop()
        if server is not None:
            server.stop()
    metrics = read_jsonl(files.metrics)
    farm = read_jsonl(files.farm_samples)
    summary = summarize(metrics, farm)
    if server is not None:
        summary.versions_stamped = len(set(stamps) - {0})
        summary.unstamped_share = stamps.get(0, 0) / max(1, sum(stamps.values()))
    what = f"{VLLM_AGENT} (vLLM)" if engine == "vllm" else AGENT
    plot(metrics, farm, files.report_dir / "learning-curve.png",
         f"{what} learning {ENV} through farm ({sampling} sampling)")
    (files.report_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    (files.report_dir / "summary.txt").write_text("\n".join(summary.lines()) + "\n")
    return summary


def _stamps(client: Any) -> dict[int, int]:
    """How many of the vLLM loop's trajectories were stamped with each version."""
    counts: dict[int, int] = {}
    for page in client.trajectory_pages(ENV, agent=VLLM_AGENT):
        for t in page:
            counts[t.policy_version] = counts.get(t.policy_version, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(prog="make run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("FARM_DATA", "farm-data")))
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("MINUTES") or DEFAULT_MINUTES),
                        help="the loop's time budget (default %(default)s; at least 1)")
    parser.add_argument("--sampling", choices=("band", "uniform"), default="band",
                        help="how the task bank picks tasks (uniform: the baseline make bench compares with)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object at the end")
    parser.add_argument("--engine", choices=("tiny", "vllm"), default=os.environ.get("ENGINE") or "tiny",
                        help="what samples the policy: farm's tiny LM in farmd's worker (default), or a vLLM "
                             "server sampling a Hugging Face model (make vllm-setup first)")
    parser.add_argument("--http", default=os.environ.get("CONSOLE") or "127.0.0.1:0", metavar="HOST:PORT",
                        help="where farmd serves its web console while the loop runs (default %(default)s: any free "
                             "port on this host; 'off': none)")
    args = parser.parse_args()
    console = Console(highlight=False, emoji=False, stderr=args.json)
    try:
        summary = run_loop(args.data, args.minutes, sampling=args.sampling, console=console,
                           http=None if args.http == "off" else args.http, engine=args.engine)
    except (FarmdFailed, LoopFailed, VllmFailed) as exc:
        console.print(text(exc, "red", inline=False))
        sys.exit(1)
    report = LoopFiles(args.data).report_dir
    if args.json:
        print(json.dumps(summary.to_json()))
    else:
        console.rule("the loop")
        for line in summary.lines():
            console.print(line)
        shown = plain(args.data)
        console.print(Text(f"report: {plain(report / 'learning-curve.png')}, {plain(report / 'summary.txt')}\n"
                           f"the farm's data stays in {shown}; try:\n"
                           f"  .venv/bin/farmctl export --data {shown} --format jsonl --out farm.jsonl\n"
                           f"  .venv/bin/farmd serve --data {shown} --http 127.0.0.1:8780   # then .venv/bin/farmctl "
                           "status, or the console at http://127.0.0.1:8780/"))


if __name__ == "__main__":
    main()
