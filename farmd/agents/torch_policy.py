"""``torch:NAME`` agents: farm's own policy (``farm_client.tinylm``), sampled on the worker node in batches.

A trainer publishes a policy as bytes to the line NAME; a job of agent ``torch:NAME`` is leased with
the version it must sample from (``policy_version``). ``TorchAgent.attempt`` resolves that version
to its content hash through a ``PolicySource`` (the scheduler's ``Policies``, handed in: agents do
not import the scheduler), loads the model once per hash, tokenizes ``task.prompt`` exactly as it is
and samples one completion seeded by the rollout id: a retried rollout samples the same completion,
the rollouts of a group differ.

``TorchRuntime`` is what every torch agent of one worker shares:

- **one thread** for all torch work (a ``ThreadPoolExecutor`` of one worker), so loading and sampling
  never run two at a time, and never on the event loop. That thread sets ``torch.set_num_threads``
  once, as it starts (default 1): the trainer runs beside farmd on the same few cores, and torch's
  default (one intra-op thread per core) would have farmd's sampling fight the trainer's steps (and
  the boxes) for every core; the batch, not threads, is where sampling's speed comes from.
- **a cache of loaded models** keyed by content hash: an LRU of a few, each fetched and loaded once
  however many rollouts ask at once (one in-flight task per hash; a cancelled asker does not cancel it).
  The content's sha256 is checked before it is loaded; loading never runs code from it.
- **a ``Batcher`` per (model, temperature, max_tokens)**: rollouts queue their prompts, and one
  ``tinylm.sample`` call in the torch thread answers up to ``max_batch`` of them. While a batch is
  sampled, new requests queue; when it ends the next batch takes everything waiting. There is no
  window to wait out: a batch starts one loop turn after its first request, so callers that arrive
  together go together, and under load batches grow by themselves. Sampling draws each row's noise
  from its own seed, so a rollout samples the same completion whatever shares its batch.

What the policy cannot do is an ``EndpointError`` that is not transient (the scheduler fails the
job at once): no such version, content that does not hash to its version's hash, a blob that is no
policy, a prompt with a character outside the policy's vocabulary or longer than its positions.
A failure of sampling itself is transient. torch is imported on first use, in the torch thread,
so importing farmd (``farmctl``, a node with no torch jobs) never pays for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from farmd import domain
from farmd.agents.base import Agent, AgentResult, Step
from farmd.envs.base import Attempt, Episode, Task
from farmd.errors import AgentError, BadRequest, EndpointError, FarmError, NotFound
from farmd.records import ChatMessage, SamplingParams, Turn, Usage

if TYPE_CHECKING:
    from farm_client.tinylm import Sampled, TinyLM

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

DEFAULT_TEMPERATURE = 1.0
MAX_TEMPERATURE = 2.0
DEFAULT_MAX_TOKENS = 16
MAX_MAX_TOKENS = 1024
"""Characters per completion a spec may ask for (the model's positions bound it too)."""
DEFAULT_MAX_BATCH = 512
DEFAULT_MODELS_KEPT = 4
"""Loaded policies kept: the current version, the one before it (jobs leased before a publish), spare."""
_VERSIONS_KEPT = 4096
"""Version -> hash entries kept (immutable, 64 characters each; a publish every step adds one)."""


class PolicySource(Protocol):
    """What a torch agent needs of the farm's published policies (``farmd.scheduler.policies.Policies``)."""

    async def sha256_of(self, version: int) -> str:
        """The content hash of published version ``version``; ``NotFound`` when there is none."""
        ...

    async def content(self, sha256: str) -> bytes:
        """The whole content of the policy hashed ``sha256``."""
        ...

    def known_sha256(self, version: int) -> str | None:
        """``version``'s content hash when it is known without asking anyone (None: ``sha256_of`` finds out)."""
        ...


@dataclass(slots=True)
class _Request:
    prompt: list[int]
    seed: int
    future: asyncio.Future[Sampled]


class Batcher:
    """Samples the requests of one model at one temperature and ``max_tokens`` in batches (see the module)."""

    def __init__(self, model: TinyLM, run: Callable[[Callable[[], list[Sampled]]], Awaitable[list[Sampled]]], *,
                 label: str, temperature: float, max_tokens: int, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        self.model = model
        self._run = run
        """Runs a function in the torch thread."""
        self.label = label
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_batch = max_batch
        self._waiting: list[_Request] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0
        """``tinylm.sample`` calls made (failed ones too)."""
        self.sampled = 0
        """Rows sampled."""

    async def sample(self, prompt: list[int], seed: int) -> Sampled:
        """``prompt``'s completion, sampled with ``seed`` in the next batch. A caller cancelled while it waits
        leaves the batch to the others (its row is skipped if the batch has not started)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sampled] = loop.create_future()
        self._waiting.append(_Request(prompt, seed, future))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain(), name=f"torch-batcher {self.label}")
        return await future

    async def _drain(self) -> None:
        batch: list[_Request] = []
        try:
            await asyncio.sleep(0)  # one loop turn: callers that arrive together join the first batch
            while self._waiting:
                live = [r for r in self._waiting if not r.future.done()]  # callers cancelled while waiting left
                batch, self._waiting = live[:self.max_batch], live[self.max_batch:]
                if batch:
                    await self._sample(batch)
                batch = []
        finally:
            # Only a cancelled drainer (the loop closing) leaves requests behind: none may wait forever.
            self._drainer = None
            stranded, self._waiting = batch + self._waiting, []
            for r in stranded:
                if not r.future.done():
                    r.future.set_exception(EndpointError(f"{self.label}: sampling was stopped"))

    async def _sample(self, batch: list[_Request]) -> None:
        from farm_client import tinylm

        call = functools.partial(tinylm.sample, self.model, [r.prompt for r in batch], max_new_tokens=self.max_tokens,
                                 temperature=self.temperature, seeds=[r.seed for r in batch])
        self.batches += 1
        try:
            results = await self._run(call)
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} completions for {len(batch)} prompts")
        except EndpointError as exc:
            _fail(batch, exc)
            return
        except Exception as exc:  # a bug or an exhausted machine: the rollouts may succeed later
            _fail(batch, EndpointError(f"{self.label}: sampling failed: {type(exc).__name__}: {exc}"[:1000]))
            return
        self.sampled += len(batch)
        for r, result in zip(batch, results, strict=True):
            if not r.future.done():  # a caller cancelled in the meantime
                r.future.set_result(result)


def _fail(batch: list[_Request], exc: BaseException) -> None:
    for r in batch:
        if not r.future.done():
            r.future.set_exception(exc)


class LoadedPolicy:
    """One published policy, loaded: its model, and a batcher per (temperature, max_tokens) asked for."""

    def __init__(self, sha256: str, model: TinyLM, runtime: TorchRuntime) -> None:
        self.sha256 = sha256
        self.model = model
        self._runtime = runtime
        self._batchers: dict[tuple[float, int], Batcher] = {}
        """One per sampling setting a spec asked for (a handful); they go when the policy leaves the cache."""

    @property
    def vocab(self) -> str:
        return self.model.config.vocab

    def batcher(self, temperature: float, max_tokens: int) -> Batcher:
        key = (temperature, max_tokens)
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = Batcher(
                self.model, self._runtime.in_thread, label=f"policy {self.sha256[:12]}", temperature=temperature,
                max_tokens=max_tokens, max_batch=self._runtime.max_batch)
        return batcher


class _Once(Generic[K, T]):
    """One in-flight task per key, shared by everyone asking while it runs; a cancelled asker does not
    cancel it. Results are not kept here (the caller caches what it wants); a failure is not either."""

    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Task[T]] = {}

    async def run(self, key: K, make: Callable[[], Coroutine[object, object, T]]) -> T:
        return await asyncio.shield(self.start(key, make))

    def start(self, key: K, make: Callable[[], Coroutine[object, object, T]]) -> asyncio.Task[T]:
        """``key``'s task, started now unless it is running."""
        task = self._tasks.get(key)
        if task is None:
            task = self._tasks[key] = asyncio.get_running_loop().create_task(make())
            task.add_done_callback(functools.partial(self._done, key))
        return task

    def _done(self, key: K, task: asyncio.Task[T]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # retrieved: an error whose askers all left is not logged as never retrieved


class TorchRuntime:
    """What a worker's torch agents share: the policy source, the torch thread, the loaded models.

    Owned by the worker (``aclose`` on stop); ``threads`` is torch's intra-op thread count, set once in
    the torch thread (see the module on why one is the default).
    """

    def __init__(self, policies: PolicySource, *, threads: int = 1, max_batch: int = DEFAULT_MAX_BATCH,
                 models_kept: int = DEFAULT_MODELS_KEPT) -> None:
        if threads < 1 or max_batch < 1 or models_kept < 1:
            raise ValueError("threads, max_batch and models_kept must be positive")
        self.policies = policies
        self.threads = threads
        self.max_batch = max_batch
        self.models_kept = models_kept
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._versions: OrderedDict[int, str] = OrderedDict()
        self._models: OrderedDict[str, LoadedPolicy] = OrderedDict()
        self._lookups: _Once[int, str] = _Once()
        self._loads: _Once[str, LoadedPolicy] = _Once()
        self.loads = 0
        """Policies fetched and loaded (a hash is loaded again only after it left the cache)."""

    async def in_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the torch thread (one at a time, in the order asked)."""
        if self._closed:
            raise EndpointError("the torch runtime is closed (the worker is stopping)")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="farmd-torch", initializer=_init_torch, initargs=(self.threads,))
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def policy(self, version: int, name: str) -> LoadedPolicy:
        """Version ``version`` of line ``name``, loaded. ``EndpointError`` (not transient) when there is no
        such version or its content is no policy."""
        if version <= 0:
            raise EndpointError(f"no policy named {name!r} has been published", transient=False)
        sha256 = await self.sha256_of(version, name)
        loaded = self._models.get(sha256)
        if loaded is None:
            loaded = await self._loads.run(sha256, lambda: self._load(sha256, version, name))
        else:
            self._models.move_to_end(sha256)
        return loaded

    def prefetch(self, version: int, name: str) -> None:
        """Start loading version ``version`` of line ``name`` now, when its hash is known without asking and it is
        neither loaded nor loading: a publish's first rollouts all wait on its load, and one begun before they
        start runs beside their setup (hundreds of rollouts made ready one after another on the event loop)
        rather than after it. A failure is left to the attempts, which load it again and meet it."""
        if version <= 0 or self._closed:
            return
        sha256 = self._versions.get(version) or self.policies.known_sha256(version)
        if sha256 is None or sha256 in self._models:
            return
        self._remember(version, sha256)
        self._loads.start(sha256, lambda: self._load(sha256, version, name))

    async def sha256_of(self, version: int, name: str) -> str:
        sha256 = self._versions.get(version)
        if sha256 is None:
            sha256 = await self._lookups.run(version, lambda: self._lookup(version, name))
            self._remember(version, sha256)
        return sha256

    def _remember(self, version: int, sha256: str) -> None:
        self._versions[version] = sha256
        while len(self._versions) > _VERSIONS_KEPT:
            self._versions.popitem(last=False)

    async def _lookup(self, version: int, name: str) -> str:
        try:
            return await self.policies.sha256_of(version)
        except NotFound:
            raise EndpointError(f"policy {name!r}: version {version} not found", transient=False) from None
        except FarmError as exc:
            raise EndpointError(f"policy {name!r}: version {version} could not be looked up: {exc}") from exc

    async def _load(self, sha256: str, version: int, name: str) -> LoadedPolicy:
        label = f"policy {name!r} version {version} ({sha256[:12]})"
        try:
            blob = await self.policies.content(sha256)
        except FarmError as exc:
            # NotFound, a policy too large to load: no retry changes them. The store failing might pass.
            transient = not isinstance(exc, NotFound | BadRequest)
            raise EndpointError(f"{label}: its content could not be read: {exc}", transient=transient) from exc
        model = await self.in_thread(functools.partial(_check_and_load, blob, sha256, label))
        self.loads += 1
        loaded = LoadedPolicy(sha256, model, self)
        self._models[sha256] = loaded
        while len(self._models) > self.models_kept:
            self._models.popitem(last=False)  # rollouts holding it finish with it; new ones load it again
        return loaded

    def loaded_versions(self) -> list[int]:
        """The policy versions loaded now (what a node reports it holds)."""
        return sorted(v for v, sha in self._versions.items() if sha in self._models)

    def loaded(self, sha256: str) -> LoadedPolicy | None:
        return self._models.get(sha256)

    async def aclose(self) -> None:
        """No more torch work; a batch being sampled ends in its thread (its callers are gone by now)."""
        self._closed = True
        self._models.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _init_torch(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _check_and_load(blob: bytes, sha256: str, label: str) -> TinyLM:
    """In the torch thread: the content's hash, then the model (``PolicyFormatError`` for anything else)."""
    from farm_client import tinylm

    actual = hashlib.sha256(blob).hexdigest()
    if actual != sha256:
        raise EndpointError(f"{label}: its content ({len(blob)} bytes) hashes to {actual[:12]}, not {sha256[:12]} "
                            "(a policy published as a uri alone has no content a worker can load)", transient=False)
    try:
        return tinylm.load(blob)
    except tinylm.PolicyFormatError as exc:
        raise EndpointError(f"{label} is not a tinylm policy this worker can load: {exc}", transient=False) from None


def _check_sampled(label: str, sampled: Sampled, vocab: int) -> None:
    """The policy's own output in its domain (``farmd.domain``): token ids in its vocabulary, logprobs finite and
    at most 0. Weights that went NaN sample nonsense: the policy's failure, never the attempt's (EndpointError,
    retried as infrastructure), and never stored."""
    problem = domain.token_ids_problem(sampled.token_ids, "token_ids", vocab) \
        or domain.logprobs_problem(sampled.logprobs, "logprobs")
    if problem is None and len(sampled.logprobs) != len(sampled.token_ids):
        problem = f"{len(sampled.token_ids)} token ids and {len(sampled.logprobs)} logprobs"
    if problem is not None:
        raise EndpointError(f"{label}: the policy sampled out of its domain: {problem}")


def check_options(temperature: float, max_tokens: int) -> None:
    """``ValueError`` for sampling options a torch agent does not take."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not math.isfinite(temperature) \
            or not 0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be a number from 0 to {MAX_TEMPERATURE:g}, got {temperature!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_MAX_TOKENS:
        raise ValueError(f"max_tokens must be an integer from 1 to {MAX_MAX_TOKENS}, got {max_tokens!r}")


class TorchAgent(Agent):
    """Answers submission tasks with one completion of the policy version its job was leased with.

    ``runtime``: the worker's (shared by its torch agents). ``owns_runtime``: close it in ``aclose``
    (an agent made alone, with a runtime of its own).
    """

    def __init__(self, policy: str, runtime: TorchRuntime, *, temperature: float = DEFAULT_TEMPERATURE,
                 max_tokens: int = DEFAULT_MAX_TOKENS, owns_runtime: bool = False) -> None:
        check_options(temperature, max_tokens)
        self.policy = policy
        self.runtime = runtime
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self._owns_runtime = owns_runtime
        self.name = f"torch:{policy}"

    def prepare(self, policy_version: int) -> None:
        self.runtime.prefetch(policy_version, self.policy)

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        if task.kind == "actions" or episode is not None:
            raise AgentError(f"{self.name}: torch agents answer submission tasks only; {task.env} is an "
                             "action environment")
        started = time.monotonic()
        loaded = await self.runtime.policy(policy_version, self.policy)
        prompt = self._prompt(loaded, task)
        asked = time.monotonic()
        sampled = await loaded.batcher(self.temperature, self.max_tokens).sample(prompt, rollout_id)
        ended = time.monotonic()
        _check_sampled(self.name, sampled, loaded.model.config.vocab_size)
        text = loaded.model.tokenizer.decode(sampled.token_ids)
        usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(sampled.token_ids),
                      total_tokens=len(prompt) + len(sampled.token_ids), requests=1)
        turn = Turn(message_index=1, prompt_messages=1, completion=text, prompt_token_ids=prompt,
                    token_ids=list(sampled.token_ids), logprobs=list(sampled.logprobs), has_logprobs=True,
                    finish_reason=sampled.finish_reason, usage=usage, latency=ended - asked)
        return AgentResult(
            attempt=Attempt(final=text), steps=[Step(text, None, None, ended - started)],
            usage={"requests": 1, "retries": 0, "prompt_tokens": usage.prompt_tokens,
                   "completion_tokens": usage.completion_tokens, "total_tokens": usage.total_tokens,
                   **({"truncated_replies": 1} if sampled.finish_reason == "length" else {})},
            transcript=[ChatMessage(role="user", content=task.prompt), ChatMessage(role="assistant", content=text)],
            turns=[turn],
            sampling=SamplingParams(model=f"torch:{self.policy}@{loaded.sha256[:12]}", temperature=self.temperature,
                                    top_p=1.0, max_tokens=self.max_tokens, seed=rollout_id, n=1))

    def _prompt(self, loaded: LoadedPolicy, task: Task) -> list[int]:
        """The prompt's token ids: ``task.prompt`` exactly, as the policy reads it."""
        vocab = loaded.vocab
        missing = next((ch for ch in task.prompt if ch not in vocab), None)
        if missing is not None:
            raise EndpointError(f"{self.name}: the prompt holds {missing!r}, which is not in the policy's vocabulary "
                                f"{vocab!r}: this policy cannot read {task.env}'s prompts", transient=False)
        ids = loaded.model.tokenizer.prompt(task.prompt)
        positions = loaded.model.config.max_len
        if len(ids) >= positions:
            raise EndpointError(f"{self.name}: the prompt is {len(ids)} tokens (bos included) and the policy has "
                                f"{positions} positions, none left for an answer: this policy cannot read "
                                f"{task.env}'s prompts", transient=False)
        return ids

    async def aclose(self) -> None:
        if self._owns_runtime:
            await self.runtime.aclose()

