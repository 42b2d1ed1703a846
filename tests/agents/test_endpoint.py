"""The openai agent against a real local HTTP server: replies, retries, timeouts, and never a silent reward."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from farmd.agents import (
    ChatLimits,
    ClientPool,
    EndpointConfig,
    EndpointError,
    NamedEndpoint,
    OpenAIAgent,
    make_agent,
)
from farmd.agents.chat import ANSWER_NOW
from farmd.agents.endpoint import base_url
from farmd.agents.replicas import HealthConfig
from farmd.envs import get
from farmd.envs.base import Attempt, Task, VerifyContext
from farmd.records import ChatMessage
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.agents.fake_endpoint import Reply, fake_endpoint
from tests.agents.fakes import ListEpisode, action_task

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "request_timeout_s": 5.0}


@asynccontextmanager
async def agent(url: str, *, limits: ChatLimits | None = None, **settings: Any) -> AsyncIterator[OpenAIAgent]:
    """An agent with its own client, closed on exit (an unclosed one would leave sockets behind)."""
    config = EndpointConfig(base_url=url, model=settings.pop("model", "fake/model-1"), **{**FAST, **settings})
    made = OpenAIAgent(config, limits=limits)
    try:
        yield made
    finally:
        await made.aclose()


SAY_HI = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")


# -- one reply ---------------------------------------------------------------------------------------------

async def test_a_code_task_is_solved_in_one_reply() -> None:
    env = get("py-func")
    task = env.generate(3, 2)
    source = env.reference(task).final
    reply = f"Here you go.\n\n```python\n{source}```\n\nThis sorts and filters."
    async with fake_endpoint(lambda request: Reply.text(reply)) as ep, \
            agent(ep.url, api_key="sk-test", temperature=0.2, limits=ChatLimits(max_tokens=321)) as a:
        result = await a.attempt(task, None, 0)
    assert result.attempt == Attempt(final=source)
    assert result.error is None
    assert [s.action for s in result.steps] == [source] and result.steps[0].observation is None
    assert result.usage == {"requests": 1, "retries": 0, "prompt_tokens": 11, "completion_tokens": 7,
                            "total_tokens": 18}
    assert ep.paths == ["/v1/chat/completions"]
    request = ep.requests[0]
    assert request["model"] == "fake/model-1" and request["max_tokens"] == 321 and request["temperature"] == 0.2
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert task.prompt in request["messages"][1]["content"]
    assert ep.headers[0]["authorization"] == "Bearer sk-test"
    assert ep.headers[0]["content-type"] == "application/json"
    assert "tools" not in request and "n" not in request and "seed" not in request
    assert result.transcript[-1] == ChatMessage(role="assistant", content=reply)


async def test_an_answer_task_keeps_the_whole_reply_and_the_format_is_asked_for() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="What is 2 + 2?",
                answer_format="one <answer> block")
    async with fake_endpoint(lambda request: Reply.text("Two and two.\n<answer>4</answer>")) as ep, agent(ep.url) as a:
        result = await a.attempt(task, None, 0)
    assert result.attempt.final == "Two and two.\n<answer>4</answer>"
    assert "one <answer> block" in ep.requests[0]["messages"][1]["content"]
    assert "authorization" not in ep.headers[0]


async def test_the_model_name_may_carry_the_policy_version() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint() as ep, agent(ep.url, model="farm-v{version}") as a:
        await a.attempt(task, None, 17)
    assert ep.requests[0]["model"] == "farm-v17"


async def test_a_chunked_reply_and_a_reply_read_to_the_end_of_the_stream() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    body = json.dumps({"choices": [{"message": {"content": "till the end"}}]}).encode()
    async with fake_endpoint() as ep:
        ep.script.extend([Reply.text("chunk " * 40, chunked=True),
                          Reply.raw(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json"
                                    b"\r\n\r\n" + body)])
        async with agent(ep.url) as a:
            first = await a.attempt(task, None, 0)
        async with agent(ep.url) as a:
            second = await a.attempt(task, None, 0)
    assert first.attempt.final == "chunk " * 40
    assert second.attempt.final == "till the end" and second.usage == {"requests": 1, "retries": 0}


# -- several turns ----------------------------------------------------------------------------------------

async def test_an_action_task_over_several_turns_feeds_observations_back() -> None:
    replies = iter(["Let me look.\n```sh\nls -la\n```", "```bash\nwc -l notes.txt\n```", "**ANSWER:** 42"])
    async with fake_endpoint(lambda request: Reply.text(next(replies))) as ep:
        episode = ListEpisode()
        async with agent(ep.url) as a:
            result = await a.attempt(action_task(), episode, 0)
    assert result.attempt == Attempt(final="42", actions=["ls -la", "wc -l notes.txt"])
    assert episode.commands == ["ls -la", "wc -l notes.txt"] and not episode.closed
    assert [(s.action, s.observation, s.exit_code) for s in result.steps] == [
        ("ls -la", "output of 'ls -la'", 1), ("wc -l notes.txt", "output of 'wc -l notes.txt'", 0)]
    assert ep.calls == 3
    second = ep.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "output of 'ls -la'" in second[-1]["content"] and "Exit status: 1" in second[-1]["content"]
    assert "Finish with the number alone." in second[1]["content"]
    assert "10 turns" in second[0]["content"]  # the task's own limit
    assert result.usage["requests"] == 3 and result.usage["total_tokens"] == 54


async def test_the_last_command_asks_for_the_answer() -> None:
    replies = iter(["```sh\necho a\n```", "```sh\necho b\n```", "ANSWER: `7`"])
    task = Task(env="fake-shell", env_version="1", seed=1, difficulty=1, prompt="Count.", kind="actions")
    async with fake_endpoint(lambda request: Reply.text(next(replies))) as ep, agent(ep.url) as a:
        result = await a.attempt(task, ListEpisode(max_steps=2), 0)
    assert result.attempt == Attempt(final="7", actions=["echo a", "echo b"])
    assert ANSWER_NOW in ep.requests[-1]["messages"][-1]["content"]


# -- failures ------------------------------------------------------------------------------------------------

async def test_server_errors_and_cut_connections_are_retried_then_succeed() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint() as ep:
        ep.script.extend([Reply.error(500), Reply.error(503, retry_after="0"), Reply.close(),
                          Reply.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnot j"),
                          Reply.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ncut short"),
                          Reply.text("hi", chunked=True)])
        async with agent(ep.url, max_attempts=6) as a:
            result = await a.attempt(task, None, 0)
    assert result.attempt.final == "hi"
    assert ep.calls == 6 and result.usage["retries"] == 5 and result.usage["requests"] == 1


async def test_429_is_retried_after_the_servers_hint() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint() as ep:
        ep.script.append(Reply.error(429, "slow down", retry_after="0.2"))
        started = time.monotonic()
        async with agent(ep.url, max_backoff_s=1.0) as a:
            result = await a.attempt(task, None, 0)
        elapsed = time.monotonic() - started
    assert result.attempt.final == "hello" and ep.calls == 2
    assert elapsed >= 0.2  # the hint, not the 10 ms backoff


async def test_retries_exhausted_raise_endpoint_error_not_a_reward() -> None:
    task = get("py-func").generate(1, 1)
    async with fake_endpoint(lambda request: Reply.error(502, "upstream gone")) as ep:
        with pytest.raises(EndpointError) as caught:
            async with agent(ep.url, max_attempts=3) as a:
                await a.attempt(task, None, 0)
    assert ep.calls == 3
    err = caught.value
    assert (err.status, err.attempts, err.transient) == (502, 3, True)
    assert "upstream gone" in str(err) and "3 attempts" in str(err)


async def test_a_failure_mid_episode_raises_too() -> None:
    replies = iter([Reply.text("```sh\nls\n```"), Reply.error(500), Reply.error(500)])
    async with fake_endpoint(lambda request: next(replies)) as ep:
        episode = ListEpisode()
        with pytest.raises(EndpointError):
            async with agent(ep.url, max_attempts=2) as a:
                await a.attempt(action_task(), episode, 0)
    assert episode.commands == ["ls"] and not episode.closed


async def test_a_hanging_endpoint_times_out_promptly() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint(lambda request: Reply.hang()) as ep:
        started = time.monotonic()
        with pytest.raises(EndpointError, match=r"no response within 0\.3s"):
            async with agent(ep.url, request_timeout_s=0.3, max_attempts=2) as a:
                await a.attempt(task, None, 0)
        elapsed = time.monotonic() - started
    assert ep.calls == 2
    assert 0.6 <= elapsed < 2.0


async def test_400_is_not_retried() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint(lambda request: Reply.error(400, "max_tokens is too large")) as ep:
        with pytest.raises(EndpointError) as caught:
            async with agent(ep.url, max_attempts=4, logprobs=False, token_ids=False) as a:
                await a.attempt(task, None, 0)
    assert ep.calls == 1
    assert (caught.value.status, caught.value.attempts, caught.value.transient) == (400, 1, False)
    assert "max_tokens is too large" in str(caught.value)


async def test_a_400_is_asked_once_more_without_the_optional_fields_and_then_not_retried() -> None:
    async with fake_endpoint(lambda request: Reply.error(400, "max_tokens is too large")) as ep, \
            agent(ep.url, max_attempts=4) as a:
        for _ in range(2):
            with pytest.raises(EndpointError) as caught:
                await a.attempt(SAY_HI, None, 0)
            assert (caught.value.status, caught.value.attempts, caught.value.transient) == (400, 2, False)
        assert a.client.unsupported == set(), "a 400 the fields did not cause is not held against them"
    assert ep.calls == 4
    assert [("logprobs" in r, "return_token_ids" in r) for r in ep.requests] == [(True, True), (False, False)] * 2


async def test_a_wrong_path_is_a_404_not_retried() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint() as ep:
        with pytest.raises(EndpointError, match="404"):
            async with agent(f"http://127.0.0.1:{ep.port}/v2") as a:
                await a.attempt(task, None, 0)
    assert ep.paths == ["/v2/chat/completions"]


async def test_nobody_listening_is_an_endpoint_error() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    with pytest.raises(EndpointError, match="cannot connect"):
        async with agent(f"http://127.0.0.1:{port}/v1", max_attempts=2) as a:
            await a.attempt(task, None, 0)


async def test_a_request_whose_own_failure_takes_its_server_out_still_ends_as_an_endpoint_error() -> None:
    """The failure that takes a replica out cuts the requests in flight on it, but not the one that failed: it
    is retried as any failure is. Cut too, it ended its job as cancelled, with no failure reported, and the job
    waited out its lease."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for _ in range(5):  # the request's failure or the first health check's takes the server out: either way
        with pytest.raises(EndpointError, match=r"cannot connect|none of the endpoint's 1 servers is up"):
            async with agent(f"http://127.0.0.1:{port}/v1", max_attempts=3, health=HealthConfig(failures=1)) as a:
                await a.attempt(SAY_HI, None, 0)


@pytest.mark.clocked
async def test_cancelling_an_attempt_returns_promptly_and_closes_the_connection() -> None:
    task = Task(env="x", env_version="1", seed=0, difficulty=1, prompt="Say hi.")
    async with fake_endpoint(lambda request: Reply.hang()) as ep, agent(ep.url, request_timeout_s=60) as a:
        running = asyncio.create_task(a.attempt(task, None, 0))
        await ep.arrived.wait()
        started = time.monotonic()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert time.monotonic() - started < 0.5
        await asyncio.sleep(0.05)
        assert not ep._handlers, "the server saw the connection close"


@pytest.mark.parametrize(("raw", "why"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n", "999999999 bytes (the bound is 4096)"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n" + b"x" * 8192 + b"\r\n0\r\n\r\n",
     "over the bound of 4096 bytes"),
    (b"HTTP/1.1 200 OK\r\n\r\n" + b"y" * 8192, "over the bound of 4096 bytes"),
    (b"SMTP ready\r\n\r\n", "RemoteProtocolError"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "RemoteProtocolError"),
])
async def test_oversized_and_malformed_responses_are_refused(raw: bytes, why: str) -> None:
    async with fake_endpoint(lambda request: Reply.raw(raw)) as ep, \
            agent(ep.url, max_attempts=2, max_response_bytes=4096) as a:
        with pytest.raises(EndpointError, match="2 attempts") as caught:
            await a.attempt(SAY_HI, None, 0)
    assert why in str(caught.value) and caught.value.transient
    assert ep.calls == 2


async def test_one_agent_reuses_its_connection_and_closing_it_closes_the_connection() -> None:
    async with fake_endpoint() as ep:
        config = EndpointConfig(base_url=ep.url, model="m", **FAST)
        a = OpenAIAgent(config)
        try:
            for _ in range(3):
                assert (await a.attempt(SAY_HI, None, 0)).attempt.final == "hello"
            assert (ep.calls, ep.connections) == (3, 1)
            assert len(ep._handlers) == 1, "the connection is kept open between requests"
        finally:
            await a.aclose()
        await asyncio.sleep(0.05)
        assert not ep._handlers, "aclose closed it"
        with pytest.raises(EndpointError, match="closed"):
            await a.attempt(SAY_HI, None, 0)


async def test_agents_of_one_endpoint_share_its_client_and_the_pool_closes_it() -> None:
    async with fake_endpoint() as ep:
        endpoints = (NamedEndpoint(name="local", url=ep.url),)
        pool = ClientPool()
        try:
            first = make_agent("openai:m@local", endpoints=endpoints, clients=pool)
            second = make_agent("openai:m@local?temperature=0.5", endpoints=endpoints, clients=pool)
            assert isinstance(first, OpenAIAgent) and isinstance(second, OpenAIAgent)
            assert first.client is second.client
            await first.attempt(SAY_HI, None, 0)
            await second.attempt(SAY_HI, None, 0)
            await first.aclose()  # not the agent's to close: the pool's
            await second.attempt(SAY_HI, None, 0)
            assert ep.connections == 1 and [r["temperature"] for r in ep.requests] == [1.0, 0.5, 0.5]
        finally:
            await pool.aclose()
        await asyncio.sleep(0.05)
        assert not ep._handlers


def test_base_urls() -> None:
    assert base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert base_url("https://api.example.com/v1") == "https://api.example.com/v1"
    assert base_url("http://[::1]:9/v1") == "http://[::1]:9/v1"
    for bad in ("ftp://x/v1", "http:///v1", "http://user:pw@host/v1", "http://host:notaport/v1", "http://h/v1?x=1"):
        with pytest.raises(ValueError):
            base_url(bad)


# -- a real shell episode -----------------------------------------------------------------------------------

@pytest.mark.sandbox
async def test_an_openai_agent_solves_a_real_shell_task(tmp_path: Path) -> None:
    env = get("shell")
    task = env.generate(5, 2)
    reference = env.reference(task)
    turns = [f"```sh\n{action}\n```" for action in reference.actions] + [f"ANSWER: {reference.final or 'done'}"]

    def responder(request: dict[str, Any]) -> Reply:
        done = sum(1 for m in request["messages"] if m["role"] == "assistant")
        return Reply.text(turns[done])

    async with fake_endpoint(responder) as ep, Sandbox() as sandbox:
        ctx = VerifyContext(sandbox=sandbox, key=VerifierKey(b"k" * 32), scratch_dir=tmp_path)
        episode = await env.episode(task, ctx)
        agent = make_agent("openai:fake@local", endpoints=(NamedEndpoint(name="local", url=ep.url),))
        try:
            result = await agent.attempt(task, episode, 0)
        finally:
            await episode.close()
            await agent.aclose()
        verdict = await env.verify(task, result.attempt, ctx)
    assert result.attempt.actions == reference.actions
    assert all(s.observation is not None for s in result.steps)
    assert verdict.passed, verdict.reasons


def test_a_reply_keeps_no_more_than_its_request_allowed() -> None:
    """Token ids and logprobs past the request's max_tokens, prompt ids past the request's own size, and text
    past the reader's bound are what no server can have sampled for it: not kept, whatever the reply declares."""
    from farmd.agents.endpoint import read_reply, reply_text_bound

    body = Reply.text("x" * (reply_text_bound(8) + 10), token_ids=list(range(9)), logprobs=[-0.5] * 9,
                      prompt_token_ids=list(range(50))).body
    choice = read_reply(json.dumps(body).encode(), max_tokens=8, max_prompt_tokens=40).choices[0]
    assert (choice.token_ids, choice.logprobs, choice.prompt_token_ids) == (None, None, None)
    assert len(choice.text) == reply_text_bound(8)
    within = read_reply(json.dumps(body).encode(), max_tokens=9, max_prompt_tokens=50)
    assert within.choices[0].token_ids == list(range(9)) and within.prompt_token_ids == list(range(50))


async def test_a_large_reply_is_read_in_a_worker_process_as_a_small_one_is_in_a_thread() -> None:
    from farmd.agents.endpoint import PARSE_IN_THREAD_BYTES, read_reply, read_reply_off_loop

    body = Reply.text("y" * 10, token_ids=[1, 2], logprobs=[-0.1, -0.2]).body
    small = json.dumps(body).encode()
    large = json.dumps({**body, "padding": "z" * PARSE_IN_THREAD_BYTES}).encode()
    assert await read_reply_off_loop(small, 16) == read_reply(small, 16)
    assert await read_reply_off_loop(large, 16) == read_reply(small, 16), "the same reply, read elsewhere"
    with pytest.raises(json.JSONDecodeError):
        await read_reply_off_loop(b"[" * 100 + b" " * PARSE_IN_THREAD_BYTES)
