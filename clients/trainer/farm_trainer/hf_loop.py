"""The trainer of a Hugging Face causal LM that an inference server samples (``make run ENGINE=vllm``).

The same loop as ``farm_trainer.loop.Trainer`` (warm-up on the reference's answers, whole groups from the stream,
GRPO, a version published after every batch, checkpoints, held-out evaluations through the farm), with the
policy a ``transformers`` model loaded from a directory (``farm_trainer.hf.build_model`` makes one):

- the rows are the server's own tokens: ``collate`` builds them from each record's prompt token ids, sampled
  token ids and sampling logprobs, as vLLM returned them; nothing is tokenised again;
- the learner's logprobs are the model's (``hf_logprobs``: ``farm_client.tensors.token_logprobs`` of its logits),
  the layout of the stored ones, at the sampling temperature;
- a version is published as its weights, one safetensors file (``HFPolicy.weights``): farmd loads it into every
  replica of the endpoint that serves the line, and stamps what they sample with it;
- the stream's agent (``agent``, e.g. ``openai:policy@vllm``) and the evaluation's (``eval_agent``, e.g.
  ``openai:policy@vllm?temperature=0``) are the endpoint's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from farm_client import FarmClient
from farm_client.tensors import token_logprobs

from farm_trainer.grpo import Logprobs
from farm_trainer.hf import HFPolicy
from farm_trainer.loop import Trainer, TrainerConfig
from farm_trainer.warmup import WarmupResult, supervised

__all__ = ["HFTrainer", "hf_logprobs"]


def hf_logprobs(model: Any, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, T] logprobs of a causal LM's tokens given those before (0 at t = 0), with gradients."""
    return token_logprobs(model(input_ids=input_ids).logits, input_ids, temperature)


class HFTrainer(Trainer):
    """``Trainer`` over the model in ``model_dir`` (its tokenizer beside it)."""

    def __init__(self, client: FarmClient, config: TrainerConfig, model_dir: Path) -> None:
        super().__init__(client, config)
        self.model_dir = model_dir
        self.policy = HFPolicy.load(model_dir, self.device)

    def fresh_policy(self) -> Any:
        # The directory's weights are the initial ones (its builder seeded them): the server starts from them too.
        return self.policy.model

    def policy_bytes(self, model: Any) -> bytes:
        from safetensors.torch import save

        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        return bytes(save(state, metadata={"format": "pt"}))

    def load_policy(self, data: bytes) -> Any:
        import copy

        from safetensors.torch import load

        model = copy.deepcopy(self.policy.model)
        model.load_state_dict(load(data))
        return model.to(self.device)

    def logprobs(self) -> Logprobs | None:
        return hf_logprobs

    def pad_id(self) -> int:
        return self.policy.pad_id

    def max_length(self) -> int:
        return int(self.policy.model.config.max_position_embeddings)

    def supervised(self, pairs: list[tuple[str, str]], progress: Callable[[int, float, float], None]
                   ) -> WarmupResult:
        """Supervised steps on the reference's (prompt, answer) pairs, the prompt rendered by the model's chat
        template (as the server renders it), until the greedy accuracy on a slice reaches the target."""
        cfg = self.config
        policy = self.policy
        policy.model = self.model
        return supervised(self.model, pairs, rows=policy.sft_rows, logprobs=hf_logprobs,
                          accuracy=policy.greedy_accuracy, device=self.device, target_accuracy=cfg.warmup_target,
                          max_steps=cfg.warmup_max_steps, batch=cfg.warmup_batch, lr=cfg.warmup_lr, check_every=25,
                          check_size=256, seed=cfg.seed, progress=progress)
