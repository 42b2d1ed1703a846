"""What an openai agent records of each reply (token ids, logprobs, finish reasons), what it asks for (sampling
settings, ``n`` for a group, tools), against a real local HTTP server playing vLLM."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from farmd.agents import ChatLimits, EndpointConfig, EndpointError, NamedEndpoint, OpenAIAgent, make_agent
from farmd.agents.chat import NO_TOOL_CALL, NOT_RUN
from farmd.agents.sampling import Coalescer
from farmd.config import load
from farmd.envs.base import Attempt, Task
from farmd.errors import ConfigError
from farmd.records import ChatMessage, SamplingParams, ToolCall, Turn, Usage
from tests.agents.fake_endpoint import Reply, fake_endpoint
from tests.agents.fakes import ListEpisode, action_task

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "request_timeout_s": 5.0}
SAY_HI = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")


@asynccontextmanager
async def agent(url: str, *, limits: ChatLimits | None = None, **settings: Any) -> AsyncIterator[OpenAIAgent]:
    made = OpenAIAgent(EndpointConfig(base_url=url, model="m", **{**FAST, **settings}), limits=limits)
    try:
        yield made
    finally:
        await made.aclose()


def timeless(turns: list[Turn]) -> list[Turn]:
    assert all(t.latency > 0 for t in turns)
    return [replace(t, latency=0.0) for t in turns]


# -- what each turn records --------------------------------------------------------------------------------

async def test_a_turn_carries_the_token_ids_and_logprobs_exactly_as_served() -> None:
    served = Reply.text("hi there", token_ids=[9, 8, 7], prompt_token_ids=[1, 2, 3, 4], logprobs=[-0.5, -0.0, -3.25],
                        completion_tokens=3, prompt_tokens=4)
    async with fake_endpoint(lambda request: served) as ep, agent(ep.url, temperature=0.7) as a:
        result = await a.attempt(SAY_HI, None, 3)
    assert ep.requests[0]["logprobs"] is True and ep.requests[0]["return_token_ids"] is True
    assert timeless(result.turns) == [Turn(
        message_index=2, prompt_messages=2, completion="hi there", prompt_token_ids=[1, 2, 3, 4], token_ids=[9, 8, 7],
        logprobs=[-0.5, -0.0, -3.25], has_logprobs=True, finish_reason="stop",
        usage=Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7, requests=1, retries=0))]
    assert result.transcript[2] == ChatMessage(role="assistant", content="hi there")
    assert result.sampling == SamplingParams(model="m", temperature=0.7, top_p=1.0, max_tokens=2048, n=1)


async def test_token_ids_written_as_tokens_are_read_from_the_logprobs() -> None:
    served = Reply.text("ok", token_ids=[151, 2], logprobs=[-1.5, -0.25], ids_as_tokens=True)
    async with fake_endpoint(lambda request: served) as ep, agent(ep.url) as a:
        (turn,) = (await a.attempt(SAY_HI, None, 0)).turns
    assert (turn.token_ids, turn.logprobs, turn.has_logprobs) == ([151, 2], [-1.5, -0.25], True)
    assert turn.prompt_token_ids == []


async def test_a_server_without_logprobs_records_none_rather_than_inventing_them() -> None:
    async with fake_endpoint(lambda request: Reply.text("hi")) as ep, agent(ep.url) as a:
        (turn,) = (await a.attempt(SAY_HI, None, 0)).turns
    assert (turn.has_logprobs, turn.logprobs, turn.token_ids, turn.prompt_token_ids) == (False, [], [], [])
    async with fake_endpoint(lambda request: Reply.text("hi", token_ids=[1, 2, 3], logprobs=[-1.0])) as ep, \
            agent(ep.url) as a:
        (turn,) = (await a.attempt(SAY_HI, None, 0)).turns
    assert (turn.has_logprobs, turn.logprobs, turn.token_ids) == (False, [], [1, 2, 3]), "counts disagree: not kept"


@pytest.mark.parametrize(("served", "named"), [
    (Reply.text("hi", token_ids=[1, 2], logprobs=[-0.5, float("nan")]), "logprobs[1] is nan"),
    (Reply.text("hi", token_ids=[1, 2], logprobs=[-0.5, float("-inf")]), "logprobs[1] is -inf"),
    (Reply.text("hi", token_ids=[1, 2], logprobs=[-0.5, 0.75]), "a sampled token's logprob is at most 0"),
    (Reply.text("hi", token_ids=[1, 2 ** 31], logprobs=[-0.5, -0.5]), "token_ids[1] is 2147483648"),
    (Reply.text("hi", token_ids=[-3, 2], logprobs=[-0.5, -0.5]), "token_ids[0] is -3"),
    (Reply.text("hi", token_ids=[1, 2 ** 40], logprobs=[-0.5, -0.5], ids_as_tokens=True), "is 1099511627776"),
    (Reply.text("hi", token_ids=[1], prompt_token_ids=[5, -1]), "prompt_token_ids[1] is -1"),
    (Reply.text("hi", prompt_tokens=-5), "usage.prompt_tokens is -5"),
])
async def test_a_reply_out_of_its_domain_is_the_server_s_failure_retried_never_a_score(served: Reply,
                                                                                      named: str) -> None:
    async with fake_endpoint(lambda request: served) as ep, agent(ep.url, max_attempts=2) as a:
        with pytest.raises(EndpointError) as failed:
            await a.attempt(SAY_HI, None, 0)
    assert failed.value.transient and len(ep.requests) == 2, "asked again, then an infrastructure failure"
    assert named in str(failed.value), str(failed.value)


async def test_logprobs_and_token_ids_can_be_turned_off() -> None:
    async with fake_endpoint() as ep, agent(ep.url, logprobs=False, token_ids=False) as a:
        await a.attempt(SAY_HI, None, 0)
    assert "logprobs" not in ep.requests[0] and "return_token_ids" not in ep.requests[0]


@pytest.mark.parametrize(("served", "recorded"), [("length", "length"), ("content_filter", "content_filter"),
                                                  ("abort", "other"), ("function_call", "tool_calls"), (None, "")])
async def test_the_finish_reason_is_recorded_in_the_closed_set(served: str | None, recorded: str) -> None:
    reply = Reply.text("```python\ndef f(x):\n    return [", token_ids=[1, 2])
    reply.body["choices"][0]["finish_reason"] = served
    async with fake_endpoint(lambda request: reply) as ep, agent(ep.url) as a:
        result = await a.attempt(SAY_HI, None, 0)
    assert result.turns[0].finish_reason == recorded
    assert result.usage.get("truncated_replies", 0) == (recorded == "length")


async def test_a_clipped_reply_keeps_the_token_ids_it_was_sampled_as() -> None:
    served = Reply.text("x" * 500, token_ids=list(range(100)), logprobs=[-0.1] * 100, finish_reason="length")
    async with fake_endpoint(lambda request: served) as ep, agent(ep.url, limits=ChatLimits(max_reply_chars=200)) as a:
        result = await a.attempt(SAY_HI, None, 0)
    (turn,) = result.turns
    assert len(turn.completion) == 200 and turn.completion == result.transcript[2].content == result.attempt.final
    assert turn.token_ids == list(range(100)) and len(turn.logprobs) == 100
    assert result.usage["clipped_replies"] == 1 and result.usage["truncated_replies"] == 1


async def test_every_turn_of_an_episode_is_recorded_where_its_message_is() -> None:
    replies = iter([Reply.text("```sh\nls\n```", token_ids=[1]), Reply.text("no command", token_ids=[2]),
                    Reply.text("ANSWER: 4", token_ids=[3])])
    async with fake_endpoint(lambda request: next(replies)) as ep, agent(ep.url) as a:
        result = await a.attempt(action_task(), ListEpisode(), 0)
    assert [(t.message_index, t.prompt_messages, t.token_ids) for t in result.turns] == [(2, 2, [1]), (4, 4, [2]),
                                                                                       (6, 6, [3])]
    assert all(result.transcript[t.message_index].content == t.completion for t in result.turns)
    assert [len(r["messages"]) for r in ep.requests] == [2, 4, 6]


# -- a server that refuses what is asked --------------------------------------------------------------------

async def test_a_400_on_return_token_ids_is_survived_once_and_remembered() -> None:
    def vllm_before_0_10(request: dict[str, Any]) -> Reply:
        if "return_token_ids" in request:
            return Reply.error(400, "1 validation error: return_token_ids: Extra inputs are not permitted")
        return Reply.text("hi", logprobs=[-0.5])

    async with fake_endpoint(vllm_before_0_10) as ep, agent(ep.url) as a:
        first = await a.attempt(SAY_HI, None, 0)
        second = await a.attempt(SAY_HI, None, 0)
        assert a.client.unsupported == {"return_token_ids"}
    assert ep.calls == 3
    assert [("return_token_ids" in r, r.get("logprobs")) for r in ep.requests] == [(True, True), (False, True),
                                                                                   (False, True)]
    for result in (first, second):
        (turn,) = result.turns
        assert (turn.has_logprobs, turn.logprobs, turn.token_ids) == (True, [-0.5], [])
    assert (first.usage["requests"], first.usage["retries"], second.usage["retries"]) == (1, 1, 0)


async def test_a_400_naming_no_field_drops_all_optional_ones() -> None:
    def no_logprobs(request: dict[str, Any]) -> Reply:
        return Reply.error(400, "unsupported parameter") if "logprobs" in request else Reply.text("hi")

    async with fake_endpoint(no_logprobs) as ep, agent(ep.url) as a:
        (turn,) = (await a.attempt(SAY_HI, None, 0)).turns
        assert a.client.unsupported == {"logprobs", "return_token_ids"}
    assert turn.has_logprobs is False and ep.calls == 2


# -- what is asked for --------------------------------------------------------------------------------------

async def test_the_endpoints_sampling_settings_reach_every_request_and_the_record() -> None:
    async with fake_endpoint() as ep:
        endpoint = NamedEndpoint(name="vllm", url=ep.url, temperature=0.6, top_p=0.95, seed=1234,
                                 stop=["</answer>", "\n\nUser:"],
                                 extra={"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}})
        made = make_agent("openai:m@vllm?max_tokens=99", endpoints=(endpoint,))
        try:
            result = await made.attempt(SAY_HI, None, 0)
        finally:
            await made.aclose()
    request = ep.requests[0]
    assert {k: request[k] for k in ("temperature", "top_p", "seed", "stop", "top_k", "chat_template_kwargs",
                                    "max_tokens")} == {
        "temperature": 0.6, "top_p": 0.95, "seed": 1234, "stop": ["</answer>", "\n\nUser:"], "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 99}
    assert result.sampling == SamplingParams(
        model="m", temperature=0.6, top_p=0.95, max_tokens=99, seed=1234, stop=["</answer>", "\n\nUser:"], n=1,
        extra={"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}})


def test_farm_toml_sets_what_requests_ask_for(tmp_path: Path) -> None:
    config = tmp_path / "farm.toml"
    config.write_text('[endpoints.vllm]\nurl = "http://127.0.0.1:8000/v1"\ntemperature = 0.6\ntop_p = 0.9\n'
                      'seed = 7\nstop = ["</answer>"]\nlogprobs = false\ntoken_ids = false\nn = 8\ntools = true\n'
                      '[endpoints.vllm.extra]\ntop_k = 20\nchat_template_kwargs = { enable_thinking = false }\n')
    (endpoint,) = load(config).endpoints
    assert (endpoint.temperature, endpoint.top_p, endpoint.seed, endpoint.stop, endpoint.logprobs,
            endpoint.token_ids, endpoint.n, endpoint.tools) == (0.6, 0.9, 7, ("</answer>",), False, False, 8, True)
    assert endpoint.extra == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    for bad, why in [("extra = { stream = true }", "stream"), ("extra = { n = 4 }", "farm sets those"),
                     ("n = 0", "n must be"), ("n = true", "n must be"), ("top_p = 1.5", "top_p"),
                     ('stop = "x"', "stop"), ("seed = 1.5", "seed"), ('tools = "yes"', "tools"),
                     ("temperature = 3.0", "temperature"), ("extra = { when = 1979-05-27 }", "JSON")]:
        config.write_text(f'[endpoints.vllm]\nurl = "http://127.0.0.1:8000/v1"\n{bad}\n')
        with pytest.raises(ConfigError, match=why):
            load(config)


async def test_each_attempt_of_a_group_samples_with_its_own_seed() -> None:
    # One seed for every attempt would make a group one sample repeated: nothing to learn from.
    async with fake_endpoint() as ep, agent(ep.url, seed=1000) as a:
        results = await asyncio.gather(*[a.attempt(SAY_HI, None, 0, rollout_id=i) for i in (11, 12, 13)])
        again = await a.attempt(SAY_HI, None, 0, rollout_id=12)  # a retried rollout asks as it did
    assert sorted(r["seed"] for r in ep.requests) == [1011, 1012, 1012, 1013]
    assert [r.sampling.seed for r in results if r.sampling] == [1011, 1012, 1013]
    assert again.sampling is not None and again.sampling.seed == 1012
    async with fake_endpoint(choices_for) as ep, agent(ep.url, seed=1000, n=3, coalesce_window_s=0.2) as a:
        shared = await asyncio.gather(*[a.attempt(SAY_HI, None, 0, rollout_id=i) for i in (21, 22, 23)])
    assert ep.calls == 1 and ep.requests[0]["n"] == 3, "attempts that differ by their seed alone still share"
    assert {r.sampling.seed for r in shared if r.sampling} == {ep.requests[0]["seed"]}, "the record says what was sent"


# -- n: one request for a group's first turn ----------------------------------------------------------------

def choices_for(request: dict[str, Any]) -> Reply:
    n = request.get("n", 1)
    return Reply.text(None, choices=[f"<answer>{i}</answer>" for i in range(n)], token_ids=[5, 6], logprobs=[-1.0, -2.0],
                      prompt_token_ids=[1, 2, 3], prompt_tokens=3, completion_tokens=2)


async def test_a_groups_identical_first_requests_are_one_request_with_n() -> None:
    async with fake_endpoint(choices_for) as ep, agent(ep.url, n=4, coalesce_window_s=0.2) as a:
        other_task = replace(SAY_HI, seed=1)
        results = await asyncio.gather(*[a.attempt(SAY_HI, None, 7) for _ in range(4)], a.attempt(other_task, None, 7))
    group, alone = results[:4], results[4]
    assert sorted(ep.requests, key=lambda r: r.get("n", 1))[-1]["n"] == 4 and ep.calls == 2, "the other task asks alone"
    assert sorted(r.attempt.final for r in group) == [f"<answer>{i}</answer>" for i in range(4)]
    turns = [r.turns[0] for r in group]
    assert sorted(t.choice_index for t in turns) == [0, 1, 2, 3]
    for t in turns:
        assert t.completion == f"<answer>{t.choice_index}</answer>"
        assert t.token_ids == [5 + 1000 * t.choice_index, 6 + 1000 * t.choice_index] and t.logprobs == [-1.0, -2.0]
        assert t.prompt_token_ids == [1, 2, 3]
        assert (t.usage.prompt_tokens, t.usage.completion_tokens, t.usage.total_tokens) == (3, 2, 5)
    assert {r.sampling.n for r in group if r.sampling} == {4} and alone.sampling and alone.sampling.n == 1
    assert "n" not in next(r for r in ep.requests if r.get("n", 1) == 1)
    assert alone.turns[0].choice_index == 0 and alone.attempt.final == "<answer>0</answer>"


async def test_only_the_first_turn_of_an_episode_is_coalesced() -> None:
    def respond(request: dict[str, Any]) -> Reply:
        n = request.get("n", 1)
        if len(request["messages"]) == 2:
            return Reply.text(None, choices=[f"```sh\necho {i}\n```" for i in range(n)])
        return Reply.text("ANSWER: 1")

    async with fake_endpoint(respond) as ep, agent(ep.url, n=2) as a:
        episodes = [ListEpisode(), ListEpisode()]
        results = await asyncio.gather(*[a.attempt(action_task(), e, 0) for e in episodes])
    assert [r.get("n") for r in ep.requests] == [2, None, None]
    assert sorted(e.commands[0] for e in episodes) == ["echo 0", "echo 1"]
    assert [t.choice_index for t in results[0].turns[1:]] == [0]


async def test_a_server_that_gives_fewer_choices_leaves_the_rest_to_ask_alone() -> None:
    async with fake_endpoint(lambda request: Reply.text("<answer>1</answer>")) as ep, agent(ep.url, n=3) as a:
        results = await asyncio.gather(*[a.attempt(SAY_HI, None, 0) for _ in range(3)])
    assert [r.get("n") for r in ep.requests] == [3, None, None]
    assert [r.attempt.final for r in results] == ["<answer>1</answer>"] * 3


async def test_a_failed_group_request_fails_every_attempt_in_it_as_infrastructure() -> None:
    async with fake_endpoint(lambda request: Reply.error(503)) as ep, agent(ep.url, n=2, max_attempts=2) as a:
        results = await asyncio.gather(*[a.attempt(SAY_HI, None, 0) for _ in range(2)], return_exceptions=True)
    assert all(isinstance(r, EndpointError) and r.transient for r in results)
    assert ep.calls == 2 and all(r["n"] == 2 for r in ep.requests)


async def test_a_cancelled_caller_leaves_the_shared_request_to_the_others() -> None:
    coalescer: Coalescer[str] = Coalescer(window_s=0.2, max_n=3)
    release = asyncio.Event()
    sent: list[int] = []

    async def send(n: int) -> str:
        sent.append(n)
        await release.wait()
        return f"{n} choices"

    callers = [asyncio.create_task(coalescer.join("k", send)) for _ in range(3)]
    await asyncio.sleep(0.01)
    callers[0].cancel()
    release.set()
    assert await asyncio.gather(*callers[1:]) == [("3 choices", 1), ("3 choices", 2)]
    assert sent == [3] and callers[0].cancelled()
    # When every caller has gone, so has the request.
    release.clear()
    alone = asyncio.create_task(coalescer.join("k", send))
    await asyncio.sleep(0.01)
    alone.cancel()
    await asyncio.sleep(0.3)  # past the window
    assert sent == [3], "nobody waited, so nothing was sent"
    await coalescer.aclose()


# -- tools ------------------------------------------------------------------------------------------------------

async def test_a_tool_call_episode_end_to_end() -> None:
    replies = iter([
        Reply.text("Let me look.", tool_calls=[("call_a", "run", '{"command": "ls -la"}')], finish_reason="tool_calls"),
        Reply.text(None, tool_calls=[("call_b", "run", '{"command": "cat x"'), ("call_c", "shell", "{}")],
                   finish_reason="tool_calls"),
        Reply.text("I think it is 42."),
        Reply.text(None, tool_calls=[("call_d", "run", '{"command": "wc -l x"}'),
                                     ("call_e", "run", '{"command": "wc -c x"}')], finish_reason="tool_calls"),
        Reply.text(None, tool_calls=[("", "answer", '{"answer": " 42 "}')], finish_reason="tool_calls"),
    ])
    async with fake_endpoint(lambda request: next(replies)) as ep, agent(ep.url, tools=True) as a:
        episode = ListEpisode()
        result = await a.attempt(action_task(), episode, 0)
    assert result.attempt == Attempt(final="42", actions=["ls -la", "wc -c x"]) and result.error is None
    assert episode.commands == ["ls -la", "wc -c x"]
    assert [t["function"]["name"] for t in ep.requests[0]["tools"]] == ["run", "answer"]
    assert "`run` tool" in ep.requests[0]["messages"][0]["content"]
    second = ep.requests[1]["messages"]
    assert second[2] == {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "run", "arguments": '{"command": "ls -la"}'}}]}
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "call_a"
    assert "output of 'ls -la'" in second[3]["content"]
    third = ep.requests[2]["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in third[4:]] == [("assistant", None), ("tool", "call_b"),
                                                                      ("tool", "call_c")]
    assert "not valid JSON" in third[5]["content"] and "no tool 'shell'" in third[6]["content"]
    assert ep.requests[3]["messages"][-1] == {"role": "user", "content": NO_TOOL_CALL}
    fifth = ep.requests[4]["messages"]
    assert [m["content"] for m in fifth[-2:]] == [NOT_RUN, "Exit status: 0\nOutput:\n```\noutput of 'wc -c x'\n```"]
    assert result.transcript[2] == ChatMessage(role="assistant", content="Let me look.",
                                               tool_calls=[ToolCall("call_a", "run", '{"command": "ls -la"}')])
    assert result.transcript[3].role == "tool" and result.transcript[3].tool_call_id == "call_a"
    assert result.transcript[-1].tool_calls == [ToolCall("call_12_0", "answer", '{"answer": " 42 "}')]
    assert [t.finish_reason for t in result.turns] == ["tool_calls", "tool_calls", "stop", "tool_calls", "tool_calls"]
    assert len(result.steps) == 2 and len(result.turns) == 5


async def test_tools_stay_off_for_submission_tasks() -> None:
    async with fake_endpoint() as ep, agent(ep.url, tools=True) as a:
        await a.attempt(SAY_HI, None, 0)
    assert "tools" not in ep.requests[0]
    assert json.dumps(ep.requests[0])  # plain JSON all the way
