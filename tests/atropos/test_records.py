"""A pushed Atropos group as farm trajectories: faithful where the record can say it, bounded where not."""

from __future__ import annotations

from typing import Any

from farm_client.sequences import token_rows

from farmd.atropos.records import as_trajectories, env_name, is_atropos_env
from farmd.records import MAX_TOKEN_ENTRIES


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
