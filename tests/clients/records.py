"""Hand-built trajectories tokenized like tests/clients/openai_server.py does, a tiny causal LM, and the
trainer's guide's code (docs/trainers.md)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from farm_client.record import ChatMessage, Trajectory, Turn

from tests.clients.openai_server import completion_ids, logprob, prompt_ids

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "trainers.md"
VOCAB = 512


def turn_for(messages: list[dict[str, str]], index: int) -> Turn:
    """The turn the server would have recorded for ``messages[index]`` (an assistant reply)."""
    ids = completion_ids(messages[index]["content"])
    return Turn(message_index=index, prompt_messages=index, completion=messages[index]["content"],
                prompt_token_ids=prompt_ids(messages[:index]), token_ids=ids,
                logprobs=[logprob(i, t) for i, t in enumerate(ids)], has_logprobs=True, finish_reason="stop")


def trajectory(id: int, group_id: int, reward: float, *replies: str, observations: list[str] | None = None,
               status: str = "ok", policy_version: int = 3) -> Trajectory:
    """A conversation: system, user, then each reply followed by its observation (all but the last)."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"task {id}"}]
    observations = observations or [f"observation {k} of {id}" for k in range(len(replies) - 1)]
    for k, reply in enumerate(replies):
        messages.append({"role": "assistant", "content": reply})
        if k < len(replies) - 1:
            messages.append({"role": "user", "content": observations[k]})
    turns = [turn_for(messages, i) for i, m in enumerate(messages) if m["role"] == "assistant"]
    return Trajectory(id=id, group_id=group_id, env="test", env_version="1", seed=id, difficulty=1,
                      agent="openai:tiny@local", policy_version=policy_version, reward=reward, passed=reward > 0,
                      status=status, reasons=[], flags=[], verifier_version="v1",
                      messages=[ChatMessage(role=m["role"], content=m["content"]) for m in messages], turns=turns)


class TinyLM(torch.nn.Module):
    """A causal LM in the shape trainers call (``model(input_ids, attention_mask=...).logits``)."""

    def __init__(self, vocab: int = VOCAB, dim: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        # Causal (position t sees tokens up to t), and a mean so that logits stay moderate at any length: a
        # sum would give logprobs so low that the importance ratio, and so every gradient, underflows.
        steps = torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)[None, :, None]
        hidden = torch.cumsum(self.embed(input_ids), dim=1) / steps
        return SimpleNamespace(logits=self.head(hidden))


def trainer_code() -> str:
    """The python block of the trainer's guide (docs/trainers.md)."""
    text = GUIDE.read_text()
    section = text[text.index("## Streaming from a farm"):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the trainer's guide (docs/trainers.md) has no python block"
    return match.group(1)


def loss_function_code() -> str:
    """Only the imports and ``grpo_loss`` of the guide's block: what runs without a farm."""
    code = trainer_code()
    return code[:code.index("\nwith FarmClient(")]
