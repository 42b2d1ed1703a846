"""``python -m farm_trainer``: train the farm's tiny policy by GRPO for a few minutes.

    python -m farm_trainer --addr 127.0.0.1:7431 --dir runs/tiny --minutes 5

Progress lines go to stderr; the summary to stdout (``--json``: one JSON object). Run it again with the
same ``--dir`` and it resumes from the checkpoint there. Ctrl-C (or SIGTERM) stops after the batch in
hand, checkpoints and evaluates; a second Ctrl-C stops at once. Exit status: 0 done, 1 the farm failed
or the checkpoint could not be read, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

import grpc
import torch
from farm_client import FarmClient

from farm_trainer.checkpoint import CheckpointError
from farm_trainer.grpo import GRPOConfig
from farm_trainer.hf_loop import HFTrainer
from farm_trainer.loop import Trainer, TrainerConfig
from farm_trainer.metrics import report_to
from farm_trainer.runs import RunsTimeout

__all__ = ["config_from_args", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m farm_trainer", description=(
        "Train the farm's tiny policy by GRPO: warm up on the reference's answers, then stream scored groups, "
        "learn, publish, checkpoint; evaluate on held-out problems through the farm."))
    d = TrainerConfig()
    g = GRPOConfig()
    p.add_argument("--addr", default=d.addr, help="the farm's address (default %(default)s)")
    p.add_argument("--token-file", type=Path, help="a file holding the farm's bearer token")
    p.add_argument("--tls-ca", type=Path, metavar="PEM",
                   help="talk TLS, trusting farmd's certificate if this CA signed it (or FARM_TLS_CA)")
    p.add_argument("--tls-cert", type=Path, metavar="PEM",
                   help="a client certificate, for a farmd started with --tls-ca (or FARM_TLS_CERT)")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the key of --tls-cert (or FARM_TLS_KEY)")
    p.add_argument("--report-to", default="all", metavar="WHERE",
                   help="where the metrics go besides metrics.jsonl, as TRL's report_to: all (TensorBoard in DIR/runs, "
                        "and W&B when wandb is installed), none, or tensorboard,wandb (default %(default)s)")
    p.add_argument("--name", default=d.name, help="the policy line to publish; the stream's agent is torch:NAME")
    p.add_argument("--env", action="append", dest="envs", metavar="ENV",
                   help="a training environment (repeatable; default arith)")
    p.add_argument("--consumer", default=d.consumer, help="the stream's consumer name (default %(default)s)")
    p.add_argument("--dir", default=d.checkpoint_dir, help="checkpoint and metrics.jsonl (default %(default)s)")
    p.add_argument("--minutes", type=float, default=d.time_budget_s / 60, help="time budget (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="trajectories per batch (default %(default)s)")
    p.add_argument("--max-staleness", type=int, default=d.max_staleness,
                   help="policy versions a group may lag (default %(default)s)")
    p.add_argument("--kl", type=float, default=g.kl_coef, help="KL coefficient to the warmed-up policy (default 0)")
    p.add_argument("--lr", type=float, default=g.lr, help="GRPO learning rate (default %(default)s)")
    p.add_argument("--eval-every-s", type=float, default=d.eval_every_s,
                   help="seconds between held-out evaluations; 0: only at start and end (default %(default)s)")
    p.add_argument("--eval-seeds", type=int, default=d.eval_seeds, help="held-out seeds per level (default %(default)s)")
    p.add_argument("--eval-levels", type=_levels, default=d.eval_levels, metavar="L,L",
                   help=f"held-out levels evaluated (default {','.join(map(str, d.eval_levels))})")
    p.add_argument("--checkpoint-every-s", type=float, default=d.checkpoint_every_s,
                   help="seconds between checkpoints, and so acks (default %(default)s)")
    p.add_argument("--warmup-target", type=float, default=d.warmup_target,
                   help="greedy accuracy the warm-up stops at (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="initial weights and warm-up batches (default 0)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's own)")
    p.add_argument("--hf-model", type=Path, metavar="DIR",
                   help="train this Hugging Face causal LM (with its tokenizer) instead of the tiny LM: an inference "
                        "server samples it, farmd loads each published version into it (see --agent)")
    p.add_argument("--agent", default="", help="the stream's agent spec (default torch:NAME), e.g. openai:policy@vllm")
    p.add_argument("--eval-agent", default="",
                   help="the held-out evaluation's agent spec (default torch:NAME?temperature=0)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return p


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: levels are whole numbers, comma-separated (1,2)") from None
    if any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: a level is 1 or more")
    return levels


def config_from_args(args: argparse.Namespace) -> TrainerConfig:
    """The trainer's settings from the command line; ValueError for a bad one."""
    for flag in ("tls_ca", "tls_cert", "tls_key", "token_file"):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            raise ValueError(f"--{flag.replace('_', '-')} {path}: no such file")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("a client certificate goes with its key: give --tls-cert and --tls-key together")
    return TrainerConfig(addr=args.addr, name=args.name, envs=tuple(args.envs or ("arith",)),
                         consumer=args.consumer, checkpoint_dir=args.dir, time_budget_s=args.minutes * 60,
                         batch_size=args.batch_size, max_staleness=args.max_staleness,
                         grpo=GRPOConfig(kl_coef=args.kl, lr=args.lr), eval_every_s=args.eval_every_s,
                         eval_seeds=args.eval_seeds, eval_levels=args.eval_levels,
                         checkpoint_every_s=args.checkpoint_every_s,
                         warmup_target=args.warmup_target, seed=args.seed, agent=args.agent,
                         eval_agent=args.eval_agent, report_to=report_to(args.report_to))


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        p.error(str(exc))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    token = args.token_file.read_text().strip() if args.token_file else None
    tls = {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key}
    with FarmClient(config.addr, token=token, **tls) as farm:
        trainer = HFTrainer(farm, config, args.hf_model) if args.hf_model else Trainer(farm, config)

        def stop(signum: int, frame: FrameType | None) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once
            logging.getLogger("farm_trainer").info("stopping after this batch (again to stop now)")
            trainer.stop()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            summary = trainer.run()
        except grpc.RpcError as exc:
            print(f"farm_trainer: the farm at {config.addr} failed: {exc.code().name}: {exc.details()}",
                  file=sys.stderr)
            return 1
        except (CheckpointError, RunsTimeout) as exc:
            print(f"farm_trainer: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(summary))
    else:
        first, last = summary["first_eval"], summary["last_eval"]
        print(f"{summary['learner_step']} learner steps on {summary['trajectories']} trajectories in "
              f"{summary['seconds']:.0f} s; policy version {summary['policy_version']}")
        if first and last:
            print(f"held-out pass rate {first['pass_rate']} -> {last['pass_rate']} "
                  f"(by level {first['pass_rate_by_level']} -> {last['pass_rate_by_level']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
