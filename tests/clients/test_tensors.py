"""farm_client.tensors on hand-built records: rows, masks, padding, advantages, the skip rules, the guide's loss."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from farm_client import record
from farm_client.sequences import UntokenizedError, group_advantages, token_rows
from farm_client.tensors import TensorBatch, collate, token_logprobs

from tests.clients.openai_server import END, completion_ids, decode, logprob, prompt_ids
from tests.clients.records import GUIDE, TinyLM, loss_function_code, trajectory


def _row(batch: TensorBatch, b: int) -> tuple[list[int], list[float], list[float]]:
    """Row ``b`` without its padding: (ids, loss mask, logprobs)."""
    n = int(batch.attention_mask[b].sum())
    return batch.input_ids[b, :n].tolist(), batch.loss_mask[b, :n].tolist(), batch.logprobs[b, :n].tolist()


def test_single_turn_rows_are_prompt_then_completion_right_padded() -> None:
    long, short = trajectory(1, 10, 1.0, "a longer reply"), trajectory(2, 10, 0.0, "no")
    batch = collate([long, short], pad_id=499)

    assert batch.input_ids.dtype == torch.long and batch.loss_mask.dtype == torch.float32
    assert batch.input_ids.shape == (2, len(token_rows(long)[0]))
    for b, t in enumerate([long, short]):
        turn = t.turns[0]
        ids, mask, lps = _row(batch, b)
        assert ids == turn.prompt_token_ids + turn.token_ids
        assert mask == [0.0] * len(turn.prompt_token_ids) + [1.0] * len(turn.token_ids)
        assert lps[len(turn.prompt_token_ids):] == pytest.approx(turn.logprobs, abs=1e-6)
        assert not any(lps[:len(turn.prompt_token_ids)])
    pad = len(token_rows(long)[0]) - len(token_rows(short)[0])
    assert pad > 0
    assert batch.input_ids[1, -pad:].tolist() == [499] * pad
    assert batch.attention_mask[1, -pad:].tolist() == [0] * pad
    assert not batch.loss_mask[1, -pad:].any() and not batch.logprobs[1, -pad:].any()
    assert batch.trajectory_ids.tolist() == [1, 2] and batch.group_ids.tolist() == [10, 10]
    assert batch.policy_versions.tolist() == [3, 3] and batch.rewards.tolist() == [1.0, 0.0]
    assert not batch.per_turn.any() and not batch.truncated.any()


def test_multi_turn_is_one_row_with_observations_masked_out() -> None:
    t = trajectory(5, 1, 1.0, "ls", "cat notes", "ANSWER: 3",
                   observations=["notes\n", "OBSERVED three lines"])
    batch = collate([t])

    assert len(batch) == 1 and not batch.per_turn.any()
    ids, mask, lps = _row(batch, 0)
    # The whole conversation in template order, then the last reply.
    assert ids == prompt_ids([{"role": m.role, "content": m.content} for m in t.messages[:-1]]) \
        + completion_ids("ANSWER: 3")
    model_tokens = [i for i, m in zip(ids, mask, strict=True) if m]
    assert model_tokens == [tok for turn in t.turns for tok in turn.token_ids]
    assert decode(model_tokens) == "lscat notesANSWER: 3"
    assert model_tokens.count(END) == 3  # each reply's own end token is the model's
    fed_back = decode([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "OBSERVED three lines" in fed_back and "notes\n" in fed_back and "task 5" in fed_back
    assert [lp for lp, m in zip(lps, mask, strict=True) if m] == \
        pytest.approx([lp for turn in t.turns for lp in turn.logprobs], abs=1e-6)
    assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)


def test_a_broken_prefix_falls_back_to_one_row_per_turn() -> None:
    t = trajectory(7, 2, 1.0, "first", "second")
    # A tokenizer that re-tokenizes the first reply differently inside the second prompt.
    second = t.turns[1]
    at = len(t.turns[0].prompt_token_ids)  # where the first reply's tokens begin
    second.prompt_token_ids = [*second.prompt_token_ids[:at], 300, *second.prompt_token_ids[at + 1:]]
    other = trajectory(8, 2, 0.0, "x", "y")
    batch = collate([t, other])

    assert batch.trajectory_ids.tolist() == [7, 7, 8]
    assert batch.per_turn.tolist() == [True, True, False]
    for b, turn in enumerate(t.turns):
        ids, mask, _ = _row(batch, b)
        assert ids == turn.prompt_token_ids + turn.token_ids
        assert sum(mask) == len(turn.token_ids)
    assert batch.rewards[0] == batch.rewards[1] == 1.0
    assert batch.advantages[0] == batch.advantages[1] > 0 > batch.advantages[2]
    assert [t.id for t in batch.trajectories] == [7, 8]


def test_advantages_are_group_relative_with_population_std() -> None:
    rewards = {11: [0.0, 1.0, 1.0, 0.5], 12: [0.2, 0.8]}
    trajectories = [trajectory(100 * g + k, g, r, "r") for g, rs in rewards.items() for k, r in enumerate(rs)]
    batch = collate(trajectories, eps=1e-6)

    expected = []
    for rs in rewards.values():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs))
        expected += [(r - mean) / (std + 1e-6) for r in rs]
    assert batch.advantages.tolist() == pytest.approx(expected, abs=1e-5)
    assert batch.advantages[4:].tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert group_advantages([1.0, 1.0], [1, 1]) == [0.0, 0.0]


@pytest.mark.parametrize("rewards", [[math.nan, 1.0, 0.0], [math.inf, 0.0, 1.0], [1e308, 1e308, 0.0],
                                     [-1e308, 1e308, 5.0], [1e200, 0.0, 1.0], [1e100, 0.0, 1.0]])
def test_advantages_are_never_nan_whatever_the_rewards(rewards: list[float]) -> None:
    """Belt and braces: farmd serves no reward out of its domain, and a trainer's advantages stay finite anyway."""
    advantages = group_advantages(rewards, [1, 1, 1])
    assert all(math.isfinite(a) for a in advantages), advantages
    finite = [r for r in rewards if math.isfinite(r)]
    assert [a for a, r in zip(advantages, rewards, strict=True) if not math.isfinite(r)] == [0.0] * (3 - len(finite))
    if len(finite) == 3 and max(map(abs, finite)) <= 1e100:  # scaled, the same advantages as the formula's
        mean = sum(finite) / 3
        std = math.sqrt(sum((r - mean) ** 2 for r in finite) / 3)
        assert advantages == pytest.approx([(r - mean) / (std + 1e-6) for r in finite])
    assert group_advantages([0.0, 1.0, 0.5], [1, 1, 2]) == pytest.approx([-1.0, 1.0, 0.0], abs=1e-5)


def test_a_record_out_of_its_domain_gets_no_row() -> None:
    good = [trajectory(1, 1, 1.0, "a"), trajectory(2, 1, 0.0, "b")]
    nan_reward = trajectory(3, 1, math.nan, "c")
    nan_logprob = trajectory(4, 1, 1.0, "d")
    nan_logprob.turns[0] = dataclasses.replace(nan_logprob.turns[0], logprobs=[math.nan] * len(nan_logprob.turns[0].token_ids))
    positive = trajectory(5, 1, 1.0, "e")
    positive.turns[0] = dataclasses.replace(positive.turns[0], logprobs=[0.5] * len(positive.turns[0].token_ids))
    negative_id = trajectory(6, 1, 0.0, "f")
    negative_id.turns[0] = dataclasses.replace(negative_id.turns[0], token_ids=[-1] * len(negative_id.turns[0].token_ids))
    batch = collate([*good, nan_reward, nan_logprob, positive, negative_id])
    assert batch.trajectory_ids.tolist() == [1, 2]
    assert batch.advantages.tolist() == pytest.approx([1.0, -1.0], abs=1e-5), "they count in no group either"
    assert all("out of its domain" in batch.skipped[i] for i in (3, 4, 5, 6)), batch.skipped
    assert bool(batch.logprobs.isfinite().all())


def test_equal_reward_groups_are_skipped_only_when_asked() -> None:
    flat = [trajectory(1, 1, 1.0, "a"), trajectory(2, 1, 1.0, "b")]
    mixed = [trajectory(3, 2, 0.0, "c"), trajectory(4, 2, 1.0, "d")]

    everything = collate(flat + mixed)
    assert everything.trajectory_ids.tolist() == [1, 2, 3, 4]
    assert everything.advantages[:2].tolist() == [0.0, 0.0]

    informative = collate(flat + mixed, skip_equal_rewards=True)
    assert informative.trajectory_ids.tolist() == [3, 4]
    assert set(informative.skipped) == {1, 2} and "every reward is 1.0" in informative.skipped[1]
    assert len(collate(flat, skip_equal_rewards=True)) == 0


def test_error_verdicts_get_no_row_and_count_in_no_group() -> None:
    batch = collate([trajectory(1, 1, 1.0, "a"), trajectory(2, 1, 0.0, "b"),
                     trajectory(3, 1, 0.0, "c", status="error")])
    assert batch.trajectory_ids.tolist() == [1, 2]
    assert batch.advantages.tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
    assert "error" in batch.skipped[3]


def test_untokenized_trajectories_raise_naming_them_unless_skipped() -> None:
    good = trajectory(1, 1, 1.0, "a")
    no_logprobs = trajectory(42, 1, 0.0, "b")
    no_logprobs.turns[0] = dataclasses.replace(no_logprobs.turns[0], logprobs=[], has_logprobs=False)
    scripted = dataclasses.replace(trajectory(43, 1, 0.0, "c"), turns=[])
    no_prompt = trajectory(44, 1, 0.0, "d")
    no_prompt.turns[0].prompt_token_ids = []

    for bad, why in [(no_logprobs, "no logprobs"), (scripted, "no model turns"),
                     (no_prompt, "no prompt_token_ids")]:
        with pytest.raises(UntokenizedError, match=rf"trajectory {bad.id} .*{why}.*skip_untokenized=True"):
            collate([good, bad])
    batch = collate([good, no_logprobs, scripted, no_prompt], skip_untokenized=True)
    assert batch.trajectory_ids.tolist() == [1]
    assert set(batch.skipped) == {42, 43, 44}
    # The skipped ones were still scores of the group: the one kept is above their mean.
    assert batch.advantages.tolist() == pytest.approx([math.sqrt(3)], abs=1e-4)


def test_max_length_truncates_and_masks_or_drops() -> None:
    long, short = trajectory(1, 1, 1.0, "x" * 40), trajectory(2, 1, 0.0, "y")
    prompt = len(long.turns[0].prompt_token_ids)
    limit = prompt + 10

    cut = collate([long, short], max_length=limit)
    assert cut.input_ids.shape[1] == limit
    assert cut.truncated.tolist() == [True, False]
    ids, mask, lps = _row(cut, 0)
    assert ids == (long.turns[0].prompt_token_ids + long.turns[0].token_ids)[:limit]
    assert sum(mask) == 10 and lps[-1] == pytest.approx(logprob(9, ord("x")))

    dropped = collate([long, short], max_length=limit, overflow="drop")
    assert dropped.trajectory_ids.tolist() == [2] and "max_length" in dropped.skipped[1]
    assert dropped.advantages.tolist() == pytest.approx([-1.0], abs=1e-5)  # computed with the dropped one

    inside_prompt = collate([long], max_length=prompt - 1)
    assert len(inside_prompt) == 0 and 1 in inside_prompt.skipped
    with pytest.raises(ValueError, match="overflow"):
        collate([long], max_length=8, overflow="wrap")  # type: ignore[arg-type]


def test_token_logprobs_are_aligned_with_the_stored_logprobs() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    out = token_logprobs(logits, ids)

    assert out.shape == ids.shape and out[:, 0].tolist() == [0.0, 0.0]
    expected = torch.log_softmax(logits[1, 2], -1)[ids[1, 3]]
    assert out[1, 3].item() == pytest.approx(expected.item(), abs=1e-6)
    hot = token_logprobs(logits, ids, temperature=0.5)
    assert hot[1, 3].item() == pytest.approx(torch.log_softmax(logits[1, 2] / 0.5, -1)[ids[1, 3]].item(), abs=1e-6)


def test_the_readme_loss_runs_and_is_the_policy_gradient() -> None:
    scope: dict[str, object] = {}
    exec(compile(loss_function_code(), str(GUIDE), "exec"), scope)
    grpo_loss = scope["grpo_loss"]
    batch = collate([trajectory(1, 1, 1.0, "good", "done"), trajectory(2, 1, 0.0, "bad"),
                     trajectory(3, 2, 0.0, "meh"), trajectory(4, 2, 0.5, "ok")])
    model = TinyLM()

    loss = grpo_loss(model, batch)  # type: ignore[operator]
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0

    # Sampled by the policy being trained (ratio 1): the loss is minus the token-mean advantage.
    with torch.no_grad():
        on_policy = token_logprobs(model(batch.input_ids).logits, batch.input_ids) * batch.loss_mask
    same = dataclasses.replace(batch, logprobs=on_policy)
    expected = -(batch.advantages[:, None] * batch.loss_mask).sum() / batch.loss_mask.sum()
    assert grpo_loss(model, same).item() == pytest.approx(expected.item(), abs=1e-5)  # type: ignore[operator]


def test_the_trainers_guide_documents_every_field_of_the_record() -> None:
    text = GUIDE.read_text()
    section = text[text.index("### The trajectory record"):]
    section = section[:section.index("\n## ")]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))
    for cls in (record.Trajectory, record.Turn, record.ChatMessage, record.PosedTask, record.SamplingParams,
                record.Step, record.Score, record.Usage, record.Timings):
        missing = {f.name for f in dataclasses.fields(cls)} - documented
        assert not missing, f"the trainer's guide's record tables lack {cls.__name__}.{sorted(missing)}"
