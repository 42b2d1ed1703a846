"""The LLM attacker against a scripted OpenAI-compatible server: what it is shown, how tolerantly its reply
is read, what it costs, and that an endpoint that fails is an ``AttackerError`` (infrastructure), never a
list of proposals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from farmd.errors import AttackerError
from farmd.intake.attacker import (
    Attacker,
    AttackerConfig,
    Proposal,
    prompt_messages,
    read_proposals,
)
from farmd.intake.boxed import ContributedTask
from farmd.intake.package import read_package
from tests.agents.fake_endpoint import Reply, fake_endpoint
from tests.intake.contrib_example import EXAMPLE

PACKAGE = read_package(EXAMPLE)
TASK = ContributedTask("How many times does 'apple' occur in: apple river apple? Answer with a number.",
                       {"target": "apple"})
CANNED = {"attempts": [{"final": "2 or 3", "why": "a hedge"}, {"final": "<answer>2</answer>", "why": "a block"}]}


def config(url: str, **changes: object) -> AttackerConfig:
    settings: dict[str, object] = {"base_url": url, "model": "attacker", "max_attempts": 1, "request_timeout_s": 5}
    return AttackerConfig(**(settings | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("reply", [
    json.dumps(CANNED),
    f"I found two.\n```json\n{json.dumps(CANNED, indent=2)}\n```\nThat is all.",
    f"Here they are: {json.dumps(CANNED)} -- hope that helps {{not json}}",
    f"```\n{json.dumps(CANNED['attempts'])}\n```",
    "Thinking about {braces} first. " + json.dumps({"proposals": CANNED["attempts"]}),
])
def test_proposals_are_read_from_json_fenced_or_among_prose(reply: str) -> None:
    assert read_proposals(reply, 8) == [Proposal("2 or 3", "a hedge"), Proposal("<answer>2</answer>", "a block")]


def test_reading_is_bounded_and_repairs_text() -> None:
    many = {"attempts": [f"x{i}" for i in range(50)] + [{"final": "\ud800", "why": 7}, {"nofinal": 1}]}
    assert [p.final for p in read_proposals(json.dumps(many), 3)] == ["x0", "x1", "x2"]
    assert read_proposals(json.dumps({"attempts": [{"final": "\ud800", "why": 7}]}), 3) == [Proposal("\ufffd", "7")]
    for junk in ("no json here", '{"attempts": []}', '{"other": [1, 2]}', "[" * 100_000, '{"attempts": [{"why": 1}]}'):
        with pytest.raises(ValueError, match="no"):
            read_proposals(junk, 3)


def test_the_attacker_is_shown_the_verifier_the_task_and_the_kind_within_a_bound() -> None:
    [system, user] = prompt_messages(PACKAGE, TASK, 5, 48_000)
    assert "reward hacking" in system["content"]
    text = user["content"]
    assert "def verify(self, task, final):" in text and "farm-env.toml" in text
    assert TASK.prompt in text and '"target": "apple"' in text and "kind: answer" in text and "at most 5" in text
    assert text.index("=== farm-env.toml ===") < text.index("=== env.py ===") < text.index("=== examples/")
    big = replace(PACKAGE, files={**PACKAGE.files, "data/big.txt": b"x" * 200_000})
    clipped = prompt_messages(big, TASK, 5, 5_000)[1]["content"]
    assert "def verify" in clipped and len(clipped) < 5_000 + 2_000 and "more files not shown" in clipped


async def test_proposals_and_their_cost_come_from_the_endpoint() -> None:
    async with fake_endpoint(lambda request: Reply.text(json.dumps(CANNED), prompt_tokens=1200,
                                                        completion_tokens=60)) as ep, \
            Attacker(config(ep.url, api_key="sk-test", max_tokens=321)) as attacker:
        attack = await attacker.propose(PACKAGE, TASK, 1)
    assert attack.proposals == [Proposal("2 or 3", "a hedge")] and attack.tokens == 1260
    request = ep.requests[0]
    assert (request["model"], request["max_tokens"]) == ("attacker", 321)
    assert "logprobs" not in request and ep.headers[0]["authorization"] == "Bearer sk-test"


async def test_without_usage_the_cost_is_estimated_from_characters() -> None:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(CANNED)}}]}
    async with fake_endpoint(lambda request: Reply("json", 200, body)) as ep, Attacker(config(ep.url)) as attacker:
        attack = await attacker.propose(PACKAGE, TASK, 4)
    sent = sum(len(m["content"]) for m in ep.requests[0]["messages"])
    assert len(attack.proposals) == 2 and attack.tokens == (sent + len(json.dumps(CANNED))) // 4


@pytest.mark.parametrize(("reply", "why"), [
    (Reply.error(503, "overloaded"), "HTTP 503"),
    (Reply.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), "malformed"),
    (Reply.text("I would rather not."), "held no proposals"),
])
async def test_an_endpoint_that_fails_is_an_attacker_error(reply: Reply, why: str) -> None:
    async with fake_endpoint(lambda request: reply) as ep, Attacker(config(ep.url)) as attacker:
        with pytest.raises(AttackerError, match=why) as failed:
            await attacker.propose(PACKAGE, TASK, 4)
    assert failed.value.tokens == (18 if "proposals" in why else 0), "a reply that came is paid for"


def test_bad_settings_are_refused_at_once() -> None:
    for changes in ({"max_tokens": 0}, {"request_timeout_s": 0}, {"max_attempts": 9}, {"max_source_chars": 10}):
        with pytest.raises(ValueError):
            config("http://127.0.0.1:1/v1", **changes)
    with pytest.raises(ValueError, match="scheme"):
        config("ftp://example.org")
