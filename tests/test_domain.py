"""The domain checker (``farmd/domain.py``): every number of a record named when it is out of its domain, and the
bounds it keeps measured against the readers they protect (protobuf's decoder, the wire's widths)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from farm.v1 import farm_pb2, trajectory_pb2
from farm_client.convert import from_message, to_message

from farmd import domain
from farmd.errors import OutOfDomain
from farmd.records import PosedTask, SamplingParams, Score, Step, Timings, Trajectory, Turn, Usage


def good(**changes: Any) -> Trajectory:
    t = Trajectory(id=7, group_id=3, env="arith", env_version="1", seed=11, difficulty=2, agent="torch:tiny",
                   policy_version=4, reward=1.0, passed=True, status="ok", reasons=["right"], flags=[],
                   verifier_version="1", verdict_details={"tests": [{"ok": True, "ms": 1.5}]},
                   task=PosedTask(prompt="1+2=", examples=[{"input": [1, 2], "output": 3}], metadata={"level": 1}),
                   turns=[Turn(message_index=1, prompt_messages=1, completion="3", prompt_token_ids=[1, 2, 3],
                               token_ids=[4, 5], logprobs=[-0.5, -0.0], has_logprobs=True, latency=0.25,
                               usage=Usage(3, 2, 5, 1, 0))],
                   sampling=SamplingParams(model="m", temperature=1.0, seed=-5, extra={"top_k": 20}),
                   steps=[Step(exit_code=-9, duration=0.5)], timings=Timings(0.1, 0.2, 0.3, 0.6),
                   started_at=1_700_000_000.0, finished_at=1_700_000_001.0)
    return replace(t, **changes)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth - 1):
        value = {"a": value}
    return {"a": value} if depth else value


def wire(t: Trajectory) -> Trajectory:
    """Through a stream message and back, as a trainer reads it."""
    message = farm_pb2.StreamTrajectoriesResponse(trajectories=[to_message(t, trajectory_pb2.Trajectory())])
    (back,) = farm_pb2.StreamTrajectoriesResponse.FromString(message.SerializeToString()).trajectories
    return from_message(back, Trajectory)


def test_a_record_in_its_domain_has_no_problems_and_travels() -> None:
    t = good()
    assert domain.problems(t) == [] and domain.check(t) is t
    assert wire(t).turns[0].token_ids == [4, 5]


@pytest.mark.parametrize(("change", "named"), [
    ({"reward": math.nan}, "the reward is nan"),
    ({"reward": math.inf}, "the reward is inf"),
    ({"reward": 1.5}, "outside 0..1"),
    ({"reward": -0.25}, "outside 0..1"),
    ({"reward": None}, "not a number"),
    ({"reward": True}, "not a number"),
    ({"reward": 0.0, "passed": True}, "a pass is rewarded"),
    ({"status": "error", "passed": False, "reward": 0.5}, "an error verdict is no score"),
    ({"passed": "yes"}, "passed is 'yes'"),
    ({"seed": 1 << 63}, "seed is 9223372036854775808"),
    ({"seed": 1e19}, "seed is 1e+19, not an integer"),
    ({"difficulty": -1}, "difficulty is -1"),
    ({"difficulty": 1 << 32}, "difficulty is 4294967296"),
    ({"policy_version": -1}, "policy_version is -1"),
    ({"id": 1 << 64}, "id is 18446744073709551616"),
    ({"finished_at": math.nan}, "finished_at is nan"),
    ({"finished_at": 1e20}, "finished_at is 1e+20"),
    ({"started_at": -5.0}, "started_at is -5.0"),
    ({"timings": Timings(total=math.inf)}, "timings.total is inf"),
    ({"usage": Usage(requests=-1)}, "usage.requests is -1"),
    ({"steps": [Step(exit_code=1 << 31)]}, "steps[0].exit_code is 2147483648"),
    ({"steps": [Step(duration=-1.0)]}, "steps[0].duration is -1.0"),
    ({"sampling": SamplingParams(temperature=math.nan)}, "sampling.temperature is nan"),
    ({"sampling": SamplingParams(seed=1 << 64)}, "sampling.seed is 18446744073709551616"),
    ({"sampling": SamplingParams(extra={"x": [math.inf]})}, "sampling.extra.x[0] is inf"),
    ({"verdict_details": {"a": 10 ** 400}}, "verdict_details.a is an integer past int64"),
    ({"verdict_details": {"a": 1 << 63}}, "verdict_details.a is an integer past int64"),
    ({"verdict_details": {1: 2}}, "has a key 1 that is not text"),
    ({"verdict_details": {"a": b"x"}}, "verdict_details.a is a bytes"),
    ({"verdict_details": nested(150)}, "nested more than 16 deep"),
    ({"task": PosedTask(metadata=nested(17))}, "task.metadata is nested more than 16 deep"),
    ({"task": PosedTask(examples=[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]])}, "task.examples is nested more than 16 deep"),
    ({"task": PosedTask(examples=[{"x": math.nan}])}, "task.examples[0].x is nan"),
    ({"scores": [Score(reward=math.nan)]}, "the reward is nan"),
    ({"verdict_version": -1}, "verdict_version is -1"),
    ({"scores": [Score(verdict_version=1 << 63)]}, "scores[0].verdict_version is 9223372036854775808"),
])
def test_each_number_out_of_its_domain_is_named(change: dict[str, Any], named: str) -> None:
    found = domain.problems(good(**change))
    assert found and any(named in p for p in found), found
    with pytest.raises(OutOfDomain) as refused:
        domain.check(good(**change))
    assert refused.value.problems == found and refused.value.reason == "OUT_OF_DOMAIN"


@pytest.mark.parametrize(("turn", "named"), [
    (Turn(token_ids=[-1]), "turns[0].token_ids[0] is -1"),
    (Turn(token_ids=[3, 1 << 31]), "turns[0].token_ids[1] is 2147483648"),
    (Turn(prompt_token_ids=[1 << 40]), "turns[0].prompt_token_ids[0] is 1099511627776"),
    (Turn(token_ids=[1.0]), "not an integer"),  # type: ignore[list-item]
    (Turn(token_ids=[True]), "not an integer"),
    (Turn(token_ids=[1], logprobs=[False], has_logprobs=True), "turns[0].logprobs[0]"),
    (Turn(token_ids=[1], logprobs=[math.nan], has_logprobs=True), "turns[0].logprobs[0] is nan"),
    (Turn(token_ids=[1], logprobs=[-math.inf], has_logprobs=True), "turns[0].logprobs[0] is -inf"),
    (Turn(token_ids=[1], logprobs=[0.5], has_logprobs=True), "a sampled token's logprob is at most 0"),
    (Turn(token_ids=[1], logprobs=[-1e39], has_logprobs=True), "turns[0].logprobs[0] is -1e+39"),
    (Turn(token_ids=[1], logprobs=[-0.5], has_logprobs=False), "says it has no logprobs but carries 1"),
    (Turn(token_ids=[1, 2], logprobs=[-0.5], has_logprobs=True), "has 2 token ids and 1 logprobs"),
    (Turn(message_index=-1), "turns[0].message_index is -1"),
    (Turn(latency=1e20), "turns[0].latency is 1e+20"),
    (Turn(usage=Usage(total_tokens=1 << 63)), "turns[0].usage.total_tokens"),
])
def test_each_turn_out_of_its_domain_is_named(turn: Turn, named: str) -> None:
    found = domain.problems(good(turns=[turn]))
    assert any(named in p for p in found), found


def test_a_verdict_s_own_figures_may_hold_an_infinity() -> None:
    """A kernel verdict's speedup interval is open-ended with too few rounds: readers carry it, so it is no jam."""
    t = good(verdict_details={"speedup_interval": [0.0, math.inf], "ratio": math.nan})
    assert domain.problems(t) == []
    assert wire(t).verdict_details["speedup_interval"] == [0.0, math.inf]
    assert domain.problems(good(task=PosedTask(metadata={"x": math.inf})))


def test_a_known_vocabulary_bounds_token_ids() -> None:
    t = good(turns=[Turn(prompt_token_ids=[1, 2], token_ids=[15, 16], logprobs=[-1.0, -1.0], has_logprobs=True)])
    assert domain.problems(t) == []
    assert domain.problems(t, vocab=16) == ["turns[0].token_ids[1] is 16, outside 0..15 (the vocabulary has 16 tokens)"]
    # What a coordinator asks of a node's record it checked whole already: the same words, for the ids alone.
    assert domain.outside_vocab(t, 16) == domain.problems(t, vocab=16)
    assert domain.outside_vocab(t, 17) == [] and domain.outside_vocab(t, 2) == [
        "turns[0].prompt_token_ids[1] is 2, outside 0..1 (the vocabulary has 2 tokens)",
        "turns[0].token_ids[0] is 15, outside 0..1 (the vocabulary has 2 tokens)"]


def test_lists_of_any_kind_are_checked_whole() -> None:
    """The C check takes lists; a tuple, an array or a list of integers where floats go is walked or taken alike."""
    from array import array

    assert domain.bad_token_id((0, 5, domain.TOKEN_ID_BOUND - 1)) is None
    assert domain.bad_token_id(array("I", [0, 5])) is None
    assert domain.bad_token_id((0, -5)) == (1, "is -5, outside 0..2147483647")
    assert domain.bad_logprob((-1, -0.5)) is None and domain.bad_logprob(array("d", [-1.0])) is None
    assert domain.bad_logprob((-1.0, math.nan))[0] == 1  # type: ignore[index]


def test_float_noise_above_zero_is_a_logprob_of_zero_and_more_is_not() -> None:
    assert domain.bad_logprob([-0.0, 0.0, 2.0 ** -10, domain.LOGPROB_SLACK]) is None
    assert domain.bad_logprob([-1.0, domain.LOGPROB_SLACK * 2]) is not None


def test_an_outside_score_has_atropos_s_domain_and_a_farm_verdict_has_farm_s() -> None:
    pushed = good(reward=-1.0, passed=False, flags=["external_score"])
    assert domain.problems(pushed) == [], "Atropos scores 1.0 right, -1.0 wrong"
    assert domain.problems(pushed, external=False), "a node's verdict is never an outside score"
    assert domain.problems(good(reward=2e6, flags=["external_score"]))


def test_the_depth_bound_is_half_what_protobuf_decodes() -> None:
    """Measured where a tree is deepest in a record: task metadata, in a stream message."""
    at_bound = good(task=PosedTask(metadata=nested(domain.MAX_JSON_DEPTH)))
    assert domain.problems(at_bound) == [] and wire(at_bound).task.metadata == nested(domain.MAX_JSON_DEPTH)
    decodes = max(d for d in range(1, 60) if _decodes(good(task=PosedTask(metadata=nested(d)))))
    assert decodes >= 2 * domain.MAX_JSON_DEPTH - 2 and decodes < 40, decodes


def _decodes(t: Trajectory) -> bool:
    try:
        wire(t)
    except Exception:
        return False
    return True


def test_a_tree_of_any_depth_is_refused_without_recursion() -> None:
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    assert "nested more than 16 deep" in (domain.tree_problem(deep, "x") or "")


class _Text(str):
    pass


def _tree(rng: random.Random, depth: int) -> Any:
    leaves = [0, -1, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, 1.5, -0.0, math.inf, -math.inf, math.nan, True,
              None, "x", _Text("y"), b"z", {1, 2}, 7j]
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        return rng.choice(leaves) if rng.random() < 0.3 else rng.choice(leaves[:9])
    if roll < 0.5:
        return [rng.choice([1, 2, 3.5, math.nan, 2**63]) for _ in range(rng.randint(0, 4))]
    items = [_tree(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if roll < 0.75:
        return items if rng.random() < 0.8 else tuple(items)
    keys = [rng.choice(["a", "b", "c", _Text("d")]) if rng.random() < 0.95 else rng.choice([1, None]) for _ in items]
    return dict(zip(keys, items, strict=True))


def test_the_quick_look_at_a_tree_takes_only_what_the_walk_takes() -> None:
    """``tree_problem`` looks at a tree quickly first and walks it, naming the place, only when that look refuses:
    the look must never take a tree the walk refuses (the domain's last word), at any depth or with any leaf."""
    rng = random.Random(5)
    taken = 0
    for _ in range(4000):
        tree, depth, finite = _tree(rng, rng.randint(0, 20)), rng.choice([2, 4, 16]), rng.random() < 0.7
        quick = domain._tree_fine(tree, depth, finite)
        stack_walk = domain._walk_tree(tree, "t", depth, finite)
        assert not quick or stack_walk is None, (tree, depth, finite, stack_walk)
        assert domain.tree_problem(tree, "t", depth, finite=finite) == stack_walk
        taken += quick
    assert 400 < taken < 3600, taken


def test_every_problem_the_checker_names_breaks_a_reader_or_a_loss() -> None:
    """What the checker refuses is what the wire or a trainer cannot take: the wire refuses these outright."""
    for change in ({"seed": 1 << 63}, {"difficulty": -1}, {"turns": [Turn(token_ids=[-1])]},
                   {"task": PosedTask(metadata={"a": 10 ** 400})}, {"turns": [Turn(latency=1e20)]},
                   {"task": PosedTask(metadata=nested(40))}):
        with pytest.raises(Exception):  # noqa: B017 (protobuf raises ValueError, TypeError, OverflowError, DecodeError)
            wire(good(**change))
        assert domain.problems(good(**change))


@pytest.mark.parametrize("fields", [
    {"id": 9, "seq": 12, "group_id": 4, "seed": 1e19, "reward": None, "env": "arith", "finished_at": math.nan},
    {"id": 9, "seq": 2.0 ** 70, "group_id": -4, "difficulty": 1 << 40, "env": 5, "agent": "\ud800"},
    {},
])
def test_an_unreadable_stub_always_travels(fields: dict[str, Any]) -> None:
    stub = domain.unreadable(fields, "the body does not decode")
    assert domain.problems(stub) == []
    back = wire(stub)
    assert (back.status, back.flags, back.reward, back.passed) == ("error", ["unreadable"], 0.0, False)
    assert back.reasons[0].endswith("the body does not decode")
    assert back.id == fields.get("id", 0) and back.seq == min(int(fields.get("seq", 0)), domain.INT64_MAX)
