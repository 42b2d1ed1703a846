"""TRL's GRPOTrainer with a farm as its task source and its reward: tasks drawn from the farm's task bank, each
batch of completions judged by the farm (the Verify API) and stored there under agent ``verify:AGENT``.

Starts nothing itself: point it at a running farm (``--addr``; a token from ``--token-file`` or FARM_TOKEN).

    python examples/trl-grpo/train.py --addr 127.0.0.1:7431 --env arith --tasks 256 --agent my-run \\
        --model ./tiny-model --build-tiny-model --max-steps 50

``--model`` is any causal LM directory ``transformers`` loads (nothing is downloaded here); ``--build-tiny-model``
first writes farm's small Llama and its tokenizer there (``farm_trainer.hf.build_model``) when it holds none.
``--record FILE`` writes what the trainer saw (each verdict it was given, and TRL's logged metrics) as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

log = logging.getLogger("trl-grpo")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", required=True, help="the farm's gRPC address, HOST:PORT")
    p.add_argument("--token-file", type=Path, help="a file holding the bearer token (else FARM_TOKEN, if set)")
    p.add_argument("--env", default="arith", help="the farm environment to train on (a submission task)")
    p.add_argument("--tasks", type=int, default=256, help="tasks drawn from the task bank for the dataset")
    p.add_argument("--difficulty", type=int, default=0, help="0: the task bank's picks; else fresh tasks at this level")
    p.add_argument("--agent", default="trl-grpo", help="the name the farm stores these completions under")
    p.add_argument("--model", type=Path, required=True, help="a causal LM directory (weights and tokenizer)")
    p.add_argument("--build-tiny-model", action="store_true", help="write farm's tiny Llama to --model if empty")
    p.add_argument("--output-dir", type=Path, default=Path("trl-grpo-out"))
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8, help="completions per device step")
    p.add_argument("--num-generations", type=int, default=4, help="completions per prompt (a GRPO group)")
    p.add_argument("--max-completion-length", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", type=Path, help="write the verdicts the trainer saw and its logged metrics here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from farm_client import FarmClient
    from farm_client.trl import reward_function, task_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    if args.build_tiny_model and not (args.model / "config.json").exists():
        from farm_trainer.hf import build_model

        build_model(args.model, seed=args.seed)
    token = args.token_file.read_text().strip() if args.token_file else os.environ.get("FARM_TOKEN") or ""
    with FarmClient(args.addr, token=token) as farm:
        dataset = task_dataset(farm, args.env, args.tasks, difficulty=args.difficulty)
        reward = reward_function(farm, agent=args.agent)
        tokenizer = AutoTokenizer.from_pretrained(str(args.model))
        model = AutoModelForCausalLM.from_pretrained(str(args.model))
        config = GRPOConfig(
            output_dir=str(args.output_dir), max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
            num_generations=args.num_generations, max_completion_length=args.max_completion_length,
            learning_rate=args.learning_rate, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=True, bf16=False, seed=args.seed, temperature=1.0, beta=0.0, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[reward], args=config,
                              train_dataset=dataset)
        trainer.train()
        logged = [entry for entry in trainer.state.log_history if "rewards/farm/mean" in entry]
        for entry in logged:
            log.info("step %s: farm reward mean %.3f", entry.get("step"), entry["rewards/farm/mean"])
        seen = {"agent": f"verify:{args.agent}", "verdicts": [asdict(v) for v in reward.verdicts], "logged": logged}
        if args.record is not None:
            args.record.write_text(json.dumps(seen) + "\n")
        return seen


if __name__ == "__main__":
    main()
