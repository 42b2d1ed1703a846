"""GRPO's learner: the clipped-ratio objective over token rows, AdamW, and nothing about where rows come from.

``GRPOLearner.step`` takes what ``farm_client.tensors.collate`` makes (right-padded ``input_ids``, the
``loss_mask`` of the model's tokens, the sampling ``logprobs`` stored with each trajectory, one group-relative
advantage per row) and makes one optimizer step. It knows no farm: the trainer loop (``farm_trainer.loop``)
feeds it from the stream, and a benchmark or a test can feed it from a sampler in the same process.

The loss, per model token ``t`` of row ``b`` (``loss_mask`` 1), with ``r = exp(new - old)``::

    -min(r * A[b], clip(r, 1 - clip, 1 + clip) * A[b])

averaged over every model token of the batch (a per-token mean, not per row), plus, when ``kl_coef > 0``,
``kl_coef`` times the k3 estimate of KL(policy || reference) over the same tokens:
``exp(ref - new) - (ref - new) - 1``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from farm_client.tinylm import sequence_logprobs

__all__ = ["GRPOConfig", "GRPOLearner", "Logprobs", "clipped_objective", "default_device", "k3_kl"]

Logprobs = Callable[[Any, torch.Tensor, float], torch.Tensor]
"""(model, input_ids [B, T], temperature) -> [B, T] logprobs of each token given those before it (0 at t = 0),
with gradients: ``farm_client.tinylm.sequence_logprobs`` for the tiny LM, ``farm_trainer.hf.hf_logprobs`` for a
Hugging Face causal LM."""


@dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """How the learner learns; the defaults are the recipe measured in FACTS.md (tiny LM, chain sums)."""

    lr: float = 5e-4
    clip: float = 0.2
    """The ratio is clipped to [1 - clip, 1 + clip] (PPO's epsilon)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the frozen reference policy; 0 computes no reference logprobs at all."""
    updates_per_batch: int = 2
    """Optimizer steps the trainer loop takes on each batch (the learner takes one per ``step``)."""
    grad_clip: float = 1.0
    """Max global grad norm; 0 turns clipping off (the norm is still measured)."""
    adv_eps: float = 1e-4
    """``(r - mean) / (std + adv_eps)``: passed to ``collate`` as its ``eps``."""
    drop_zero_variance: bool = True
    """Leave out groups whose rewards are all equal (advantages all 0: they only dilute the token mean)."""
    temperature: float = 1.0
    """The sampling temperature of the trajectories: new logprobs are computed at it, like the stored ones."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)

    def __post_init__(self) -> None:
        for name in ("lr", "temperature"):
            if not getattr(self, name) > 0 or not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        for name in ("clip", "kl_coef", "grad_clip", "adv_eps", "weight_decay"):
            if not getattr(self, name) >= 0 or not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if self.updates_per_batch < 1:
            raise ValueError(f"updates_per_batch must be at least 1, got {self.updates_per_batch}")


def default_device() -> torch.device:
    """``cuda`` when torch sees a GPU, else the CPU: nothing here needs a GPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def clipped_objective(new: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clip fraction) of the clipped-ratio objective over the tokens where ``mask`` is 1.

    ``new``, ``old``, ``mask``: [B, T]; ``advantages``: [B] (one per row) or [B, T]. The loss is the per-token
    mean of ``-min(r * A, clip(r, 1 - clip, 1 + clip) * A)``; the clip fraction is the share of those tokens
    whose ratio is outside the clip range.
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    # Off the mask the difference is forced to 0: padding's logprobs are arbitrary, and exp of a large one
    # would be inf, whose product with a zero mask is NaN.
    log_ratio = torch.where(mask > 0, new - old, torch.zeros_like(new))
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv
    loss = _masked_mean(-torch.minimum(unclipped, clipped), mask)
    outside = ((ratio - 1.0).abs() > clip).float()
    return loss, _masked_mean(outside, mask).detach()


def k3_kl(new: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of KL(policy || reference), averaged over the tokens where ``mask`` is 1:
    ``exp(ref - new) - (ref - new) - 1`` per token (never negative; 0 where the two agree)."""
    diff = torch.where(mask > 0, reference - new, torch.zeros_like(new))
    return _masked_mean(torch.exp(diff) - diff - 1.0, mask)


class GRPOLearner:
    """One policy, its optimizer, and the GRPO loss. ``reference``: the frozen policy the KL term pulls
    towards; with ``kl_coef > 0`` and none given, a frozen copy of ``model`` as it is now.

    The model (and reference) are moved to ``device`` (``default_device()`` unless given); inputs may be on
    any device, they are moved too.
    """

    def __init__(self, model: Any, config: GRPOConfig | None = None, reference: Any = None, *,
                 device: torch.device | str | None = None, logprobs: Logprobs | None = None) -> None:
        self.config = config or GRPOConfig()
        self.logprobs: Logprobs = logprobs or sequence_logprobs
        """How the model's logprobs are computed (``model`` is a ``TinyLM`` unless this says otherwise)."""
        self.device = torch.device(device) if device is not None else default_device()
        self.model = model.to(self.device)
        if reference is None and self.config.kl_coef > 0:
            reference = copy.deepcopy(model)
        self.reference = (reference.to(self.device).eval().requires_grad_(False) if reference is not None
                          else None)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, betas=self.config.betas,
                                           weight_decay=self.config.weight_decay)
        self.steps = 0
        """Optimizer steps taken (restored with ``load_state_dict``)."""

    def loss(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, old_logprobs: torch.Tensor,
             advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss with its graph, metrics) for one batch, without stepping: what ``step`` minimizes."""
        ids = input_ids.to(self.device)
        mask = loss_mask.to(self.device, torch.float32)
        old = old_logprobs.to(self.device, torch.float32)
        adv = advantages.to(self.device, torch.float32)
        self.model.train()
        new = self.logprobs(self.model, ids, self.config.temperature)
        loss, clip_fraction = clipped_objective(new, old, adv, mask, self.config.clip)
        metrics = {"policy_loss": float(loss.detach()), "clip_fraction": float(clip_fraction),
                   "approx_kl": float(_masked_mean((old - new).detach(), mask)),
                   "tokens": float(mask.sum())}
        if self.reference is not None and self.config.kl_coef > 0:
            with torch.no_grad():
                ref = self.logprobs(self.reference, ids, self.config.temperature)
            kl = k3_kl(new, ref, mask)
            loss = loss + self.config.kl_coef * kl
            metrics["ref_kl"] = float(kl.detach())
        metrics["loss"] = float(loss.detach())
        return loss, metrics

    def step(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, old_logprobs: torch.Tensor,
             advantages: torch.Tensor) -> dict[str, float]:
        """One AdamW step on the batch. Returns its metrics: ``loss`` (with the KL term), ``policy_loss``,
        ``clip_fraction``, ``approx_kl`` (mean of old - new logprobs over model tokens: how far the policy is
        from the one that sampled), ``ref_kl`` (only with ``kl_coef > 0``), ``grad_norm`` (before
        clipping), ``tokens`` (model tokens in the batch)."""
        loss, metrics = self.loss(input_ids, loss_mask, old_logprobs, advantages)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.steps += 1
        metrics["grad_norm"] = float(norm)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state and the step count (the weights are the model's own to save)."""
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
