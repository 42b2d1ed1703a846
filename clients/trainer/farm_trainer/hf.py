"""A Hugging Face causal LM for the loop an inference server samples: built here, learned by GRPO, synced as weights.

``build_model(DIR)`` writes a small Llama-architecture model with random weights and its tokenizer, made on this
machine with ``transformers`` and ``tokenizers`` (nothing is downloaded): a byte-level BPE trained on chain sums
and a few lines of English, every digit its own token (``Digits(individual_digits=True)``: a number's digits
are what a chain sum is learned from, and a merge of ``17`` into one token would hide them), and a chat template
that renders the last user message's first line after ``<s>`` (``arith`` poses ``4-1+5=`` and then its answer
format: a model of this size reads the expression, not the English). vLLM serves the directory as it is; the
trainer loads the same one.

The CPU attention of vLLM needs a head dimension of at least 32 (16 starts, then its first request kills the
engine): hidden 128 with 4 heads.

``HFPolicy`` is what the trainer holds: the model, its tokenizer, the log-probabilities the GRPO loss takes
(``token_logprobs``, the layout of ``farm_client.tensors``), supervised rows for the warm-up, and the weights
as safetensors bytes (``weights``): what is published to the farm, which writes them where its inference
servers reload them from.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from farm_client.tensors import token_logprobs

__all__ = ["CHAT_TEMPLATE", "HFPolicy", "ModelSizes", "build_model", "weights_format"]

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TEMPLATE = (
    "{%- set ns = namespace(text='') -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set ns.text = (m['content'] if m['content'] is string else '').split('\n')[0] -%}"
    "{%- endif -%}{%- endfor -%}"
    "{{ bos_token }}{{ ns.text }}"
)
"""The last user message's first line after ``<s>``: what the model reads of a conversation. Nothing follows for
the generation prompt: the answer comes straight after the ``=``, then ``</s>``."""
WEIGHTS_FORMAT = "safetensors"


def weights_format() -> str:
    return WEIGHTS_FORMAT


@dataclass(frozen=True)
class ModelSizes:
    hidden: int = 128
    heads: int = 4
    """head_dim = hidden / heads: at least 32 for vLLM's CPU attention."""
    layers: int = 2
    intermediate: int = 512
    vocab: int = 320
    max_len: int = 512

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.hidden // self.heads < 32:
            raise ValueError(f"head_dim {self.hidden}/{self.heads} must be a whole number of at least 32 "
                             "(vLLM's CPU attention refuses less)")


def _corpus(lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        terms = rng.randint(3, 5)
        digits = rng.choice((1, 1, 2))
        parts = [str(rng.randrange(10 ** digits))]
        for _ in range(terms - 1):
            parts += [rng.choice("+-"), str(rng.randrange(10 ** digits))]
        out.append("".join(parts) + "=" + str(rng.randrange(-200, 200)))
    out += ["only the exact integer value, in ASCII digits with a leading '-' if it is negative",
            "You solve tasks carefully. Think as much as you need, then give your submission exactly in the form",
            "the task asks for. Reply with the complete answer and nothing else."] * 20
    return out


def build_tokenizer(out: Path, vocab: int = 320, seed: int = 0) -> Any:
    """A byte-level BPE of ``vocab`` tokens trained on a small generated corpus, saved to ``out`` as a
    ``PreTrainedTokenizerFast`` with ``CHAT_TEMPLATE``; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[PAD, BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(400, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=512)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, sizes: ModelSizes | None = None, seed: int = 0) -> Path:
    """A Llama-architecture model with random weights (``seed``) and its tokenizer, saved to ``out``: a directory
    vLLM serves and ``HFPolicy.load`` reads. Returns ``out``."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    sizes = sizes or ModelSizes()
    tok = build_tokenizer(out, sizes.vocab, seed)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
                         num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
                         num_key_value_heads=sizes.heads, max_position_embeddings=sizes.max_len,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    generation = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    generation.save_pretrained(str(out))
    (out / "farm-model.json").write_text(json.dumps({"sizes": sizes.__dict__, "seed": seed}) + "\n")
    return out


class HFPolicy:
    """A causal LM and its tokenizer, on the CPU or a GPU, as the trainer uses them."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id)

    @classmethod
    def load(cls, directory: Path, device: torch.device | str = "cpu") -> HFPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
        model.to(torch.device(device))  # type: ignore[arg-type]
        return cls(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return torch.device(next(self.model.parameters()).device)

    def parameters(self) -> Any:
        return self.model.parameters()

    def sequence_logprobs(self, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """[B, T]: the logprob of each token given those before it (0 at t = 0), with gradients. Rows are
        right-padded, and attention is causal: padding after a row's tokens changes none of theirs."""
        logits = self.model(input_ids=input_ids.to(self.device)).logits
        return token_logprobs(logits, input_ids.to(self.device), temperature)

    def prompt_ids(self, prompt: str) -> list[int]:
        """A task's prompt as the server renders it: the chat template over the user message alone (the template
        reads nothing else of a conversation)."""
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def answer_ids(self, answer: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(answer, add_special_tokens=False)] + [self.eos_id]

    def sft_rows(self, pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids [B, T], loss_mask [B, T]) for (prompt, answer) pairs: the mask is 1 on the answer's tokens
        and its ``</s>``."""
        rows, masks = [], []
        for prompt, answer in pairs:
            p, a = self.prompt_ids(prompt), self.answer_ids(answer)
            rows.append(p + a)
            masks.append([0] * len(p) + [1] * len(a))
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
        return ids, mask

    @torch.no_grad()
    def greedy_accuracy(self, pairs: Sequence[tuple[str, str]]) -> float:
        """The share of pairs whose greedy completion is exactly the answer and ``</s>``: with teacher forcing,
        every answer token the argmax given the right tokens before it (what greedy decoding would produce,
        token by token), in one forward pass."""
        if not pairs:
            return 0.0
        self.model.eval()
        ids, mask = self.sft_rows(pairs)
        logits = self.model(input_ids=ids.to(self.device)).logits[:, :-1]
        predicted = torch.nn.functional.pad(logits.argmax(-1), (1, 0)).cpu()
        right = ((predicted == ids) | (mask == 0)).all(dim=1)
        return float(right.float().mean())

    def weights(self) -> bytes:
        """The model's weights as one safetensors file, named as ``save_pretrained`` names them: what a server
        reloads (``reload_weights`` from a directory holding it)."""
        from safetensors.torch import save

        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        return bytes(save(state, metadata={"format": "pt"}))
