"""Fast JSON where it is exact, the standard library where it is not."""

from __future__ import annotations

import json
import math

from farmd import jsonio


def test_what_orjson_reads_it_writes_back_unchanged() -> None:
    body = json.dumps({"tokens": [[1, 2, 3]], "scores": [0.1, -2.5e-7], "text": "é\u2028", "big": 2**63 - 1}).encode()
    value, exact = jsonio.parse(body)
    assert exact and json.loads(jsonio.dump(value, exact=exact)) == json.loads(body)


def test_a_body_only_json_reads_is_read_and_written_by_json() -> None:
    value, exact = jsonio.parse(b'{"scores": [NaN, Infinity], "s": "\\ud800"}')
    assert not exact, "orjson refuses NaN literals and lone surrogates"
    assert math.isnan(value["scores"][0]) and value["scores"][1] == math.inf and value["s"] == "\ud800"
    written = jsonio.dump(value, exact=exact)
    assert b"NaN" in written and b"Infinity" in written, "orjson would have written null"
    assert jsonio.dump({"x": math.nan}, exact=True) == b'{"x":null}', "why exactness is the caller's to say"
