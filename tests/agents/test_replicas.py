"""An endpoint of several servers: fewest outstanding, a hung one taken out by its health checks and its requests
asked of another at once, the version stamp read around each request, and weights checked before a server loads
them. Real HTTP servers on port 0 (``fake_endpoint``); the real vLLM is ``test_vllm``'s."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path

import pytest

from farmd.agents.endpoint import EndpointConfig, OpenAIClient
from farmd.agents.replicas import HealthConfig, ReplicaSet, stamp
from farmd.agents.weights import check_safetensors
from farmd.errors import WeightsRefused
from tests.agents.fake_endpoint import Reply, fake_endpoint

FAST = HealthConfig(every_s=0.2, timeout_s=0.3, failures=2)


def _payload(model: str = "m") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 4}


@pytest.mark.parametrize(("before", "after", "version"), [
    ("policy:7:123", "policy:7:123", 7),
    ("policy:7", "policy:7", 7),                  # a trainer that loads the weights itself sets LINE:VERSION
    ("policy:7:123", "policy:7:456", 0),          # the same version loaded again between: not one load
    ("policy:7:123", "policy:8:456", 0),          # a load between
    ("policy:8:456:loading", "policy:8:456:loading", 0),
    ("other:7:1", "other:7:1", 0),                # another line's weights
    ("default", "default", 0),                    # a server never loaded
    (None, None, 0),                              # a server that cannot say
    ("policy:0:1", "policy:0:1", 0),
    ("policy:x:1", "policy:x:1", 0),
    ("policy:7:1:2", "policy:7:1:2", 0),
])
def test_a_stamp_is_a_version_only_when_both_labels_are_one_load_of_the_line(before: str | None, after: str | None,
                                                                              version: int) -> None:
    assert stamp("policy", before, after) == version


async def test_requests_go_to_the_replica_with_fewest_outstanding() -> None:
    async with fake_endpoint(lambda r: Reply.text("2")) as a, fake_endpoint(lambda r: Reply.text("2")) as b:
        servers = ReplicaSet("e", [a.url, b.url], FAST)
        try:
            async with servers.use() as first, servers.use() as second:
                assert first is not second  # the first is busy: the other one
                async with servers.use() as third:
                    assert {third.outstanding, first.outstanding, second.outstanding} == {1, 2}
        finally:
            await servers.aclose()


async def test_a_hung_replica_is_taken_out_and_its_request_goes_to_another_at_once() -> None:
    async with fake_endpoint(lambda r: Reply.hang()) as hung, fake_endpoint(lambda r: Reply.text("2")) as good:
        hung.health = Reply.hang()
        config = EndpointConfig(base_url=hung.url, replicas=(good.url,), model="m", request_timeout_s=60,
                                max_attempts=3, health=FAST)
        client = OpenAIClient(config)
        try:
            started = time.monotonic()
            # Twice: one of them goes to the hung replica first (fewest outstanding, then rotation).
            replies = await asyncio.gather(client.chat(_payload()), client.chat(_payload()))
            took = time.monotonic() - started
        finally:
            await client.aclose()
    assert [r.choices[0].text for r in replies] == ["2", "2"]
    assert took < 5, f"a request waited {took:.1f} s on a hung replica (its timeout is 60 s)"
    assert hung.calls >= 1 and good.calls >= 2
    assert not client.replicas.replicas[0].up


async def test_a_reply_is_stamped_with_the_label_read_before_and_after_it() -> None:
    async with fake_endpoint(lambda r: Reply.text("2", token_ids=[5], logprobs=[-0.1])) as ep:
        config = EndpointConfig(base_url=ep.url, model="policy", serves="policy", policy_model="policy", health=FAST)
        client = OpenAIClient(config)
        try:
            ep.label = "policy:3:11"
            assert (await client.chat(_payload("policy"))).weight_version == 3
            # Loaded between the read before and the read after: stamped 0, not 3 nor 4.
            ep.labels.extend(["policy:4:12"])
            assert (await client.chat(_payload("policy"))).weight_version == 0
            ep.label = "policy:4:12"
            assert (await client.chat(_payload("policy"))).weight_version == 4
            assert (await client.chat(_payload("other"))).weight_version is None  # not the policy's model
            ep.label = ""  # a server without /weight_info
            client.replicas.replicas[0].label = None
            assert (await client.chat(_payload("policy"))).weight_version == 0
        finally:
            await client.aclose()


def _safetensors(header: dict[str, object], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize(("content", "why"), [
    (b"", "shorter"),
    (struct.pack("<Q", 10 ** 9) + b"{}", "header says"),
    (struct.pack("<Q", 2) + b"[]", "not a table"),
    (_safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8), "do not hold"),
    (_safetensors({"w": {"dtype": "F32", "shape": [1000000], "data_offsets": [0, 16]}}, b"\0" * 16), "do not hold"),
    (_safetensors({"w": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "dtype"),
    (_safetensors({"__metadata__": {}}, b""), "no tensor"),
])
def test_weights_a_server_would_read_are_checked_first(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(WeightsRefused, match=why):
        check_safetensors(path)
    path.write_bytes(_safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 16))
    assert check_safetensors(path) == 1
