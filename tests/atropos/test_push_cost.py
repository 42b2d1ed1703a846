"""What a push costs farmd, measured against the standard library's parse of the same body (what atroposlib's
server does with it before pydantic): checking a group, making its farm records and packing them for the store
must stay a small multiple of that, on whatever machine runs this."""

from __future__ import annotations

import json
import random
import timeit
from typing import Any

import pytest

from farmd.atropos import groups

pytestmark = [pytest.mark.clocked]

SEQUENCES, TOKENS = 8, 256


def body(seed: int) -> bytes:
    """A group as ``make bench``'s Atropos figure pushes it: tokens, masks, scores, advantages, logprobs."""
    rng = random.Random(seed)
    tokens = [[rng.randrange(50_000) for _ in range(TOKENS)] for _ in range(SEQUENCES)]
    group: dict[str, Any] = {
        "tokens": tokens, "masks": [[-100] * 64 + t[64:] for t in tokens],
        "scores": [float(rng.random() > 0.5) for _ in range(SEQUENCES)],
        "advantages": [[rng.uniform(-1, 1)] * TOKENS for _ in range(SEQUENCES)],
        "inference_logprobs": [[1.0] * 64 + [-rng.random() for _ in range(TOKENS - 64)] for _ in range(SEQUENCES)]}
    return json.dumps(group).encode()


def best(call: Any, number: int = 10, repeat: int = 7) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number


def test_a_push_is_checked_made_records_and_packed_within_twice_a_json_parse_of_it() -> None:
    """On the branch point this was 3.5 parses (orjson read, but the records' bodies were written by ``json`` and
    deflated by zlib, each sequence sealed on its own, the logprobs' positions walked in Python); 1.2 with orjson's
    parse and the checks in Python; about 0.7 since msgspec decodes a group and checks its numbers in one pass."""
    sent = body(1)
    (checked,) = groups.scored_groups(sent, many=False)
    assert isinstance(checked, groups.Checked) and len(checked.bodies) == SEQUENCES
    parse = best(lambda: json.loads(sent))
    push = best(lambda: groups.scored_groups(sent, many=False))
    assert push < 2.0 * parse, f"a push's checks, records and packing took {push * 1e3:.2f} ms, a parse {parse * 1e3:.2f}"
