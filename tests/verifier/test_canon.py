"""Canonical values and strict comparison: exact types, no __eq__ of the submission, NaN never equal."""

from __future__ import annotations

import json

import pytest

from farmd.errors import BadClaim, NotCanonical
from farmd.verifier.canon import canon, parse_claim, strict_equal


def test_exact_builtin_types_only() -> None:
    assert canon([1, "a", None, True, (2, 3.5)]) == [1, "a", None, True, {"t": [2, {"f": "3.5"}]}]

    class Liar(list):  # type: ignore[type-arg]
        def __eq__(self, other: object) -> bool:
            return True

    for bad in (Liar(), object(), {"a": 1}, {1, 2}, (v for v in []), b"bytes", 1j):
        with pytest.raises(NotCanonical):
            canon(bad)
    with pytest.raises(NotCanonical):
        canon(_nested(100))


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def test_strict_equality() -> None:
    def roundtrip(v: object) -> object:
        return json.loads(json.dumps(canon(v)))

    assert strict_equal(roundtrip([1, 2]), canon([1, 2]))
    assert not strict_equal(roundtrip([True]), canon([1]))  # bool is not int
    assert not strict_equal(roundtrip((1, 2)), canon([1, 2]))  # tuple is not list
    assert not strict_equal(roundtrip(1.0), canon(1))
    assert not strict_equal(roundtrip(float("nan")), canon(float("nan")))
    assert strict_equal(roundtrip(float("inf")), canon(float("inf")))
    assert strict_equal(roundtrip(1.0000001), canon(1.0), rel_tol=1e-6)
    assert not strict_equal(roundtrip(1.1), canon(1.0), rel_tol=1e-6)
    assert strict_equal(roundtrip("é"), canon("é"))


def test_claims_are_parsed_defensively() -> None:
    with pytest.raises(BadClaim):
        parse_claim("[" * 100_000)
    with pytest.raises(BadClaim):
        parse_claim("not json")
    with pytest.raises(BadClaim):
        parse_claim("9" * 5000)  # over Python's int-digits limit
    assert parse_claim('{"f": "nan"}') == {"f": "nan"}
