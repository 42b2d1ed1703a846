"""The supervised warm-up: the reference's answers to training tasks, learned until the policy is barely right.

GRPO learns only from groups whose rewards differ. A fresh tiny LM answers nothing right, so every group
is all zeros and nothing moves; a short supervised warm-up on the reference agent's answers fixes that.
Stopping it early (greedy accuracy about 0.15, FACTS.md) leaves the groups informative and the gains to
RL. Only the levels warmed up on have informative groups at first: warm up on each level RL starts at.

``reference_pairs`` asks the farm for the reference's answers on explicit seeds of a *training*
environment (``arith``, never ``arith:heldout``: the evaluation's problems must stay unseen) and reads
them back; ``warm_up`` trains on them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from farm_client import FarmClient
from farm_client.tinylm import TinyLM, sample, sequence_logprobs, sft_rows

from farm_trainer.runs import SeededRuns

__all__ = ["WarmupResult", "greedy_accuracy", "reference_pairs", "warm_up"]

Pair = tuple[str, str]
"""(prompt, answer): the task's prompt as posed and the reference's final text."""


def reference_pairs(client: FarmClient, env: str = "arith", levels: Iterable[int] = (1, 2),
                    seeds_per_level: int = 1000, *, first_seed: int = 0, timeout_s: float = 600.0
                    ) -> list[Pair]:
    """(prompt, final) of the ``reference`` agent on seeds ``first_seed ..`` of ``env`` at each level.

    Queues one run per level (one attempt per seed), waits for them, and reads the stored trajectories;
    only passed ones (the reference's answers are right, but a verdict is what says so) are kept.
    """
    seeds = range(first_seed, first_seed + seeds_per_level)
    runs = SeededRuns.queue(client, env, "reference", levels, seeds, group_size=1)
    runs.wait(timeout_s)
    pairs: list[Pair] = []
    for rows in runs.trajectories().values():
        pairs.extend((t.task.prompt, t.final) for t in rows if t.status == "ok" and t.passed)
    if not pairs:
        raise RuntimeError(f"the reference passed no task of {env} at levels {list(runs.levels)}")
    return pairs


@torch.no_grad()
def greedy_accuracy(model: TinyLM, pairs: Sequence[Pair], *, max_new_tokens: int | None = None) -> float:
    """The share of ``pairs`` whose greedy (temperature 0) completion is exactly the answer."""
    if not pairs:
        return 0.0
    tok = model.tokenizer
    longest = max(len(answer) for _, answer in pairs)
    out = sample(model, [tok.prompt(p) for p, _ in pairs], max_new_tokens=max_new_tokens or longest + 1,
                 temperature=0.0, seeds=[0] * len(pairs))
    right = sum(tok.decode(s.token_ids) == answer and s.finish_reason == "stop"
                for s, (_, answer) in zip(out, pairs, strict=True))
    return right / len(pairs)


@dataclass(frozen=True)
class WarmupResult:
    steps: int
    accuracy: float
    """Greedy accuracy on the evaluation slice when it stopped."""
    loss: float
    """The last step's mean negative log-likelihood per answer token (nan with no step)."""
    seconds: float
    pairs: int
    reached: bool
    """The target was reached (else ``max_steps`` ran out)."""


def warm_up(model: TinyLM, pairs: Sequence[Pair], *, target_accuracy: float = 0.15, max_steps: int = 2000,
            batch: int = 64, lr: float = 1e-3, check_every: int = 25, check_size: int = 256, seed: int = 0,
            progress: Callable[[int, float, float], None] | None = None) -> WarmupResult:
    """Supervised steps on random batches of ``pairs`` until the greedy accuracy on a slice of them (
    ``check_size`` drawn with ``seed``, checked before the first step and every ``check_every`` steps) reaches
    ``target_accuracy``, or ``max_steps``. Trains ``model`` in place, on its own device; its own AdamW.

    ``progress(step, loss, accuracy)`` is called at each check.
    """
    return supervised(model, pairs, rows=lambda batch_: sft_rows(model.tokenizer, batch_, model.config.max_len),
                      logprobs=lambda _, ids: sequence_logprobs(model, ids),
                      accuracy=lambda check: greedy_accuracy(model, check),
                      device=model.device, target_accuracy=target_accuracy, max_steps=max_steps, batch=batch, lr=lr,
                      check_every=check_every, check_size=check_size, seed=seed, progress=progress)


Rows = Callable[[list[Pair]], tuple[torch.Tensor, torch.Tensor]]
"""A batch of pairs as (token ids, loss mask) rows: the answer's tokens are the ones learned."""


def supervised(model: torch.nn.Module, pairs: Sequence[Pair], *, rows: Rows,
               logprobs: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
               accuracy: Callable[[list[Pair]], float], device: torch.device | str, target_accuracy: float,
               max_steps: int, batch: int, lr: float, check_every: int, check_size: int, seed: int,
               progress: Callable[[int, float, float], None] | None = None) -> WarmupResult:
    """The warm-up's steps for any model: ``rows`` makes a batch's rows, ``logprobs`` the model's log-probabilities
    of their tokens, ``accuracy`` its greedy accuracy on a slice of pairs (the tiny LM's, or a Hugging Face
    model's through its chat template)."""
    if not pairs:
        raise ValueError("no pairs to warm up on")
    started = time.monotonic()
    rng = random.Random(seed)
    check = rng.sample(list(pairs), min(check_size, len(pairs)))  # every level: pairs come level by level
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    loss_value = float("nan")
    steps = 0
    reached = accuracy(check)
    while reached < target_accuracy and steps < max_steps:
        model.train()
        ids, mask = rows([rng.choice(pairs) for _ in range(batch)])
        ids, mask = ids.to(device), mask.to(device)
        logp = logprobs(model, ids)
        loss = -(logp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        steps += 1
        loss_value = float(loss.detach())
        if steps % check_every == 0 or steps == max_steps:
            reached = accuracy(check)
            if progress is not None:
                progress(steps, loss_value, reached)
    model.eval()
    return WarmupResult(steps=steps, accuracy=reached, loss=loss_value, seconds=time.monotonic() - started,
                        pairs=len(pairs), reached=reached >= target_accuracy)
