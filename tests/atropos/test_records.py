"""A pushed Atropos group as farm trajectories: faithful where the record can say it, bounded where not."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from farm_client.sequences import token_rows

from farmd.atropos import records
from farmd.atropos.groups import scored_group
from farmd.atropos.records import as_trajectories, env_name, is_atropos_env
from farmd.records import MAX_DETAILS_CHARS, MAX_TOKEN_ENTRIES


def group(tokens: list[int], masks: list[int], **extra: Any) -> dict[str, Any]:
    return {"tokens": [tokens], "masks": [masks], "scores": [0.5], "advantages": None, "ref_logprobs": None,
            "inference_logprobs": None, "messages": None, "generation_params": None, "overrides": None,
            "group_overrides": None, **extra}


def test_trained_runs_become_turns_that_give_the_sequence_back() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11]
    masks = [-100, 6, 7, -100, -100, 10, -100]
    (t,) = as_trajectories(group(tokens, masks, inference_logprobs=[[1.0, -0.1, -0.2, 1.0, 1.0, -0.3, 1.0]]))
    assert [(x.prompt_token_ids, x.token_ids, x.logprobs) for x in t.turns] == [
        ([5], [6, 7], [-0.1, -0.2]), ([5, 6, 7, 8, 9], [10], [-0.3])]
    (row,) = token_rows(t)
    assert row.input_ids == tokens[:6] and row.loss_mask == [0, 1, 1, 0, 0, 1], "the trailing prompt token has no turn"
    assert "masks" not in t.verdict_details["atropos"], "the turns say them"


def test_masks_the_turns_cannot_say_are_kept_in_the_details() -> None:
    (t,) = as_trajectories(group([5, 6, 7], [-100, 1, 2]))  # trained, but not on the tokens themselves
    assert t.verdict_details["atropos"]["masks"] == [-100, 1, 2]


def test_a_long_sequence_of_many_runs_is_one_turn_not_millions_of_prompt_ids() -> None:
    n = MAX_TOKEN_ENTRIES
    tokens = list(range(1000, 1000 + n))
    masks = [tok if (j // 3) % 2 else -100 for j, tok in enumerate(tokens)]  # a new run every 3 tokens
    (t,) = as_trajectories(group(tokens, masks))
    assert len(t.turns) == 1 and t.turns[0].prompt_token_ids == tokens[:3] and t.turns[0].token_ids == tokens[3:]
    assert "truncated" not in t.flags
    assert t.verdict_details["atropos"]["per_token"].startswith("over the record's bound"), "masks too long to keep"


def test_names_are_made_safe_and_recognised() -> None:
    assert env_name("gsm8k/v2 <b>") == "atropos:gsm8k_v2__b_" and env_name(None) == "atropos"
    assert is_atropos_env(env_name("x" * 500)) and is_atropos_env("atropos")
    assert not is_atropos_env("atropos:a b") and not is_atropos_env("arith") and not is_atropos_env("atropos:")


def test_a_few_runs_whose_prompts_would_pass_the_budget_are_one_turn_too() -> None:
    n = MAX_TOKEN_ENTRIES // 2
    tokens = list(range(1000, 1000 + n))
    masks = [tok if (j * 10 // n) % 2 else -100 for j, tok in enumerate(tokens)]  # 5 runs, 3 n ids as turns
    (t,) = as_trajectories(group(tokens, masks))
    assert len(t.turns) == 1 and "truncated" not in t.flags and "per_token" in t.verdict_details["atropos"]


def _checked(n: int, length: int = 40, **extra: Any) -> dict[str, Any]:
    """A group of ``n`` sequences as ``scored_group`` hands it on: per-token rows, some sequences' masks not their
    tokens, some logprobs not one per token."""
    rng = random.Random(n * 1000 + length)
    tokens = [[rng.randrange(50_000) for _ in range(length)] for _ in range(n)]
    masks = [[-100] * (length // 4) + t[length // 4:] for t in tokens]
    masks[-1][-1] = 7  # trained, not on its token: the turns cannot say it
    logprobs = [[1.0] * (length // 4) + [-rng.random() for _ in range(length - length // 4)] for _ in range(n)]
    logprobs[0] = logprobs[0][:-1]  # not one per token: kept in the details as sent
    raw = {"tokens": tokens, "masks": masks, "scores": [rng.choice([-1.0, 0.0, 0.5, 1.0]) for _ in range(n)],
           "advantages": [[rng.uniform(-1, 1)] * length for _ in range(n)], "inference_logprobs": logprobs, **extra}
    return scored_group(raw)


def test_plain_sequences_made_from_one_seal_are_the_records_sealed_one_by_one(monkeypatch: pytest.MonkeyPatch,
                                                                            ) -> None:
    """The records of a group's plain sequences are made from one sealed record (``_like``); each must be what
    sealing it on its own makes, whatever else the group holds: conversations for some, overrides, text to
    repair, details at the seal's bound (a longer index would pass it), a sequence past the token budget."""
    at_bound = MAX_DETAILS_CHARS - len(json.dumps({"atropos": {"index": 0, "generation_params": {"x": ""}}}))
    cases = [
        _checked(12, generation_params={"temperature": 1.0}, group_overrides={"note": "é\u2028"}),
        _checked(12, messages=[[{"role": "user", "content": "hi"}] if i % 3 == 0 else [] for i in range(12)]),
        _checked(5, overrides=[{"set_advantage_to_zero": i == 2} for i in range(5)]),
        _checked(4, generation_params=json.loads('{"s": "\\ud800 a lone surrogate"}')),
        *(_checked(12, generation_params={"x": "a" * (at_bound - slack)}) for slack in (-1, 0, 1, 5, 8, 9, 20)),
        {**_checked(3), "tokens": [list(range(MAX_TOKEN_ENTRIES // 2 + 10)), *_checked(3)["tokens"][1:]],
         "masks": [list(range(MAX_TOKEN_ENTRIES // 2 + 10)), *_checked(3)["masks"][1:]],
         "inference_logprobs": [[-0.5] * (MAX_TOKEN_ENTRIES // 2 + 10), *_checked(3)["inference_logprobs"][1:]]},
    ]
    made = [as_trajectories(g) for g in cases]
    monkeypatch.setattr(records, "_plain", lambda *_: False)  # every record sealed on its own
    for case, got in zip(cases, made, strict=True):
        assert got == as_trajectories(case)
    at_zero = made[4 + 1]  # details exactly at the bound with a one-digit index: over it with two
    assert ["truncated" in t.flags for t in at_zero] == [False] * 10 + [True] * 2
    assert "truncated" in made[-1][0].flags and "invalid_text" in made[3][0].flags


def test_trained_runs_are_found_whatever_the_masks_shape() -> None:
    def walked(masks: list[int]) -> list[tuple[int, int]]:
        trained = [j for j, m in enumerate(masks) if m != -100]
        return [(a, b + 1) for a, b in zip([t for t in trained if t - 1 not in trained],
                                           [t for t in trained if t + 1 not in trained], strict=True)]

    rng = random.Random(7)
    for _ in range(3000):
        masks = [rng.choice([-100, -100, 0, 5, -1]) for _ in range(rng.randrange(12))]
        assert records._trained_runs(masks) == walked(masks), masks
