"""How farm_client splits completions to judge into Verify calls: within the farm's bounds on items and bytes, each
task's items in one call where they fit (the farm stores a call's items of one task as one group), and every item
in exactly one call, in order within it."""

from __future__ import annotations

from farm_client.verify import MAX_CALL_BYTES, MAX_ITEMS, calls


def _check(refs: list[tuple[str, int, int]], completions: list[str]) -> list[list[int]]:
    out = calls(refs, completions)
    assert sorted(i for call in out for i in call) == list(range(len(refs)))
    for call in out:
        assert 0 < len(call) <= MAX_ITEMS
        assert sum(len(completions[i].encode()) for i in call) <= MAX_CALL_BYTES
    return out


def test_a_tasks_items_stay_in_one_call_where_they_fit() -> None:
    refs = [("arith", seed, 1) for seed in range(100) for _ in range(4)]  # 100 GRPO groups of 4, 400 items
    out = _check(refs, ["7"] * len(refs))
    assert len(out) == 2
    for call in out:
        assert len({refs[i] for i in call}) * 4 == len(call), "no group is split"
    interleaved = [("arith", seed, 1) for _ in range(3) for seed in range(5)]
    (one,) = _check(interleaved, ["x"] * len(interleaved))
    assert one == [0, 5, 10, 1, 6, 11, 2, 7, 12, 3, 8, 13, 4, 9, 14], "a task's items side by side"


def test_large_completions_split_by_bytes_and_a_group_too_large_for_one_call_is_split() -> None:
    big = "y" * 200_000
    refs = [("py-func", 1, 1)] * 8 + [("py-func", 2, 1)] * 2
    out = _check(refs, [big] * len(refs))
    assert len(out) >= 3
    assert {i for call in out for i in call if refs[i][1] == 2} <= set(out[-1]), "the small group whole in one call"
    many = [("arith", 1, 1)] * (MAX_ITEMS + 3)
    assert [len(c) for c in _check(many, ["1"] * len(many))] == [MAX_ITEMS, 3]
