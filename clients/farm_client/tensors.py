"""Padded torch tensors from the trajectory stream, for any torch training loop.

    from farm_client import FarmClient
    from farm_client.tensors import FarmDataset, token_logprobs

    with FarmClient("127.0.0.1:7431") as farm:
        for batch in FarmDataset(farm, "grpo", batch_size=64, max_length=8192, skip_equal_rewards=True):
            new = token_logprobs(model(batch.input_ids).logits, batch.input_ids)
            ...   # batch.logprobs, batch.loss_mask, batch.advantages: see TensorBatch

``collate`` turns whole groups of trajectories into a ``TensorBatch``; ``FarmDataset`` is a torch
``IterableDataset`` that streams whole groups from a farm and collates them. How a trajectory becomes token
rows (one per trajectory, or one per turn when the chat-template prefix breaks) is
``farm_client.sequences``. This is the only module of farm_client that imports torch
(``pip install 'farm-client[torch]'``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # the client itself runs without torch; only this module needs it
    raise ImportError("farm_client.tensors needs torch: pip install 'farm-client[torch]' (any torch build "
                      "works; install the one your machine needs first)") from exc

from farm_client.record import Trajectory
from farm_client.sequences import (
    DEFAULT_EPS,
    TokenRow,
    UntokenizedError,
    check_tokens,
    equal_reward_groups,
    group_advantages,
    out_of_domain,
    token_rows,
)

if TYPE_CHECKING:
    from farm_client.client import Batch, FarmClient

Overflow = Literal["truncate", "drop"]

__all__ = ["FarmDataset", "TensorBatch", "UntokenizedError", "collate", "token_logprobs"]


@dataclass(slots=True)
class TensorBatch:
    """Right-padded rows, one per trajectory (or per turn, see ``per_turn``), and what a loss needs.

    ``B`` rows of ``T`` tokens. Row ``b`` comes from trajectory ``trajectory_ids[b]``; the per-row values
    (reward, advantage, group, policy version) are that trajectory's.
    """

    input_ids: torch.Tensor
    """LongTensor [B, T]: prompt, model and fed-back tokens in order, then ``pad_id`` to ``T``."""
    attention_mask: torch.Tensor
    """LongTensor [B, T]: 1 on real tokens, 0 on padding."""
    loss_mask: torch.Tensor
    """FloatTensor [B, T]: 1.0 exactly on the model's tokens (every turn's completion); 0.0 on prompts,
    observations and tool results, template tokens between turns, padding, and tokens cut at max_length."""
    logprobs: torch.Tensor
    """FloatTensor [B, T]: the sampling logprob of ``input_ids[b, t]`` (given the tokens before it), as the
    server reported it when it sampled; 0.0 wherever ``loss_mask`` is 0."""
    rewards: torch.Tensor
    """FloatTensor [B]: the trajectory's reward under the verdict it was stored with."""
    advantages: torch.Tensor
    """FloatTensor [B]: ``(reward - mean) / (std + eps)`` over the trajectory's group (population std;
    see ``farm_client.sequences.group_advantages``). Computed over every trajectory of the group with an
    ``ok`` verdict, also those left out of the rows (too long, untokenized)."""
    group_ids: torch.Tensor
    """LongTensor [B]."""
    trajectory_ids: torch.Tensor
    """LongTensor [B]: several rows share one when the trajectory was split per turn."""
    policy_versions: torch.Tensor
    """LongTensor [B]: the policy version the trajectory was sampled under."""
    truncated: torch.Tensor
    """BoolTensor [B]: the row was longer than ``max_length`` and cut (``overflow="truncate"``)."""
    per_turn: torch.Tensor
    """BoolTensor [B]: the row is one turn of a trajectory whose turns do not share a prefix."""
    trajectories: list[Trajectory] = field(default_factory=list)
    """The records with at least one row, in the order they first appear."""
    skipped: dict[int, str] = field(default_factory=dict)
    """Trajectory id -> why it has no row (error verdict, equal rewards, untokenized, too long)."""
    source: Batch | None = None
    """The stream batch this came from (``FarmDataset``): what ``FarmClient.ack`` takes."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def _map(self, fn: Any) -> TensorBatch:
        moved = {f.name: fn(getattr(self, f.name)) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TensorBatch:
        """The same batch with every tensor on ``device``."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TensorBatch:
        """Page-locked copies (``DataLoader(pin_memory=True)`` calls this)."""
        return self._map(lambda t: t.pin_memory())


def _fit(row: TokenRow, max_length: int | None, overflow: Overflow) -> tuple[TokenRow | None, bool]:
    """(the row within ``max_length``, or None when it is left out; whether it was cut)."""
    if max_length is None or len(row) <= max_length:
        return row, False
    if overflow == "drop":
        return None, False
    cut = TokenRow(input_ids=row.input_ids[:max_length], loss_mask=row.loss_mask[:max_length],
                   logprobs=row.logprobs[:max_length], turns=row.turns)
    # A row cut inside its prompt holds no model token: it would cost compute and teach nothing.
    return (cut, True) if any(cut.loss_mask) else (None, True)


def collate(trajectories: Sequence[Trajectory], *, pad_id: int = 0, max_length: int | None = None,
            overflow: Overflow = "truncate", skip_equal_rewards: bool = False, skip_untokenized: bool = False,
            eps: float = DEFAULT_EPS) -> TensorBatch:
    """Whole groups of trajectories as one right-padded ``TensorBatch``.

    Pass whole groups (``FarmClient.batches(..., whole_groups=True)``): advantages are computed over the
    trajectories of each group given here. Trajectories whose verdict is an error (``status != "ok"``)
    are not scores and get no row; nor do those holding a number a loss cannot take (``out_of_domain``: farmd
    serves none, this is the trainer's own guard). ``skip_equal_rewards`` leaves out groups whose rewards are all equal
    (their advantages are all 0). A row longer than ``max_length`` tokens is, with ``overflow="truncate"``
    (the default), cut to its first ``max_length`` tokens (what is cut gets no loss; the row keeps its
    advantage and is marked in ``truncated``; a row cut before its first model token is left out), or with
    ``overflow="drop"`` left out. A trajectory without token ids or logprobs raises ``UntokenizedError``
    naming it, unless ``skip_untokenized``. What got no row is listed, with why, in ``skipped``.
    """
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if overflow not in ("truncate", "drop"):
        raise ValueError(f"overflow is 'truncate' or 'drop', got {overflow!r}")
    skipped: dict[int, str] = {}
    scored = []
    for t in trajectories:
        if t.status != "ok":
            skipped[t.id] = f"verdict {t.status or 'unknown'}: not a score"
        elif (why := out_of_domain(t)) is not None:  # never a NaN in a loss, whatever a record holds
            skipped[t.id] = f"out of its domain: {why}"
        else:
            scored.append(t)
    tokenized = []
    for t in scored:  # checked before any group is skipped, so a farm without tokens fails on its first batch
        try:
            check_tokens(t)
        except UntokenizedError as exc:
            if not skip_untokenized:
                raise
            skipped[t.id] = str(exc)
            continue
        tokenized.append(t)
    advantage = dict(zip((t.id for t in scored),
                         group_advantages([t.reward for t in scored], [t.group_id for t in scored], eps),
                         strict=True))
    flat = equal_reward_groups(scored) if skip_equal_rewards else set()

    rows: list[tuple[Trajectory, TokenRow, bool, bool]] = []
    kept: list[Trajectory] = []
    for t in tokenized:
        if t.group_id in flat:
            skipped[t.id] = f"group {t.group_id}: every reward is {t.reward}"
            continue
        built = token_rows(t)
        fitted = [(_fit(row, max_length, overflow), len(built) > 1) for row in built]
        mine = [(t, row, cut, split) for (row, cut), split in fitted if row is not None]
        if not mine:
            skipped[t.id] = f"longer than max_length={max_length}"
            continue
        rows.extend(mine)
        kept.append(t)

    width = max((len(row) for _, row, _, _ in rows), default=0)
    count = len(rows)
    input_ids = torch.full((count, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((count, width), dtype=torch.long)
    loss_mask = torch.zeros((count, width), dtype=torch.float32)
    logprobs = torch.zeros((count, width), dtype=torch.float32)
    for b, (_, row, _, _) in enumerate(rows):
        n = len(row)
        input_ids[b, :n] = torch.tensor(row.input_ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(row.loss_mask, dtype=torch.float32)
        logprobs[b, :n] = torch.tensor(row.logprobs, dtype=torch.float32)
    return TensorBatch(
        input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, logprobs=logprobs,
        rewards=torch.tensor([t.reward for t, _, _, _ in rows], dtype=torch.float32),
        advantages=torch.tensor([advantage[t.id] for t, _, _, _ in rows], dtype=torch.float32),
        group_ids=torch.tensor([t.group_id for t, _, _, _ in rows], dtype=torch.long),
        trajectory_ids=torch.tensor([t.id for t, _, _, _ in rows], dtype=torch.long),
        policy_versions=torch.tensor([t.policy_version for t, _, _, _ in rows], dtype=torch.long),
        truncated=torch.tensor([cut for _, _, cut, _ in rows], dtype=torch.bool),
        per_turn=torch.tensor([split for _, _, _, split in rows], dtype=torch.bool),
        trajectories=kept, skipped=skipped)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each token of ``input_ids`` under ``logits`` ([B, T, V] from a causal LM), laid
    out like ``TensorBatch.logprobs``: ``[b, t]`` is ``log p(input_ids[b, t] | input_ids[b, :t])``, and
    ``[b, 0]`` is 0 (nothing predicts the first token; it is never a model token).

    ``temperature`` divides the logits first: use the one the server's logprobs were computed at (vLLM
    reports logprobs of the unscaled model by default: 1.0).
    """
    scores = logits[:, :-1].float()
    if temperature != 1.0:
        scores = scores / temperature
    picked = torch.log_softmax(scores, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


class FarmDataset(IterableDataset[TensorBatch]):
    """The farm's stream as ready ``TensorBatch``es: whole groups, ``batch_size`` trajectories at a time.

    Iterate it directly or through ``DataLoader(dataset, batch_size=None)`` in the main process
    (``num_workers=0``): a batch is one gRPC stream's, and a worker process would open a second stream for
    the same consumer and ack out of step with the training loop. With ``auto_ack`` (the default) a batch is
    acknowledged when the next one is asked for, that is once the step that used it is done; a batch left
    unacked (the loop stopped or crashed) comes again when the consumer streams next (at least once). With
    ``auto_ack=False`` call ``ack(batch)`` yourself. A batch left empty by the skip rules is not yielded:
    with ``auto_ack`` it is acked at once, else the next ack covers it (an ack moves the cursor past
    everything before). The other keyword arguments are ``collate``'s and ``FarmClient.batches``'s.
    """

    def __init__(self, client: FarmClient, consumer: str, batch_size: int = 64, *, max_staleness: int = 0,
                 pad_id: int = 0, max_length: int | None = None, overflow: Overflow = "truncate",
                 skip_equal_rewards: bool = False, skip_untokenized: bool = False, eps: float = DEFAULT_EPS,
                 auto_ack: bool = True, reconnect_s: float = 0.0) -> None:
        super().__init__()
        self.client = client
        self.consumer = consumer
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.auto_ack = auto_ack
        self.reconnect_s = reconnect_s
        self._collate: dict[str, Any] = dict(pad_id=pad_id, max_length=max_length, overflow=overflow,
                                             skip_equal_rewards=skip_equal_rewards,
                                             skip_untokenized=skip_untokenized, eps=eps)

    def __iter__(self) -> Iterator[TensorBatch]:
        if get_worker_info() is not None:
            raise RuntimeError("FarmDataset streams in the process that trains: use DataLoader(dataset, "
                               "batch_size=None) with num_workers=0, or iterate the dataset itself")
        for batch in self.client.batches(self.consumer, self.batch_size, whole_groups=True,
                                         max_staleness=self.max_staleness, reconnect_s=self.reconnect_s):
            tensors = collate(batch.trajectories, **self._collate)
            tensors.source = batch
            if len(tensors):
                yield tensors
            # Only once the loop asks for the next batch (its step is done), and before the next is taken
            # from the stream: a farmd restart in between then resends nothing already acked.
            if self.auto_ack:
                self.client.ack(batch, retry_s=self.reconnect_s)

    def ack(self, batch: TensorBatch) -> int:
        """Acknowledge ``batch`` (with ``auto_ack=False``); returns the consumer's cursor."""
        if batch.source is None:
            raise ValueError("this batch did not come from a FarmDataset stream; ack the Batch it came from")
        return self.client.ack(batch.source, retry_s=self.reconnect_s)
