"""A small causal language model over characters: the policy farm's own loop trains, end to end.

It is a real token-level LM (embeddings, causal self-attention, a softmax over the vocabulary), small
enough to sample and train on two CPU cores, so that everything a GPU trainer does at scale runs
through the farm for real: prompt and completion token ids, sampling logprobs, loss masks, importance
ratios against the logprobs stored at sampling. Farm's ``torch:NAME`` agents sample from it on worker
nodes (``sample``); ``farm_trainer`` trains it (``sequence_logprobs``).

A policy travels as bytes (``save`` / ``load``): ``torch.save`` of a dict of plain values and tensors,
read back with ``weights_only=True``, so loading one never runs code from it. The architecture is
this module's; the blob holds its sizes (``LMConfig``, bounded on load) and the vocabulary, and every size
it declares is checked against the bytes it holds before torch makes anything (``farm_client.tinylm_blob``).

Tokens: 0 pad, 1 bos, 2 eos, then one per character of ``LMConfig.vocab``. A prompt is ``bos`` and
its characters; a completion is characters and then ``eos``. Sampling is reproducible per row: each
row draws its Gumbel noise from its own generator seeded with its own seed, so a rollout samples the
same completion whichever other rollouts share its batch.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as exc:  # the client itself runs without torch
    raise ImportError("farm_client.tinylm needs torch: pip install 'farm-client[torch]'") from exc

from farm_client.tinylm_blob import FORMAT, SPECIALS, check_config, read_layout
from farm_client.tinylm_blob import PolicyFormatError as PolicyFormatError

PAD, BOS, EOS = 0, 1, 2

ARITH_VOCAB = "0123456789+-="
"""The characters of farm's ``arith`` environment: its prompts and answers need nothing else."""

FinishReason = Literal["stop", "length"]

class OutOfVocabulary(ValueError):
    """Text holds a character the model has no token for."""


@dataclass(frozen=True)
class LMConfig:
    vocab: str = ARITH_VOCAB
    """The characters the model reads and writes, one token each (after the specials)."""
    d_model: int = 64
    n_layers: int = 3
    n_heads: int = 4
    max_len: int = 32
    """Positions the model has embeddings for: prompt and completion together."""

    def __post_init__(self) -> None:
        check_config(asdict(self))

    @property
    def vocab_size(self) -> int:
        return SPECIALS + len(self.vocab)


class Tokenizer:
    """Characters to token ids and back."""

    def __init__(self, vocab: str) -> None:
        self.vocab = vocab
        self._ids = {ch: SPECIALS + i for i, ch in enumerate(vocab)}

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as exc:
            raise OutOfVocabulary(f"{exc.args[0]!r} is not in the model's vocabulary {self.vocab!r}") from None

    def prompt(self, text: str) -> list[int]:
        """A prompt's ids: ``bos`` then its characters."""
        return [BOS, *self.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        """The characters of ``ids``; specials (pad, bos, eos) are not text."""
        return "".join(self.vocab[i - SPECIALS] for i in ids if SPECIALS <= i < SPECIALS + len(self.vocab))


KeysValues = tuple[torch.Tensor, torch.Tensor]
"""One block's attention keys and values of the positions so far, each [B, heads, T, head_dim]."""


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, None)[0]

    def attend(self, x: torch.Tensor, past: KeysValues | None) -> tuple[torch.Tensor, KeysValues]:
        """``x`` [B, T, D] through the block, after the positions whose keys and values are ``past`` (None: none);
        and the keys and values of every position so far."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        # Causal within ``x``; a single new position attends to every one before it, which is what causal means there.
        att = F.scaled_dot_product_attention(q, k, v, is_causal=past is None and t > 1)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out, (k, v)


class TinyLM(nn.Module):
    """A pre-norm decoder-only transformer with learned positions and a tied output head.

    Rows are right-padded (prompt, completion, then pad): causal attention means padding never
    changes the logits of the tokens before it, so no padding mask is needed.
    """

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = Tokenizer(config.vocab)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(_Block(config.d_model, config.n_heads) for _ in range(config.n_layers))
        self.ln = nn.LayerNorm(config.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] for ids [B, T] (T at most ``max_len``)."""
        t = ids.shape[1]
        if t > self.config.max_len:
            raise ValueError(f"{t} tokens; the model has {self.config.max_len} positions")
        x = self.embed(ids) + self.pos(torch.arange(t, device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.ln(x) @ self.embed.weight.T
        return logits

    def extend(self, ids: torch.Tensor, past: list[KeysValues] | None = None
               ) -> tuple[torch.Tensor, list[KeysValues]]:
        """Logits [B, V] of the position after ``ids`` [B, T], which follow the positions whose keys and values are
        ``past`` (one per block; None: ``ids`` start the sequence); and the keys and values with ``ids``' added. What
        ``forward``'s last position would give, each earlier position computed once: sampling's KV cache."""
        start = 0 if past is None else past[0][0].shape[2]
        t = ids.shape[1]
        if start + t > self.config.max_len:
            raise ValueError(f"{start + t} tokens; the model has {self.config.max_len} positions")
        x = self.embed(ids) + self.pos(torch.arange(start, start + t, device=ids.device))
        cache: list[KeysValues] = []
        for i, block in enumerate(self.blocks):
            assert isinstance(block, _Block)
            x, kv = block.attend(x, None if past is None else past[i])
            cache.append(kv)
        logits: torch.Tensor = self.ln(x[:, -1]) @ self.embed.weight.T
        return logits, cache

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device


# -- sampling ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sampled:
    """One completion: its token ids (``eos`` included when the model stopped), the sampling logprob of
    each, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


def _noise(seeds: Sequence[int], steps: int, vocab: int) -> torch.Tensor:
    """Gumbel noise [B, steps, V], each row from its own generator: a row's draws do not depend on the
    rest of its batch."""
    rows = []
    for seed in seeds:
        g = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
        rows.append(torch.rand(steps, vocab, generator=g))
    u = torch.stack(rows).clamp_(1e-12, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


@torch.no_grad()
def sample(model: TinyLM, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
           seeds: Sequence[int]) -> list[Sampled]:
    """Complete every prompt (token ids, ``bos`` first). ``temperature`` 0 is greedy.

    The logprob recorded with each token is that of the distribution it was drawn from: the softmax of
    logits / temperature (of the raw logits when greedy), as an inference server reports it. Prompts of
    one length are decoded together (no padding, so no position shifts); a row stops at ``eos``, at
    ``max_new_tokens``, or where the model runs out of positions.
    """
    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    if not temperature >= 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    out: list[Sampled | None] = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError("an empty prompt (it needs at least bos)")
        by_length.setdefault(len(p), []).append(i)
    for rows in by_length.values():
        for i, s in zip(rows, _sample_equal(model, [prompts[i] for i in rows], max_new_tokens, temperature,
                                            [seeds[i] for i in rows]), strict=True):
            out[i] = s
    return [s for s in out if s is not None]


def _sample_equal(model: TinyLM, prompts: list[Sequence[int]], max_new_tokens: int, temperature: float,
                  seeds: list[int]) -> list[Sampled]:
    steps = max(0, min(max_new_tokens, model.config.max_len - len(prompts[0])))
    device = model.device
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device)
    b = ids.shape[0]
    noise = _noise(seeds, steps, model.config.vocab_size).to(device) if temperature > 0 and steps else None
    tokens = torch.zeros(b, steps, dtype=torch.long)
    logps = torch.zeros(b, steps)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    ends = torch.full((b,), steps, dtype=torch.long)
    logits, cache = model.extend(ids) if steps else (None, [])
    for t in range(steps):
        assert logits is not None
        logits = logits.float()
        if noise is not None:
            logp = F.log_softmax(logits / temperature, dim=-1)
            tok = (logp + noise[:, t]).argmax(dim=-1)
        else:
            logp = F.log_softmax(logits, dim=-1)
            tok = logp.argmax(dim=-1)
        tokens[:, t] = tok.cpu()
        logps[:, t] = logp.gather(1, tok[:, None])[:, 0].cpu()
        newly = (tok == EOS) & ~done
        ends[newly.cpu()] = t + 1
        done |= newly
        if bool(done.all()):
            break
        if t + 1 < steps:  # the next position's logits, from this token and the cache of those before it
            logits, cache = model.extend(tok[:, None], cache)
    out = []
    for r in range(b):
        n = int(ends[r])
        stopped = n > 0 and int(tokens[r, n - 1]) == EOS
        out.append(Sampled(tokens[r, :n].tolist(), logps[r, :n].tolist(), "stop" if stopped else "length"))
    return out


# -- training -------------------------------------------------------------------------------------


def sequence_logprobs(model: TinyLM, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[B, T]: the logprob of ``input_ids[b, t]`` given the tokens before it (0 at t = 0), under
    softmax(logits / temperature): what ``sample`` recorded, recomputed with gradients."""
    logits = model(input_ids).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits[:, :-1], dim=-1).gather(2, input_ids[:, 1:, None])[..., 0]
    return F.pad(logp, (1, 0))


def sft_rows(tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]], max_len: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, T], loss_mask [B, T]) for supervised pairs of (prompt, completion): the mask is 1
    on the completion's characters and its ``eos``."""
    rows, masks = [], []
    for prompt, completion in pairs:
        p, c = tokenizer.prompt(prompt), [*tokenizer.encode(completion), EOS]
        row = (p + c)[:max_len]
        rows.append(row)
        masks.append(([0] * len(p) + [1] * len(c))[:max_len])
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    return ids, mask


# -- the blob -------------------------------------------------------------------------------------


def save(model: TinyLM) -> bytes:
    """The policy as bytes: what ``FarmClient.publish_policy`` sends and ``load`` reads."""
    buf = io.BytesIO()
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    torch.save({"format": FORMAT, "config": asdict(model.config), "state": state}, buf)
    return buf.getvalue()


def load(blob: bytes, device: torch.device | str = "cpu") -> TinyLM:
    """The policy in ``blob``; ``PolicyFormatError`` for anything that is not one. Never runs code from it,
    and never makes what the blob declares before checking it against what the blob holds
    (``farm_client.tinylm_blob``): torch then allocates the blob's own storages and a model of their shapes."""
    read_layout(blob)
    try:
        data: Any = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle that is not plain values, a truncated file, ...
        raise PolicyFormatError(f"not a policy torch can read safely: {type(exc).__name__}: {exc}"[:500]) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PolicyFormatError(f"the blob's format is {str(got)[:60]!r}, not {FORMAT!r}")
    config = data.get("config")
    if not isinstance(config, dict) or set(config) != set(LMConfig.__dataclass_fields__):
        raise PolicyFormatError(f"the blob's config must have exactly {sorted(LMConfig.__dataclass_fields__)}")
    state = data.get("state")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PolicyFormatError("the blob's state must map names to tensors")
    for name, tensor in state.items():
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise PolicyFormatError(f"weight {name[:60]!r} holds a NaN or infinity, or is not a floating tensor")
    # Made on the meta device (no memory, no random init) and given the loaded tensors themselves.
    with torch.device("meta"):
        model = TinyLM(LMConfig(**config))
    try:
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
    except RuntimeError as exc:  # a missing or extra weight, a wrong shape
        raise PolicyFormatError(f"the weights do not fit the config: {exc}"[:500]) from None
    return model.to(device).eval()
