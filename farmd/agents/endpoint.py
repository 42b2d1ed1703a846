"""An agent whose policy is served by an OpenAI-compatible chat endpoint (vLLM, SGLang, ...).

What is requested: ``OpenAIClient`` POSTs ``{base}/chat/completions`` with ``model``,
``messages``, ``max_tokens``, ``temperature`` and, where the endpoint sets them, ``top_p``,
``seed``, ``stop`` and any ``extra`` fields (vLLM's ``top_k``, ``chat_template_kwargs``, ...);
``logprobs: true`` and vLLM's ``return_token_ids: true`` unless turned off; ``tools`` (``run``
and ``answer``) for action episodes of an endpoint with ``tools`` on; and ``n = k`` when ``k``
attempts of one group ask the same first question at once (an endpoint with ``n`` > 1; see
``farmd.agents.sampling``).

What is read: each choice's ``message.content`` and ``message.tool_calls``, its
``finish_reason``, its sampling logprobs (``logprobs.content[i].logprob``) and token ids
(``token_ids``, or the ``token_id:N`` tokens of vLLM's ``return_tokens_as_token_ids``), the
prompt's token ids (``prompt_token_ids``, top level or on the choice) and ``usage``. What the
server did not return stays absent: no logprob or token id is ever made up.

Retries: each request is bounded by ``request_timeout_s`` and its body by
``max_response_bytes``. Connection failures, timeouts, malformed or oversized responses, 429 and
5xx are retried up to ``max_attempts`` requests in all, with exponential backoff and jitter (a
``Retry-After`` in seconds is honoured, within ``max_backoff_s``); other statuses are not. A 400
to a request holding fields some servers lack (``logprobs``, ``return_token_ids``, ``n``) is
asked once more without them (those the error names, else all) and, if that is answered, the
client remembers not to send them again. Whatever the cause, a request that never got a usable
reply raises ``EndpointError``: the job fails as infrastructure, never as a reward of 0.

One ``OpenAIClient`` per endpoint holds one ``httpx.AsyncClient`` (its connections are reused),
made at the first request and closed by ``aclose``; a ``ClientPool`` shares them between the
agents of a worker, which closes the pool when it stops.

Replicas: an endpoint may be several servers of one model (``farmd.agents.replicas``). Each request goes to the
one with the fewest outstanding; one that stops answering its health checks is taken out and its requests in
flight are asked again of another at once (no backoff: the job goes on). A request to the endpoint's policy model
(``serves`` a policy line, ``policy_model``) is stamped with the version the replica said it had before the request
was sent and still had after its reply came (``replicas.stamp``): ``ChatReply.weight_version``, 0 when it cannot say.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
import time
from collections.abc import Hashable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from farmd import domain, lazy
from farmd.agents.chat import TOOLS, ChatAgent, ChatLimits, Completion, Message
from farmd.agents.replicas import HealthConfig, ReplicaSet, stamp
from farmd.agents.sampling import Coalescer
from farmd.errors import EndpointError, NoReplica, OffloadFailed, ReplicaDown
from farmd.offload import OFFLOAD
from farmd.records import SamplingParams, ToolCall

if TYPE_CHECKING:
    import httpx
else:  # only a farm with model endpoints uses it (0.07 s of every start)
    httpx = lazy.module("httpx")

log = logging.getLogger("farmd.agents.endpoint")

VERSION_FIELD = "{version}"
"""In a model name, replaced by the job's policy version (an inference server that serves one adapter
per policy version, e.g. vLLM LoRA modules named ``farm-v{version}``)."""
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""A reply of 16k tokens with their logprobs is a few MB; past this a body is refused (and retried)."""
OPTIONAL_FIELDS = ("logprobs", "return_token_ids", "n")
"""Request fields a server may refuse with a 400; dropped and remembered rather than failing every job."""
RESERVED_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n",
    "stream", "stream_options", "logprobs", "top_logprobs", "return_token_ids", "tools", "tool_choice",
    "functions", "function_call"})
"""Fields farm sets itself (or whose answer it could not read, like ``stream``): never in ``extra``."""
SEED_MODULUS = 2 ** 31 - 1
"""Seeds stay below it: servers take a signed 32-bit seed at least."""
MAX_STOP = 16
MAX_N = 256
_KEEPALIVE = 128
"""Idle connections kept per endpoint: about a worker's slots, each with a request in flight at most."""
_EXCERPT = 300
PROMPT_TOKEN_SLACK = 4096
"""Prompt token ids a reply may hold beyond the request's own bytes (a chat template's tokens)."""
PARSE_IN_THREAD_BYTES = 64 << 10
"""Replies up to this are parsed in a thread (a few milliseconds of the interpreter); longer ones in a worker
process (``farmd.offload``): ``json.loads`` holds the interpreter for the whole parse, and a thread would hold
farmd's event loop all that time: 30 MB of logprobs took 0.75 s here, 30 MB of nested lists 9 s."""
_TOKEN_ID = re.compile(r"token_id:(\d+)")
T = TypeVar("T")


def base_url(url: str) -> str:
    """``http(s)://host[:port][/path]`` without a trailing slash; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"{url!r}: no host")
    if parts.username or parts.password:
        raise ValueError(f"{url!r}: credentials in the URL are not supported (use key_env)")
    _ = parts.port  # raises ValueError if malformed
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a base URL has no query or fragment")
    return url.rstrip("/")


@dataclass(frozen=True, kw_only=True)
class RequestSettings:
    """What an endpoint's requests ask for and how they are retried: defined once for the operator's
    ``[endpoints.NAME]`` (``NamedEndpoint``) and the settings one agent's requests use (``EndpointConfig``)."""

    api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer`` (read from the environment variable ``key_env`` when the config was
    loaded); never logged, shown or put in the agent's name."""
    temperature: float = 1.0
    """What requests ask for unless a spec says otherwise (0 to 2)."""
    top_p: float | None = None
    """None: not sent (the server's default, 1)."""
    seed: int | None = None
    """Sent with every request: a server that honours it samples the same reply to the same request."""
    stop: tuple[str, ...] = ()
    logprobs: bool = True
    """Ask for the sampled tokens' logprobs (``logprobs: true``; a server that refuses them is remembered and
    asked no more)."""
    token_ids: bool = True
    """Ask for prompt and completion token ids (vLLM's ``return_token_ids: true``; a server that refuses it
    likewise)."""
    n: int = 1
    """The most attempts of one group whose identical first requests are asked as one request for ``n``
    choices (set it to the group size); 1: every attempt asks alone."""
    tools: bool = False
    """Offer action episodes the ``run`` and ``answer`` tools instead of the fenced-block text protocol."""
    extra: dict[str, Any] = field(default_factory=dict, hash=False)  # a dict: left out so the config still hashes
    """Fields merged into every request (vLLM's ``top_k``, ``chat_template_kwargs``, ...); not those farm sets."""
    request_timeout_s: float = 300.0
    """One request, connecting included; a long generation on a busy server is slow, so this is generous."""
    max_attempts: int = 4
    """Requests in all for one reply, the first included."""


REQUEST_SETTINGS = tuple(f.name for f in fields(RequestSettings))


@dataclass(frozen=True, kw_only=True)
class EndpointConfig(RequestSettings):
    """How to reach one model on one OpenAI-compatible server, and what to ask it for."""

    base_url: str
    """The API's base, e.g. ``http://127.0.0.1:8000/v1``; requests go to ``{base_url}/chat/completions``."""
    model: str
    backoff_s: float = 1.0
    """Wait before the first retry; doubled for each next one, times a jitter factor in [0.5, 1]."""
    max_backoff_s: float = 30.0
    max_response_bytes: int = MAX_RESPONSE_BYTES
    coalesce_window_s: float = 0.02
    """How long a group's first request waits for the group's other attempts (``n`` > 1)."""
    replicas: tuple[str, ...] = ()
    """Further servers of the same model, each an API base like ``base_url`` (data-parallel replicas)."""
    health: HealthConfig = field(default_factory=HealthConfig)
    serves: str | None = None
    """The farm policy line whose weights the server's ``policy_model`` has (farmd's weight sync loads them)."""
    policy_model: str | None = None
    """The served model name that is the line's policy: requests for it are stamped with the version read back."""

    def __post_init__(self) -> None:
        base_url(self.base_url)  # ValueError now rather than at the first request
        object.__setattr__(self, "replicas", tuple(base_url(u) for u in self.replicas))
        if self.api_key is not None and (not self.api_key.isprintable() or any(c.isspace() for c in self.api_key)):
            raise ValueError("the API key holds spaces or control characters")  # it goes into a header line
        if not self.model:
            raise ValueError("no model name")
        if self.max_attempts < 1 or self.request_timeout_s <= 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"bad retry settings: attempts={self.max_attempts}, timeout={self.request_timeout_s}s, "
                             f"backoff={self.backoff_s}s, max backoff={self.max_backoff_s}s")
        if self.max_response_bytes < 1 or not 0 <= self.coalesce_window_s <= 1:
            raise ValueError(f"bad bounds: max_response_bytes={self.max_response_bytes}, "
                             f"coalesce_window_s={self.coalesce_window_s}")
        object.__setattr__(self, "stop", tuple(self.stop))
        check_sampling(temperature=self.temperature, top_p=self.top_p, seed=self.seed, stop=self.stop, n=self.n,
                       extra=self.extra)


def check_sampling(*, temperature: float, top_p: float | None, seed: int | None, stop: tuple[str, ...], n: int,
                   extra: dict[str, Any]) -> None:
    """ValueError, saying which and why, for sampling settings no request should carry."""
    if not _number(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a number of at least 0, got {temperature!r}")
    if top_p is not None and (not _number(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be at most {MAX_STOP} non-empty strings, got {stop!r}")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise ValueError(f"n must be an integer from 1 to {MAX_N}, got {n!r}")
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise ValueError(f"extra must be a table of request fields, got {extra!r}")
    reserved = sorted(set(extra) & RESERVED_FIELDS)
    if reserved:
        raise ValueError(f"extra may not set {', '.join(reserved)}: farm sets those itself")
    try:
        json.dumps(extra, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"extra must hold JSON values only: {exc}") from None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Choice:
    """One choice of a reply, as the server sent it (absent fields None)."""

    index: int
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    token_ids: list[int] | None
    logprobs: list[float] | None
    prompt_token_ids: list[int] | None


@dataclass(frozen=True)
class ChatReply:
    """One reply: its choices in ``index`` order."""

    choices: list[Choice]
    usage: dict[str, int]
    """For the whole request: with several choices, every choice's tokens together."""
    prompt_token_ids: list[int] | None
    attempts: int = 1
    """Requests it took."""
    n: int = 1
    """Choices the answered request asked for."""
    seed: int | None = None
    """The seed the answered request carried (a coalesced request carries its first attempt's)."""
    model: str | None = None
    """The model the server says answered."""
    weight_version: int | None = None
    """For a request to the policy model of an endpoint that serves a line: the version the replica had before
    and after it (0: it could not say, or it changed); None for any other request."""


class _Retry(Exception):
    """One request failed in a way a later one may not; ``wait_s`` is the server's hint, if any."""

    def __init__(self, why: str, status: int | None = None, wait_s: float | None = None, *,
                 at_once: bool = False) -> None:
        super().__init__(why)
        self.status = status
        self.wait_s = wait_s
        self.at_once = at_once
        """Ask again without waiting (another replica takes it)."""


class _Refused(Exception):
    """An HTTP 400: the request itself is wrong (maybe a field this server does not know)."""

    def __init__(self, why: str, body: str) -> None:
        super().__init__(why)
        self.body = body


class OpenAIClient:
    """Chat completions against one endpoint, with the retry rules above. Safe to share between tasks.

    Of its config it reads only what is the endpoint's (the URL, the key, timeouts and retries, ``n``
    and the coalescing window), so every agent of one endpoint can share it; requests carry the rest.
    """

    def __init__(self, config: EndpointConfig, replicas: ReplicaSet | None = None) -> None:
        self.config = config
        self.url = base_url(config.base_url)
        self._own_replicas = replicas is None
        self.replicas = replicas or ReplicaSet(self.url, (self.url, *config.replicas), config.health)
        self.unsupported: set[str] = set()
        """Request fields this server refused (``OPTIONAL_FIELDS``): no longer sent."""
        self._http: httpx.AsyncClient | None = None
        self._closed = False
        self._jitter = random.Random()
        self._coalescer: Coalescer[ChatReply] = Coalescer(window_s=config.coalesce_window_s, max_n=config.n)

    async def aclose(self) -> None:
        """Cancel coalesced requests in flight and close the connections; later requests raise EndpointError."""
        self._closed = True
        await self._coalescer.aclose()
        if self._own_replicas:
            await self.replicas.aclose()
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    def _client(self) -> httpx.AsyncClient:
        if self._closed:
            raise EndpointError(f"{self.url}: the client is closed (farmd is stopping)", attempts=0)
        if self._http is None:
            cfg = self.config
            headers = {"User-Agent": "farmd", "Content-Type": "application/json", "Accept": "application/json"}
            if cfg.api_key:
                headers["Authorization"] = f"Bearer {cfg.api_key}"
            # trust_env off: proxies and certificates come from the config, never from the environment.
            self._http = httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(cfg.request_timeout_s), trust_env=False,
                follow_redirects=False,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=_KEEPALIVE, keepalive_expiry=30))
        return self._http

    async def sample(self, payload: dict[str, Any], group: Hashable | None = None) -> tuple[ChatReply, int]:
        """A reply to ``payload`` and which of its choices is this caller's.

        With ``group`` (an attempt's first request) on an endpoint with ``n`` > 1, concurrent identical
        requests of one group are one request for several choices; should the server give fewer choices
        than asked, a caller left without one asks alone.
        """
        if group is None or self.config.n <= 1 or "n" in self.unsupported:
            return await self.chat(payload), 0
        # Attempts differ by their seed alone (each has its own): one request carries the first one's,
        # and its n choices are distinct samples all the same.
        key = (group, json.dumps({k: v for k, v in payload.items() if k != "seed"}, sort_keys=True))
        reply, index = await self._coalescer.join(key, lambda n: self.chat({**payload, "n": n} if n > 1 else payload))
        if index < len(reply.choices):
            return reply, index
        return await self.chat(payload), 0

    async def chat(self, payload: dict[str, Any]) -> ChatReply:
        """One reply to ``payload`` (retried as the module says); EndpointError when there is none."""
        cfg = self.config
        sent = {k: v for k, v in payload.items() if k not in self.unsupported}
        dropped: list[str] = []
        requests = failures = 0
        while True:
            requests += 1
            try:
                reply = await self._request(sent)
            except _Refused as exc:
                droppable = [] if dropped else [f for f in OPTIONAL_FIELDS if f in sent]
                if not droppable:
                    raise EndpointError(f"{self.url} (model {sent['model']}): {exc}; not retried", status=400,
                                        attempts=requests, transient=False) from None
                dropped = [f for f in droppable if re.search(rf"\b{f}\b", exc.body)] or droppable
                log.warning("endpoint %s refused a request (%s); asking again without %s", self.url, exc,
                            ", ".join(dropped))
                sent = {k: v for k, v in sent.items() if k not in dropped}
                continue
            except EndpointError as exc:
                exc.attempts = requests
                raise
            except _Retry as exc:
                failures += 1
                log.warning("endpoint %s model %s: attempt %d/%d failed: %s", self.url, sent["model"], failures,
                            cfg.max_attempts, exc)
                if failures >= cfg.max_attempts:
                    raise EndpointError(f"{self.url} (model {sent['model']}): no reply after {failures} attempts; "
                                        f"last: {exc}", status=exc.status, attempts=requests, transient=True) from None
                await asyncio.sleep(0 if exc.at_once else self._backoff(failures, exc.wait_s))
                continue
            if dropped and not set(dropped) <= self.unsupported:
                self.unsupported.update(dropped)
                log.warning("endpoint %s does not take %s: no longer asked for (its turns record no logprobs "
                            "or token ids it did not return)", self.url, ", ".join(dropped))
            return replace(reply, attempts=requests, n=int(sent.get("n", 1)), seed=sent.get("seed"))

    def stamps(self, model: object) -> bool:
        """Whether a request for ``model`` is one of the served policy's (and so stamped with its version)."""
        cfg = self.config
        return cfg.serves is not None and cfg.policy_model is not None and model == cfg.policy_model

    def _backoff(self, retry: int, hint_s: float | None) -> float:
        cfg = self.config
        wait = min(cfg.max_backoff_s, cfg.backoff_s * 2.0 ** (retry - 1)) * self._jitter.uniform(0.5, 1.0)
        if hint_s is not None:
            wait = max(wait, min(hint_s, cfg.max_backoff_s))
        return wait

    async def _request(self, payload: dict[str, Any]) -> ChatReply:
        timeout = self.config.request_timeout_s
        # Not httpx's encoder: it refuses the lone surrogates a model's reply may hold, which json escapes.
        body = json.dumps(payload).encode()
        stamped = self.stamps(payload.get("model"))
        before: str | None = None
        try:
            async with self.replicas.use() as replica:
                if stamped:
                    before = replica.label if replica.label is not None else await self.replicas.label_now(replica)
                try:
                    async with asyncio.timeout(timeout):
                        response, data = await self._post(replica.url, body)
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    self.replicas.failed(replica, f"cannot connect to it: {exc or type(exc).__name__}")
                    raise
                mark = self.replicas.mark()
        except ReplicaDown as exc:
            raise _Retry(str(exc), at_once=True) from None
        except NoReplica as exc:
            raise _Retry(str(exc)) from None
        except (TimeoutError, httpx.TimeoutException) as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise _Retry(f"cannot connect to {replica.url}: no connection within {timeout:g}s") from None
            raise _Retry(f"no response within {timeout:g}s from {replica.url}") from None
        except httpx.ConnectError as exc:
            raise _Retry(f"cannot connect to {replica.url}: {exc or type(exc).__name__}") from None
        except httpx.HTTPError as exc:  # a reset, a malformed or cut response, an undecodable body
            raise _Retry(f"{type(exc).__name__}: {exc}") from None
        reply = await self._read(payload, body, response, data)
        if stamped:
            # Read after the reply: the label this replica has now, on a read that began after the reply came.
            after = await self.replicas.label_after(replica, mark)
            reply = replace(reply, weight_version=stamp(self.config.serves or "", before, after))
            if not reply.weight_version:
                log.debug("a reply of %s stamped 0: its weight label was %r before and %r after", replica.url, before,
                          after, extra={"event": "unstamped", "before": before, "after": after})
        return reply

    async def _read(self, payload: dict[str, Any], body: bytes, response: httpx.Response, data: bytes) -> ChatReply:
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Retry(_describe(response, data), status, _retry_after(response))
        if status == 400:
            raise _Refused(_describe(response, data), data[:4096].decode("utf-8", "replace"))
        if status != 200:
            raise EndpointError(f"{self.url} (model {payload['model']}): {_describe(response, data)}; not retried",
                                status=status, attempts=1, transient=False)
        try:
            # Up to max_response_bytes of JSON from a server farm does not control: read where it cannot hold
            # the event loop (a large or deeply nested reply would stall every box's timer and the API).
            max_tokens = payload.get("max_tokens")
            return await read_reply_off_loop(data, max_tokens if isinstance(max_tokens, int) else None,
                                             len(body) + PROMPT_TOKEN_SLACK)
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
            # A proxy or an overloaded server can answer 200 with junk; another request may do better.
            raise _Retry(f"a malformed response ({type(exc).__name__}: {exc}): {_excerpt(data)}", status) from None
        except OffloadFailed as exc:
            raise _Retry(f"the response ({len(data)} bytes) could not be read: {exc}", status) from None

    async def _post(self, url: str, body: bytes) -> tuple[httpx.Response, bytes]:
        bound = self.config.max_response_bytes
        async with self._client().stream("POST", f"{url}/chat/completions", content=body) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > bound:
                raise _Retry(f"a response body of {declared} bytes (the bound is {bound})", response.status_code)
            data = bytearray()
            async for chunk in response.aiter_bytes():  # decoded: a compressed body is bounded as it unpacks
                data += chunk
                if len(data) > bound:
                    raise _Retry(f"a response body over the bound of {bound} bytes", response.status_code)
            return response, bytes(data)


async def read_reply_off_loop(data: bytes, max_tokens: int | None = None, max_prompt_tokens: int | None = None
                              ) -> ChatReply:
    """``read_reply``, in a thread for a small reply and in a worker process for a large one."""
    if len(data) <= PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(read_reply, data, max_tokens, max_prompt_tokens)
    return await OFFLOAD.run(read_reply, data, max_tokens, max_prompt_tokens)


def read_reply(data: bytes, max_tokens: int | None = None, max_prompt_tokens: int | None = None) -> ChatReply:
    """A chat completion's JSON as a ``ChatReply``; ValueError/TypeError/KeyError when it is not one.

    Logprobs or token ids that are missing or malformed are left out (None), never repaired into values. So
    are those longer than the request allowed (``max_tokens`` a choice; ``max_prompt_tokens``, the request's
    own size, its prompt): a server's reply decides no more of what farmd keeps than the request did. A
    choice's text is kept up to ``reply_text_bound(max_tokens)`` characters (the agent cuts it shorter). Ones
    that are there but out of their domain (``farmd.domain``: a token id negative or past int32, a logprob NaN,
    infinite or above 0) are the server's failure, never the attempt's: ValueError, so the request is retried
    and, failing that, the rollout fails as infrastructure, never stored with them.
    """
    reply = json.loads(data)
    raw_choices = reply["choices"]
    if not isinstance(raw_choices, list) or not raw_choices:
        raise ValueError("no choices")
    choices = sorted((_read_choice(raw, position, max_tokens, max_prompt_tokens)
                      for position, raw in enumerate(raw_choices)), key=lambda c: c.index)
    raw_usage = reply.get("usage") or {}
    usage = {k: v for k, v in raw_usage.items() if isinstance(v, int) and not isinstance(v, bool)} \
        if isinstance(raw_usage, dict) else {}
    for key, count in usage.items():  # counts a record sums over turns: each well inside int64
        if not 0 <= count < domain.TOKEN_ID_BOUND:
            raise ValueError(f"the reply's usage.{key[:40]} is {count}: a count of tokens is from 0 to 2**31")
    model = reply.get("model")
    return ChatReply(choices=choices, usage=usage,
                     prompt_token_ids=_bounded(_ids(reply.get("prompt_token_ids")), max_prompt_tokens, "prompt"),
                     model=model[:256] if isinstance(model, str) else None)


def reply_text_bound(max_tokens: int | None) -> int:
    """The most of a choice's text ``read_reply`` keeps: far more than any agent keeps of a reply."""
    return max(1 << 22, 64 * (max_tokens or 0))


def _bounded(values: list[T] | None, bound: int | None, what: str) -> list[T] | None:
    if values is None or bound is None or len(values) <= bound:
        return values
    log.warning("a reply's %s has %d tokens where the request allows %d: they are not kept", what, len(values),
                bound, extra={"event": "reply_over_bound"})
    return None


def _read_choice(raw: Any, position: int, max_tokens: int | None = None, max_prompt_tokens: int | None = None
                 ) -> Choice:
    message = raw["message"]
    content = message.get("content")
    if content is None:
        content = ""  # a reply of only reasoning or tool calls has no text: the policy said nothing
    if not isinstance(content, str):
        raise TypeError(f"message content is {type(content).__name__}, not text")
    content = content[:reply_text_bound(max_tokens)]
    index = raw.get("index", position)
    finish = raw.get("finish_reason")
    logprobs, tokens = _logprobs(raw.get("logprobs"))
    logprobs = _bounded(logprobs, max_tokens, "logprobs")
    tokens = tokens if logprobs is not None else None
    token_ids = _bounded(_ids(raw.get("token_ids")), max_tokens, "token ids")
    if token_ids is None and tokens:
        # vLLM's return_tokens_as_token_ids: every sampled token is written "token_id:N".
        matched = [_TOKEN_ID.fullmatch(t) for t in tokens]
        token_ids = [int(m.group(1)) for m in matched if m] if all(matched) else None
    _in_domain(domain.token_ids_problem(token_ids or [], f"choice {position}'s token_ids"))
    _in_domain(domain.logprobs_problem(logprobs or [], f"choice {position}'s logprobs"))
    if logprobs is not None and token_ids is not None and len(logprobs) != len(token_ids):
        log.warning("a reply's %d logprobs do not match its %d token ids: its logprobs are not kept",
                    len(logprobs), len(token_ids))
        logprobs = None
    return Choice(index=index if isinstance(index, int) and not isinstance(index, bool) else position,
                  text=content, tool_calls=_tool_calls(message.get("tool_calls")),
                  finish_reason=finish if isinstance(finish, str) else None, token_ids=token_ids,
                  logprobs=logprobs, prompt_token_ids=_bounded(_ids(raw.get("prompt_token_ids")), max_prompt_tokens,
                                                               "prompt"))


def _ids(value: Any) -> list[int] | None:
    """Token ids as sent (None: absent, or not a list of integers); an integer out of range is ``_in_domain``'s."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    _in_domain(domain.token_ids_problem(value, "prompt_token_ids"))
    return value


def _in_domain(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(f"the reply's {problem}: a model server sends token ids in [0, 2**31) and logprobs of "
                         "sampled tokens, finite and at most 0")


def _logprobs(value: Any) -> tuple[list[float] | None, list[str] | None]:
    """The sampled tokens' logprobs and their tokens (``logprobs.content``); None when not both well formed."""
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(content, list):
        return None, None
    logprobs: list[float] = []
    tokens: list[str] = []
    for entry in content:
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(lp, int | float) or isinstance(lp, bool):
            return None, None  # NaN, infinities and positive ones are kept for read_reply to refuse
        logprobs.append(float(lp))
        token = entry.get("token")
        tokens.append(token if isinstance(token, str) else "")
    return logprobs, tokens


def _tool_calls(value: Any) -> list[ToolCall]:
    if not value:
        return []
    if not isinstance(value, list):
        raise TypeError(f"tool_calls is {type(value).__name__}, not a list")
    calls = []
    for raw in value:
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict):
            raise TypeError("a tool call without a function")
        name, arguments, call_id = function.get("name"), function.get("arguments"), raw.get("id")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments)  # some servers send the object itself: keep it as text
        calls.append(ToolCall(id=call_id if isinstance(call_id, str) else "",
                              name=name if isinstance(name, str) else "", arguments=arguments or ""))
    return calls


def _retry_after(response: httpx.Response) -> float | None:
    try:
        value = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None  # an HTTP date: rare from inference servers, and the backoff covers it
    return value if value >= 0 and math.isfinite(value) else None


def _excerpt(body: bytes) -> str:
    return json.dumps(body[:_EXCERPT].decode("utf-8", "replace"))


def _describe(response: httpx.Response, body: bytes) -> str:
    return f"HTTP {response.status_code} {response.reason_phrase}: {_excerpt(body)}"


class ClientPool:
    """One ``OpenAIClient`` per named endpoint, shared by every agent that names it: one set of connections,
    one memory of what the server refuses, one coalescer. Whoever makes the pool closes it."""

    def __init__(self, replicas: dict[str, ReplicaSet] | None = None) -> None:
        self._clients: dict[str, OpenAIClient] = {}
        self.replicas = replicas
        """Each endpoint's replicas when someone else keeps them (the daemon's, shared with its weight sync);
        None: each client keeps its own."""

    def client(self, name: str, config: EndpointConfig) -> OpenAIClient:
        found = self._clients.get(name)
        if found is None:
            shared = self.replicas.get(name) if self.replicas is not None else None
            found = self._clients[name] = OpenAIClient(config, shared)
        return found

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.aclose() for c in clients))


class OpenAIAgent(ChatAgent):
    """A ``ChatAgent`` whose model is served by an OpenAI-compatible endpoint (``openai:MODEL@ENDPOINT``).

    With ``client`` (a ``ClientPool``'s) the agent shares it and leaves closing it to the pool;
    without, it makes its own, which ``aclose`` closes.
    """

    def __init__(self, config: EndpointConfig, *, limits: ChatLimits | None = None,
                 client: OpenAIClient | None = None) -> None:
        super().__init__(limits=limits)
        self.config = config
        self._own_client = client is None
        self.client = client or OpenAIClient(config)
        self.tools = config.tools
        self.name = f"openai:{config.model}@{self.client.url}"

    async def aclose(self) -> None:
        if self._own_client:
            await self.client.aclose()

    def _stamp(self, reply: ChatReply, model: str, policy_version: int) -> int | None:
        """The policy version this reply was sampled with, as its server said: the replica's weight label around
        the request (``ChatReply.weight_version``) for the served policy model; for a model named by version (one
        LoRA adapter per version) the job's version when the server says that adapter answered; 0 for any other
        model of an endpoint that serves a line; None (the job's own, 0) for an endpoint that serves none."""
        client = self.client
        if client.config.serves is None:
            return None
        if reply.weight_version is not None:
            return reply.weight_version
        if VERSION_FIELD in self.config.model and client.config.policy_model == self.config.model:
            return policy_version if reply.model == model else 0
        return 0

    def model_for(self, policy_version: int) -> str:
        return self.config.model.replace(VERSION_FIELD, str(policy_version))

    def sampling(self, policy_version: int, rollout_id: int = 0) -> SamplingParams:
        cfg = self.config
        return SamplingParams(model=self.model_for(policy_version), temperature=float(cfg.temperature),
                              top_p=1.0 if cfg.top_p is None else float(cfg.top_p), max_tokens=self.limits.max_tokens,
                              seed=self.attempt_seed(rollout_id), stop=list(cfg.stop), n=1, extra=dict(cfg.extra))

    def attempt_seed(self, rollout_id: int) -> int | None:
        """The seed of one attempt's requests: the endpoint's ``seed`` offset by the rollout's id. One seed for
        every attempt would make a group's attempts one sample repeated (no variance, nothing to learn);
        this way each differs, and a retried rollout asks again with its own."""
        if self.config.seed is None:
            return None
        return (self.config.seed + rollout_id) % SEED_MODULUS

    def payload(self, messages: list[Message], *, max_tokens: int, policy_version: int,
                tools: bool = False, seed: int | None = None) -> dict[str, Any]:
        """The request body for ``messages`` (before the client drops what its server refused)."""
        cfg = self.config
        payload: dict[str, Any] = {**cfg.extra, "model": self.model_for(policy_version), "messages": messages,
                                   "max_tokens": max_tokens, "temperature": cfg.temperature}
        if cfg.top_p is not None:
            payload["top_p"] = cfg.top_p
        if seed is not None:
            payload["seed"] = seed
        if cfg.stop:
            payload["stop"] = list(cfg.stop)
        if cfg.logprobs:
            payload["logprobs"] = True
        if cfg.token_ids:
            payload["return_token_ids"] = True
        if tools:
            payload["tools"] = TOOLS
        return payload

    async def complete(self, messages: list[Message], *, max_tokens: int, policy_version: int, tools: bool = False,
                       group: Hashable | None = None, seed: int | None = None) -> Completion:
        started = time.monotonic()
        payload = self.payload(messages, max_tokens=max_tokens, policy_version=policy_version, tools=tools, seed=seed)
        reply, index = await self.client.sample(payload, group)
        choice = reply.choices[index]
        return Completion(policy_version=self._stamp(reply, payload["model"], policy_version),
            text=choice.text, usage=_usage(reply, choice), finish_reason=choice.finish_reason,
            attempts=reply.attempts, token_ids=choice.token_ids,
            prompt_token_ids=choice.prompt_token_ids if choice.prompt_token_ids is not None else reply.prompt_token_ids,
            logprobs=choice.logprobs, latency=time.monotonic() - started, tool_calls=choice.tool_calls,
            choice_index=index, n=reply.n, seed=reply.seed)


def _usage(reply: ChatReply, choice: Choice) -> dict[str, int]:
    """One choice's token counts. The server counts the request: with several choices each is charged the
    prompt once and its own completion tokens where its ids say so, else an even share."""
    if len(reply.choices) == 1:
        return dict(reply.usage)
    usage = {}
    prompt = reply.usage.get("prompt_tokens")
    completion = len(choice.token_ids) if choice.token_ids is not None else None
    if completion is None and "completion_tokens" in reply.usage:
        completion = reply.usage["completion_tokens"] // len(reply.choices)
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    if completion is not None:
        usage["completion_tokens"] = completion
    if prompt is not None and completion is not None:
        usage["total_tokens"] = prompt + completion
    return usage
