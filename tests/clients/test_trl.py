"""TRL's own GRPOTrainer with farm as its task source and reward, against a real farmd (a subprocess on port 0):
a tiny Llama built here on the CPU (``farm_trainer.hf``: nothing is downloaded) trains for a few steps on tasks
from the farm's task bank, each batch judged through the Verify API. The rewards the trainer saw are the verdicts
the farm stored, read back from it, and the task bank counted them; the example script does the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from farm_client import FarmClient
from farm_client.trl import FarmReward, completion_text, task_dataset

from farmd.envs import get

pytestmark = [pytest.mark.slow,
              # TRL 1.16 still calls transformers 5.24's gradient_checkpointing* names, which it says are deprecated.
              pytest.mark.filterwarnings("ignore:`.*gradient_checkpointing.*` is deprecated:FutureWarning")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl-grpo" / "train.py"
ANSWERS = "01234"
"""The digits the test's policy may write: it answers tasks whose answer is one of them, one digit each, so about a
fifth of its completions pass and the rest fail (a random model of any size passes almost none of arith's tasks)."""


class Recording(FarmReward):
    """Farm's reward function as GRPOTrainer calls it, keeping what it returned to the trainer, call by call."""

    def __init__(self, client: FarmClient, agent: str) -> None:
        super().__init__(client, agent)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
        before = len(self.verdicts)
        rewards = super().__call__(prompts, completions, **kwargs)
        self.calls.append({"rewards": list(rewards), "verdicts": self.verdicts[before:],
                           "completions": [completion_text(c) for c in completions],
                           "seeds": list(kwargs["seed"])})
        return rewards


def answer_of(env: str, seed: int, difficulty: int) -> str:
    e = get(env)
    return e.reference(e.generate(seed, difficulty)).final


def test_grpo_trainer_sees_the_farms_stored_verdicts_as_its_rewards(running_farm: Any, tmp_path: Path) -> None:
    from farm_trainer.hf import build_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    farm = running_farm("--workers", "0")
    with FarmClient(farm.addr) as client:
        dataset = task_dataset(client, "arith", 48, difficulty=1)
        assert dataset.column_names == ["prompt", "env", "seed", "difficulty"]
        assert dataset[0]["prompt"][0]["role"] == "system" and dataset[0]["prompt"][1]["role"] == "user"
        dataset = dataset.filter(lambda row: answer_of(row["env"], row["seed"], row["difficulty"]) in ANSWERS)
        assert len(dataset) >= 4, "level 1 has enough tasks with a one-digit answer"
        model_dir = build_model(tmp_path / "model")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        model = AutoModelForCausalLM.from_pretrained(str(model_dir))
        allowed = {tokenizer.convert_tokens_to_ids(d) for d in ANSWERS}
        reward = Recording(client, agent="grpo-test")
        config = GRPOConfig(
            output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=16, num_generations=4,
            max_completion_length=1, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=True, bf16=False, seed=0, beta=0.0, dataloader_num_workers=0,
            generation_kwargs={"suppress_tokens": [i for i in range(len(tokenizer)) if i not in allowed]})
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[reward], args=config,
                              train_dataset=dataset)
        trainer.train()

        assert len(reward.calls) == 4, "one batch of completions judged per step"
        verdicts = [v for call in reward.calls for v in call["verdicts"]]
        assert len(verdicts) == 64
        passed = sum(v.passed for v in verdicts)
        assert 0 < passed < len(verdicts), "some completions pass and some fail: the rewards say something"
        # What the trainer saw is what the farm stored: every reward, read back by its trajectory's id.
        for call in reward.calls:
            for r, v, completion, seed in zip(call["rewards"], call["verdicts"], call["completions"], call["seeds"],
                                              strict=True):
                t = client.trajectory(v.trajectory_id)
                assert (t.agent, t.env, t.seed) == ("verify:grpo-test", "arith", seed)
                assert t.reward == r == v.reward and t.passed == v.passed
                assert t.messages[-1].content == completion
                assert t.passed == (completion.strip() == answer_of("arith", seed, t.difficulty))
            # A GRPO group (one prompt's generations) is one farm group.
            by_seed: dict[int, set[int]] = {}
            for v, seed in zip(call["verdicts"], call["seeds"], strict=True):
                by_seed.setdefault(seed, set()).add(v.group_id)
            assert all(len(groups) == 1 for groups in by_seed.values()), by_seed
        # TRL's own logged reward, step by step, is the mean of the farm's verdicts for that step.
        logged = [entry["rewards/farm/mean"] for entry in trainer.state.log_history if "rewards/farm/mean" in entry]
        assert logged == pytest.approx([fmean(call["rewards"]) for call in reward.calls], abs=1e-6)
        listed = client.trajectories(limit=1000, agent="verify:grpo-test")
        assert sorted(t.id for t in listed) == sorted(v.trajectory_id for v in verdicts)
        # Counted by the farm: in its pass rates at once, and by the task bank as its upkeep reads finished groups.
        rates = {(r["env"], r["difficulty"]): r for r in client.status()["pass_rates"]}
        assert (rates[("arith", 1)]["trajectories"], rates[("arith", 1)]["passed"]) == (64, passed)
        groups = len({v.group_id for v in verdicts})
        deadline = time.monotonic() + 20
        while client.status()["bank"]["envs"]["arith"]["groups"] < groups:
            assert time.monotonic() < deadline, client.status()["bank"]["envs"]["arith"]
            time.sleep(0.2)


def test_the_example_script_trains_against_a_farm_it_is_pointed_at(running_farm: Any, tmp_path: Path) -> None:
    farm = running_farm("--workers", "0")
    record = tmp_path / "seen.json"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--addr", farm.addr, "--env", "arith", "--tasks", "8", "--agent", "example",
         "--model", str(tmp_path / "model"), "--build-tiny-model", "--output-dir", str(tmp_path / "out"),
         "--max-steps", "1", "--batch-size", "8", "--num-generations", "4", "--max-completion-length", "4",
         "--record", str(record)], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(record.read_text())
    assert seen["agent"] == "verify:example" and len(seen["verdicts"]) == 8
    with FarmClient(farm.addr) as client:
        for v in seen["verdicts"]:
            t = client.trajectory(v["trajectory_id"])
            assert (t.agent, t.reward, t.passed) == ("verify:example", v["reward"], v["passed"])
        assert seen["logged"][0]["rewards/farm/mean"] == pytest.approx(fmean(v["reward"] for v in seen["verdicts"]))
