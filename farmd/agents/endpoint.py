"""An agent whose policy is served by an OpenAI-compatible chat endpoint (vLLM, SGLang, ...).

``OpenAIClient.chat`` POSTs ``{base}/chat/completions`` with ``model``, ``messages``,
``max_tokens`` and ``temperature``, each request bounded by ``request_timeout_s``.
Connection failures, timeouts, malformed responses, 429 and 5xx are retried up to
``max_attempts`` requests in all, with exponential backoff and jitter (a
``Retry-After`` in seconds is honoured, within ``max_backoff_s``); any other
status is not retried. Whatever the cause, a request that never got a usable
reply raises ``EndpointError``: the job fails as infrastructure, never as a
reward of 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from farmd.agents.chat import ChatAgent, ChatLimits, Completion, Message
from farmd.agents.errors import EndpointError
from farmd.agents.httpclient import HttpError, HttpResponse, Url, post_json

log = logging.getLogger("farmd.agents.endpoint")

VERSION_FIELD = "{version}"
"""In a model name, replaced by the job's policy version (an inference server that serves one adapter
per policy version, e.g. vLLM LoRA modules named ``farm-v{version}``)."""
_EXCERPT = 300


@dataclass(frozen=True, kw_only=True)
class EndpointConfig:
    """How to reach one model on one OpenAI-compatible server."""

    base_url: str
    """The API's base, e.g. ``http://127.0.0.1:8000/v1``; requests go to ``{base_url}/chat/completions``."""
    model: str
    api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer``; never logged or put in the agent's name."""
    temperature: float = 1.0
    request_timeout_s: float = 300.0
    """One request, connecting included; a long generation on a busy server is slow, so this is generous."""
    max_attempts: int = 4
    """Requests in all for one reply, the first included."""
    backoff_s: float = 1.0
    """Wait before the first retry; doubled for each next one, times a jitter factor in [0.5, 1]."""
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        Url.parse(self.base_url)  # ValueError now rather than at the first request
        if self.api_key is not None and (not self.api_key.isprintable() or any(c.isspace() for c in self.api_key)):
            raise ValueError("the API key holds spaces or control characters")  # it goes into a header line
        if not self.model:
            raise ValueError("no model name")
        if self.max_attempts < 1 or self.request_timeout_s <= 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"bad retry settings: attempts={self.max_attempts}, timeout={self.request_timeout_s}s, "
                             f"backoff={self.backoff_s}s, max backoff={self.max_backoff_s}s")


class _Retry(Exception):
    """One request failed in a way a later one may not; ``wait_s`` is the server's hint, if any."""

    def __init__(self, why: str, status: int | None = None, wait_s: float | None = None) -> None:
        super().__init__(why)
        self.status = status
        self.wait_s = wait_s


class OpenAIClient:
    """Chat completions against one endpoint, with the retry rules above. Safe to share between tasks."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self.url = Url.parse(config.base_url)
        self._jitter = random.Random()

    async def chat(self, messages: list[Message], *, model: str | None = None, max_tokens: int,
                   temperature: float | None = None) -> Completion:
        cfg = self.config
        payload = {"model": model or cfg.model, "messages": messages, "max_tokens": max_tokens,
                   "temperature": cfg.temperature if temperature is None else temperature}
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        last: _Retry | None = None
        for attempt in range(1, cfg.max_attempts + 1):
            if last is not None:
                await asyncio.sleep(self._backoff(attempt - 1, last.wait_s))
            try:
                text, usage, finish = await self._request(payload, headers)
            except EndpointError as exc:
                exc.attempts = attempt
                raise
            except _Retry as exc:
                last = exc
                log.warning("endpoint %s model %s: attempt %d/%d failed: %s", self.url, payload["model"], attempt,
                            cfg.max_attempts, exc)
                continue
            return Completion(text=text, usage=usage, finish_reason=finish, attempts=attempt)
        assert last is not None
        raise EndpointError(f"{self.url} (model {payload['model']}): no reply after {cfg.max_attempts} attempts; "
                            f"last: {last}", status=last.status, attempts=cfg.max_attempts, transient=True)

    def _backoff(self, retry: int, hint_s: float | None) -> float:
        cfg = self.config
        wait = min(cfg.max_backoff_s, cfg.backoff_s * 2.0 ** (retry - 1)) * self._jitter.uniform(0.5, 1.0)
        if hint_s is not None:
            wait = max(wait, min(hint_s, cfg.max_backoff_s))
        return wait

    async def _request(self, payload: dict[str, Any], headers: dict[str, str]) -> tuple[str, dict[str, int], str | None]:
        timeout = self.config.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                response = await post_json(self.url, "chat/completions", payload, headers)
        except TimeoutError:
            raise _Retry(f"no response within {timeout:g}s") from None
        except HttpError as exc:
            raise _Retry(str(exc)) from None
        if response.status == 429 or response.status >= 500:
            raise _Retry(_describe(response), response.status, _retry_after(response))
        if response.status != 200:
            raise EndpointError(f"{self.url} (model {payload['model']}): {_describe(response)}; not retried",
                                status=response.status, attempts=1, transient=False)
        try:
            # Up to MAX_BODY_BYTES of JSON from a server farm does not control: parsed off the event loop
            # (a large or deeply nested reply would stall every box's timer and the API).
            return _read_completion(await asyncio.to_thread(response.json))
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
            # A proxy or an overloaded server can answer 200 with junk; another request may do better.
            raise _Retry(f"a malformed response ({type(exc).__name__}: {exc}): {_excerpt(response.body)}",
                         response.status) from None


def _read_completion(data: Any) -> tuple[str, dict[str, int], str | None]:
    choice = data["choices"][0]
    message = choice["message"]
    content = message.get("content")
    if content is None:
        content = ""  # a reply of only reasoning or tool calls has no text: the policy said nothing
    if not isinstance(content, str):
        raise TypeError(f"message content is {type(content).__name__}, not text")
    raw_usage = data.get("usage") or {}
    usage = {k: v for k, v in raw_usage.items() if isinstance(v, int) and not isinstance(v, bool)} \
        if isinstance(raw_usage, dict) else {}
    finish = choice.get("finish_reason")
    return content, usage, finish if isinstance(finish, str) else None


def _retry_after(response: HttpResponse) -> float | None:
    try:
        value = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None  # an HTTP date: rare from inference servers, and the backoff covers it
    return value if value >= 0 else None


def _excerpt(body: bytes) -> str:
    return json.dumps(body[:_EXCERPT].decode("utf-8", "replace"))


def _describe(response: HttpResponse) -> str:
    return f"HTTP {response.status} {response.reason}: {_excerpt(response.body)}"


class OpenAIAgent(ChatAgent):
    """A ``ChatAgent`` whose model is served by an OpenAI-compatible endpoint (``openai:MODEL@ENDPOINT``)."""

    def __init__(self, config: EndpointConfig, *, limits: ChatLimits | None = None) -> None:
        super().__init__(limits=limits)
        self.config = config
        self.client = OpenAIClient(config)
        self.name = f"openai:{config.model}@{self.client.url}"

    def model_for(self, policy_version: int) -> str:
        return self.config.model.replace(VERSION_FIELD, str(policy_version))

    async def complete(self, messages: list[Message], *, max_tokens: int, policy_version: int) -> Completion:
        return await self.client.chat(messages, model=self.model_for(policy_version), max_tokens=max_tokens)
