"""A trajectory's model turns as token sequences a trainer can compute a loss on. Pure Python, no torch.

One row is ``input_ids`` with a ``loss_mask`` that is 1 exactly on tokens the model produced (every turn's
completion tokens) and 0 on everything else (the prompt, observations and tool results the farm fed back,
chat-template tokens between turns), and ``logprobs``, the sampling logprob of each model token at its
position (0 where the mask is 0).

A multi-turn trajectory becomes one row when the chat-template prefix property holds: each turn's
``prompt_token_ids`` starts with the previous turn's prompt and completion tokens, as it does when the
server tokenizes the conversation with the same template and the model's reply comes back unchanged.
The row is turn 0's prompt and completion, then for each later turn only what its prompt adds (mask 0)
and its completion (mask 1). When the property fails for any turn (a tokenizer that merges across the
reply's end, a reply the farm clipped or repaired, a template that drops earlier reasoning), the
trajectory becomes one row per turn, each the turn's own prompt and completion: the model's tokens are
still each trained on once, just not in one sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from farm_client.record import Trajectory, Turn

DEFAULT_EPS = 1e-6


class UntokenizedError(ValueError):
    """A trajectory lacks what a loss needs: token ids or sampling logprobs of its model turns."""

    def __init__(self, trajectory: Trajectory, why: str) -> None:
        super().__init__(
            f"trajectory {trajectory.id} (env {trajectory.env}, agent {trajectory.agent}): {why}; a loss needs "
            "the prompt's and completion's token ids and the sampling logprobs, as vLLM returns them with "
            "logprobs and return_token_ids. Pass skip_untokenized=True to leave such trajectories out.")
        self.trajectory_id = trajectory.id


@dataclass(frozen=True, slots=True)
class TokenRow:
    """One sequence of a trajectory: what becomes one row of a batch."""

    input_ids: list[int]
    loss_mask: list[int]
    """1 on the model's own tokens, 0 elsewhere."""
    logprobs: list[float]
    """Sampling logprob of ``input_ids[i]`` at ``i`` where ``loss_mask[i]`` is 1; 0.0 elsewhere."""
    turns: tuple[int, ...]
    """Indices into the trajectory's ``turns`` that this row holds (all of them, or one in the fallback)."""

    def __len__(self) -> int:
        return len(self.input_ids)


def _check_turn(trajectory: Trajectory, index: int, turn: Turn) -> None:
    missing = [name for name, present in (("prompt_token_ids", turn.prompt_token_ids),
                                          ("token_ids", turn.token_ids),
                                          ("logprobs", turn.has_logprobs)) if not present]
    if missing:
        raise UntokenizedError(trajectory, f"turn {index} has no {' or '.join(missing)} (its model server "
                                           "returned none)")
    if len(turn.logprobs) != len(turn.token_ids):
        raise UntokenizedError(trajectory, f"turn {index} has {len(turn.token_ids)} token ids but "
                                           f"{len(turn.logprobs)} logprobs")


def check_tokens(trajectory: Trajectory) -> None:
    """Raise ``UntokenizedError`` (naming the trajectory) unless every model turn carries its tokens."""
    if not trajectory.turns:
        raise UntokenizedError(trajectory, "it has no model turns (a scripted agent, or no reply recorded)")
    for index, turn in enumerate(trajectory.turns):
        _check_turn(trajectory, index, turn)


def _turn_row(index: int, turn: Turn) -> TokenRow:
    prompt = list(turn.prompt_token_ids)
    return TokenRow(input_ids=prompt + list(turn.token_ids),
                    loss_mask=[0] * len(prompt) + [1] * len(turn.token_ids),
                    logprobs=[0.0] * len(prompt) + list(turn.logprobs), turns=(index,))


def token_rows(trajectory: Trajectory) -> list[TokenRow]:
    """The trajectory as one row (the prefix property holds) or one row per turn (it does not).

    Raises ``UntokenizedError`` when a turn lacks token ids or logprobs.
    """
    check_tokens(trajectory)
    turns = trajectory.turns
    first = _turn_row(0, turns[0])
    ids, mask, logprobs = list(first.input_ids), list(first.loss_mask), list(first.logprobs)
    for turn in turns[1:]:
        prompt = turn.prompt_token_ids
        if len(prompt) < len(ids) or prompt[:len(ids)] != ids:
            return [_turn_row(i, t) for i, t in enumerate(turns)]
        added = len(prompt) - len(ids)
        ids += list(prompt[len(ids):]) + list(turn.token_ids)
        mask += [0] * added + [1] * len(turn.token_ids)
        logprobs += [0.0] * added + list(turn.logprobs)
    return [TokenRow(input_ids=ids, loss_mask=mask, logprobs=logprobs, turns=tuple(range(len(turns))))]


def group_advantages(rewards: Sequence[float], group_ids: Sequence[int],
                     eps: float = DEFAULT_EPS) -> list[float]:
    """GRPO's group-relative advantage of each reward: ``(r - mean(g)) / (std(g) + eps)``.

    ``g`` is the rewards of the same group; ``std`` is the population standard deviation (divided by the
    group's size, not size - 1), so a group whose rewards are all equal has advantages of exactly 0.

    Never NaN or infinite, whatever it is given: a reward that is not finite (no farm serves one) gets 0 and
    counts for nothing in its group's mean and spread, and a group with a reward past 1 in magnitude is
    computed scaled down by its largest, so squaring never overflows (the same advantages, to rounding).
    """
    by_group: dict[int, list[float]] = {}
    for reward, group in zip(rewards, group_ids, strict=True):
        if math.isfinite(reward):
            by_group.setdefault(group, []).append(reward)
    stats: dict[int, tuple[float, float, float]] = {}
    for group, values in by_group.items():
        scale = max(1.0, max(abs(v) for v in values))
        scaled = values if scale == 1.0 else [v / scale for v in values]
        mean = sum(scaled) / len(scaled)
        stats[group] = (scale, mean, (sum((v - mean) ** 2 for v in scaled) / len(scaled)) ** 0.5)
    out = []
    for r, g in zip(rewards, group_ids, strict=True):
        if not math.isfinite(r):
            out.append(0.0)
            continue
        scale, mean, std = stats[g]
        out.append((r - mean) / (std + eps) if scale == 1.0 else (r / scale - mean) / (std + eps / scale))
    return out


TOKEN_ID_BOUND = 1 << 31
"""Token ids a loss can index with are below this (int32); farmd holds every record it serves to the same."""
LOGPROB_SLACK = 1e-3
"""A sampling logprob reads at most this far above 0 (float rounding of a probability near 1; farmd's bound)."""


def out_of_domain(trajectory: Trajectory) -> str | None:
    """Why ``trajectory``'s numbers cannot go into a loss, or None: a reward that is not finite, a token id
    negative or past int32, a logprob NaN, infinite or above 0. farmd checks every record it stores and serves
    (an unreadable one comes as a stub with an error verdict); this is the trainer's own guard."""
    if not math.isfinite(trajectory.reward):
        return f"its reward is {trajectory.reward}"
    for index, turn in enumerate(trajectory.turns):
        for name in ("prompt_token_ids", "token_ids"):
            ids = getattr(turn, name)
            if ids and (min(ids) < 0 or max(ids) >= TOKEN_ID_BOUND):
                return f"turn {index}'s {name} holds an id outside [0, 2**31)"
        logprobs = turn.logprobs
        if logprobs and not (math.isfinite(sum(logprobs)) and max(logprobs) <= LOGPROB_SLACK):
            return f"turn {index}'s logprobs hold one that is not finite or is above 0"
    return None


def equal_reward_groups(trajectories: Iterable[Trajectory]) -> set[int]:
    """Groups whose rewards are all the same: no learning signal under a group-relative advantage."""
    seen: dict[int, set[float]] = {}
    for t in trajectories:
        seen.setdefault(t.group_id, set()).add(t.reward)
    return {group for group, rewards in seen.items() if len(rewards) == 1}
