"""The learning loop with no farm: the same policy, warm-up, learner and recipe in one process.

No daemon, no store, no stream, no boxes: fresh tasks at one level (or, when ``bank`` is given, farm's own task
bank's picks, in memory, with the loop's settings: the level moving up once fresh tasks pass, the levels below
reviewed), made and judged by the ``arith`` environment's own code, completions sampled by
``farm_client.tinylm.sample``, and rows built as the trainer builds them (``farm_client.tensors.collate`` over records
shaped like the farm's). What the loop through farmd
costs beyond this is the farm's overhead: ``make bench`` puts the two side by side (wall time to the
same held-out gain).
"""

from __future__ import annotations

import copy
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from farm_client.record import Trajectory, Turn
from farm_client.tensors import collate
from farm_client.tinylm import PAD, LMConfig, TinyLM, sample
from farm_trainer.grpo import GRPOConfig, GRPOLearner
from farm_trainer.warmup import warm_up

from farmd import config
from farmd.cli.main_job import loop_toml
from farmd.envs import get
from farmd.taskbank import BankConfig, TaskBank

TRAIN, HELD_OUT = "arith", "arith:heldout"


@dataclass
class Curve:
    """Held-out greedy pass rate at level 1 against wall time and completions sampled."""

    points: list[tuple[float, int, float]] = field(default_factory=list)
    """(seconds since RL began, completions sampled, held-out pass rate at level 1)."""
    end_level: int = 1
    """The level training tasks were at when the loop ended (the task bank's, where it picks them)."""


def _pairs(levels: tuple[int, ...], per_level: int) -> list[tuple[str, str]]:
    env = get(TRAIN)
    out = []
    for level in levels:
        for seed in range(per_level):
            task = env.generate(seed, level)
            out.append((task.prompt, env.reference(task).final))
    return out


def held_out_rate(model: TinyLM, level: int = 1, seeds: int = 300) -> float:
    env = get(HELD_OUT)
    tasks = [env.generate(seed, level) for seed in range(seeds)]
    tok = model.tokenizer
    with torch.no_grad():
        out = sample(model, [tok.prompt(t.prompt) for t in tasks], max_new_tokens=16, temperature=0.0,
                     seeds=[0] * len(tasks))
    judge: Callable[[Any, str], Any] = env.judge  # type: ignore[attr-defined]
    return sum(judge(t, tok.decode(s.token_ids)).passed for t, s in zip(tasks, out, strict=True)) / len(tasks)


def run(seconds: float, *, seed: int = 0, groups: int = 64, group_size: int = 8, eval_every_s: float = 10.0,
        grpo: GRPOConfig | None = None, level: int = 1, lag: int = 0, bank: BankConfig | None = None) -> Curve:
    """Warm up, then GRPO on fresh training tasks at ``level`` for ``seconds``; the held-out curve.

    ``lag``: sample each batch with the policy as it was ``lag`` batches earlier (what a pipeline ``lag``
    batches deep does), to measure what staleness costs. ``bank``: the tasks are the task bank's picks with these
    settings, starting at ``level`` (the farm's loop moves its level up as the policy learns, and a policy that
    trains on level 2 gains less at level 1: without the same curriculum the two loops would not compare).
    """
    torch.manual_seed(seed)
    model = TinyLM(LMConfig())
    warm_up(model, _pairs((1, 2), 1000), target_accuracy=0.15, seed=seed)
    learner = GRPOLearner(model, grpo or GRPOConfig())
    env = get(TRAIN)
    judge: Callable[[Any, str], Any] = env.judge  # type: ignore[attr-defined]
    tok = model.tokenizer
    rng = random.Random(seed)
    curve = Curve()
    started = time.monotonic()
    sampled = 0
    next_eval = 0.0
    next_id = 1
    sampler = TinyLM(model.config)
    history = [copy.deepcopy(model.state_dict())]
    picker = _Picker(env, level, bank)
    while True:
        now = time.monotonic() - started
        if now >= next_eval:
            model.eval()
            curve.points.append((now, sampled, held_out_rate(model)))
            next_eval = now + eval_every_s
            model.train()
        if now >= seconds:
            curve.end_level = picker.level
            return curve
        tasks = picker.tasks(groups, rng)
        prompts = [tok.prompt(t.prompt) for t in tasks for _ in range(group_size)]
        sampler.load_state_dict(history[0])
        with torch.no_grad():
            outs = sample(sampler, prompts, max_new_tokens=16, temperature=learner.config.temperature,
                          seeds=[rng.randrange(1 << 62) for _ in prompts])
        sampled += len(outs)
        rows = []
        for i, out in enumerate(outs):
            task = tasks[i // group_size]
            verdict = judge(task, tok.decode(out.token_ids))
            rows.append(Trajectory(
                id=next_id, group_id=i // group_size, env=TRAIN, env_version="1", seed=task.seed,
                difficulty=level, agent="torch:inprocess", policy_version=0, reward=verdict.reward,
                passed=verdict.passed, status="ok", reasons=[], flags=[], verifier_version="1",
                turns=[Turn(prompt_token_ids=prompts[i], token_ids=out.token_ids, logprobs=out.logprobs,
                            has_logprobs=True)]))
            next_id += 1
        picker.observe([row.reward for row in rows], group_size)
        batch = collate(rows, pad_id=PAD, max_length=model.config.max_len, skip_equal_rewards=True,
                        eps=learner.config.adv_eps)
        if len(batch):
            for _ in range(learner.config.updates_per_batch):
                learner.step(batch.input_ids, batch.loss_mask, batch.logprobs, batch.advantages)
        history = [*history, copy.deepcopy(model.state_dict())][-(lag + 1):]


def loop_bank(sampling: str = "band") -> BankConfig:
    """The task bank's settings of ``make run``'s loop, read by farmd's own config loader from the file the loop
    writes."""
    with tempfile.TemporaryDirectory(prefix="farm-inprocess-") as tmp:
        path = Path(tmp) / "farm.toml"
        path.write_text(loop_toml(sampling))
        return config.load(path, read_credentials=False).taskbank


class _Picker:
    """A batch's tasks: fresh ones at a fixed level, or the task bank's picks (and what each group scored, told back
    to it, a version a batch)."""

    def __init__(self, env: Any, level: int, settings: BankConfig | None) -> None:
        self._env = env
        self._level = level
        self._bank = None if settings is None else TaskBank({TRAIN: env.max_difficulty},
                                                            replace(settings, start_level=level))
        self._keys: list[Any] = []
        self._version = 0

    def tasks(self, groups: int, rng: random.Random) -> list[Any]:
        if self._bank is None:
            return [self._env.generate(rng.randrange(1 << 40), self._level) for _ in range(groups)]
        self._keys = self._bank.sample(TRAIN, groups, rng)
        return [self._env.generate(key.seed, key.difficulty) for key in self._keys]

    def observe(self, rewards: list[float], group_size: int) -> None:
        if self._bank is None:
            return
        for i, key in enumerate(self._keys):
            self._bank.observe(key, rewards[i * group_size:(i + 1) * group_size], self._version)
        self._version += 1
        self._bank.set_policy_version(self._version)

    @property
    def level(self) -> int:
        return self._level if self._bank is None else self._bank.level(TRAIN)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--lag", type=int, default=0)
    parser.add_argument("--band", action="store_true", help="tasks picked by the task bank with make run's settings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.seconds, seed=args.seed, groups=args.groups, lag=args.lag,
                 grpo=GRPOConfig(lr=args.lr, temperature=args.temperature), bank=loop_bank() if args.band else None)
    for t, n, rate in result.points:
        print(f"{t:6.1f}s {n:8d} completions  held-out L1 {rate:.3f}")
    print(f"training tasks at level {result.end_level} at the end")
