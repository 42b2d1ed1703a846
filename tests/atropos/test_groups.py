"""A scored group is checked on one of two roads: decoded with its numbers checked by msgspec (the common body),
or read as JSON and checked field by field (anything that decoder refuses). Both must take the same groups, give
back the same group, and refuse the same way."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from farmd import domain, jsonio
from farmd.atropos import groups
from farmd.errors import AtroposInvalid
from farmd.store.atropos import pack, unpack


def _by_fields(body: bytes) -> dict[str, Any] | str:
    try:
        return groups.scored_group(jsonio.parse(body)[0])  # as scored_groups reads a body the decoder refuses
    except AtroposInvalid as exc:
        return exc.message


def _typed(body: bytes) -> dict[str, Any] | str | None:
    decoded = groups._typed(body, many=False)
    if decoded is None:
        return None
    try:
        return groups.scored_group(decoded[0], typed=True)
    except AtroposInvalid as exc:
        return exc.message


def _group(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 5)
    lengths = [rng.randint(0, 40) for _ in range(n)]
    tokens = [[rng.randrange(domain.TOKEN_ID_BOUND) for _ in range(k)] for k in lengths]
    masks = []
    for t in tokens:
        cut = rng.randint(0, len(t))
        shape = rng.random()
        masks.append([-100] * cut + t[cut:] if shape < 0.5 else
                     [-100 if rng.random() < 0.5 else x for x in t] if shape < 0.8 else
                     [rng.randint(-2**63, 2**63 - 1) for _ in t])
    out: dict[str, Any] = {"tokens": tokens, "masks": masks,
                           "scores": [rng.choice([1, 0, -1.5, 0.25]) for _ in range(n)], "unknown": {"x": [1, 2]}}
    if rng.random() < 0.6:  # logprobs one per token, Atropos's 1.0 where not trained; sometimes not one per token
        out["inference_logprobs"] = [[1.0 if m == -100 else -rng.random() for m in mask] + [-0.5] * rng.randint(0, 1)
                                     for mask in masks]
    if rng.random() < 0.5:
        out["advantages"] = [[rng.uniform(-3, 3)] * rng.randint(0, 41) for _ in range(n)]
    if rng.random() < 0.3:
        out["ref_logprobs"] = [[rng.randint(-3, 0) for _ in range(k)] for k in lengths]  # integers, as floats
    if rng.random() < 0.3:
        out["messages"] = [[{"role": "user", "content": "what is 2+2"}, {"role": "assistant", "content": "4"}]
                           for _ in range(n)]
    if rng.random() < 0.3:
        out.update(env_id=rng.randint(0, 3), generation_params={"temperature": 1.0}, group_overrides={"a": [1]},
                   overrides=[{"b": i} for i in range(n)])
    if rng.random() < 0.2:
        out["distill_token_ids"] = [[[rng.randrange(100)] * 2 for _ in range(k)] for k in lengths]
        out["distill_logprobs"] = [[[-0.5, -1.0] for _ in range(k)] for k in lengths]
    return out


def test_both_roads_give_back_the_same_group() -> None:
    rng = random.Random(7)
    typed = 0
    for _ in range(300):
        body = json.dumps(_group(rng)).encode()
        fast, slow = _typed(body), _by_fields(body)
        assert fast is None or fast == slow, body
        typed += fast is not None
    assert typed > 250, "nearly every group like these is decoded typed"


@pytest.mark.parametrize("change, taken", [
    ({"tokens": [[domain.TOKEN_ID_BOUND - 1]]}, True),
    ({"tokens": [[domain.TOKEN_ID_BOUND]]}, False),
    ({"tokens": [[-1]]}, False),
    ({"tokens": [[True]]}, False),
    ({"masks": [[2**63 - 1]]}, True),
    ({"masks": [[2**63]]}, False),
    ({"masks": [[5.0]]}, True),  # an integer written as a float: taken by the checks (as 5), not by the decoder
    ({"masks": [[5.5]]}, False),
    ({"scores": [domain.EXTERNAL_SCORE_BOUND]}, True),
    ({"scores": [domain.EXTERNAL_SCORE_BOUND * 1.01]}, False),
    ({"scores": [False]}, False),
    ({"advantages": [[1.7976931348623157e308]]}, True),
    ({"advantages": [[1e400]]}, False),
    ({"advantages": [["1.0"]]}, False),
    ({"inference_logprobs": [[0.5]]}, False),  # a trained position's sampling logprob above 0
    ({"inference_logprobs": [[-0.5, 7.0]]}, True),  # not one per token: not sampling logprobs
    ({"env_id": -1}, False),
    ({"env_id": 2**70}, False),
    ({"unknown": 2**70}, True),  # a field Atropos does not know is dropped, whatever it holds
    ({"tokens": []}, False),
    ({"scores": None}, False),
])
def test_the_edges_of_each_domain_are_the_same_on_both_roads(change: dict[str, Any], taken: bool) -> None:
    body = json.dumps({"tokens": [[7]], "masks": [[7]], "scores": [1.0], **change}).encode()
    fast, slow = _typed(body), _by_fields(body)
    assert isinstance(slow, dict) == taken, slow
    assert fast is None or fast == slow, (fast, slow)
    (checked,) = groups.scored_groups(body, many=False) if taken else [None]
    if not taken:
        with pytest.raises(AtroposInvalid):
            groups.scored_groups(body, many=False)
    else:
        assert isinstance(checked, groups.Checked) and checked.group == slow


def test_a_list_with_one_bad_group_keeps_the_others() -> None:
    good = {"tokens": [[7]], "masks": [[7]], "scores": [1.0]}
    out = groups.scored_groups(json.dumps([good, {**good, "masks": [[1.5]]}, good]).encode(), many=True)
    assert [type(o).__name__ for o in out] == ["Checked", "AtroposInvalid", "Checked"]
    assert isinstance(out[1], AtroposInvalid) and out[1].loc == [1, "masks", 0, 0]


def test_the_group_make_bench_pushes_takes_the_typed_road() -> None:
    """The common body (tokens, masks with an untrained prompt, scores, advantages, Atropos's 1.0 logprobs where not
    trained) is decoded typed: were it refused, every push would fall back to the slower road and nothing else would
    say so."""
    from tests.atropos.test_push_cost import body

    assert groups._typed(body(3), many=False) is not None
    assert groups._typed(b"[" + body(3) + b"," + body(4) + b"]", many=True) is not None


def test_a_group_is_stored_so_that_a_batch_serves_it_as_its_json() -> None:
    """A checked group is stored as MessagePack where its JSON parse was exact, and as JSON otherwise: either way
    the batch that serves it gets the JSON ``jsonio.dump`` writes of the group, byte for byte."""
    rng = random.Random(11)
    kinds = set()
    bodies = [json.dumps(_group(rng)).encode() for _ in range(200)]
    bodies += [json.dumps({"tokens": [[7]], "masks": [[2**63 - 1]], "scores": [1.0], "unknown": 2**70,
                           "messages": [[{"role": "user", "content": "\u00e9\u2028\U0001f600"}]]}).encode(),
               b'{"tokens": [[7]], "masks": [[7]], "scores": [1.0], "messages": [[{"role": "user", "content": "\\ud800"}]]}']
    for body in bodies:
        for checked in groups.scored_groups(body, many=False):
            assert isinstance(checked, groups.Checked)
            kinds.add(checked.stored[:1] == b"\x00")
            served = unpack(checked.stored)
            assert served == jsonio.dump(checked.group, exact=jsonio.parse(body)[1])
            assert json.loads(served) == json.loads(jsonio.dump(checked.group, exact=False))
    assert kinds == {True, False}, "both forms were met"


def test_groups_stored_as_json_before_read_as_they_were() -> None:
    stored = pack(b'{"tokens":[[7]],"masks":[[7]],"scores":[1.0]}')
    assert unpack(stored) == b'{"tokens":[[7]],"masks":[[7]],"scores":[1.0]}'
