"""``torch:NAME`` agents: a real tiny LM, published as bytes, sampled through ``TorchAgent.attempt`` in batches."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
from farm_client import tinylm

from farmd.agents import AgentError, AgentSpecError, EndpointError, TorchAgent, TorchRuntime, make_agent
from farmd.agents.registry import FORMS, TorchSpec, parse_torch_spec
from farmd.envs import get
from farmd.envs.base import Task
from farmd.errors import NotFound
from farmd.scheduler.policies import Policies
from farmd.store.store import Store
from tests.agents.fakes import action_task

ARITH = get("arith")


def _pairs(n: int) -> list[tuple[str, str]]:
    tasks = [ARITH.generate(seed, 1) for seed in range(n)]
    return [(t.prompt, ARITH.reference(t).final) for t in tasks]


@pytest.fixture(scope="module")
def blob() -> bytes:
    """A policy trained 50 steps on arith pairs: far from right, but no longer uniform noise."""
    torch.manual_seed(0)
    model = tinylm.TinyLM(tinylm.LMConfig())
    ids, mask = tinylm.sft_rows(model.tokenizer, _pairs(64), model.config.max_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(50):
        logp = tinylm.sequence_logprobs(model, ids)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return tinylm.save(model.eval())


@pytest.fixture(scope="module")
def untrained() -> bytes:
    """A policy fresh from its initialization: near uniform over its vocabulary."""
    torch.manual_seed(1)
    return tinylm.save(tinylm.TinyLM(tinylm.LMConfig()).eval())


class MemorySource:
    """A ``PolicySource`` in a dict; ``content`` takes a moment, as a file read does."""

    def __init__(self) -> None:
        self.hashes: dict[int, str] = {}
        self.blobs: dict[str, bytes] = {}
        self.reads = 0

    def publish(self, blob: bytes, sha256: str | None = None) -> int:
        sha256 = sha256 or hashlib.sha256(blob).hexdigest()
        version = len(self.hashes) + 1
        self.hashes[version] = sha256
        self.blobs[sha256] = blob
        return version

    async def sha256_of(self, version: int) -> str:
        if version not in self.hashes:
            raise NotFound(f"no policy version {version}")
        return self.hashes[version]

    async def content(self, sha256: str) -> bytes:
        self.reads += 1
        await asyncio.sleep(0.01)
        return self.blobs[sha256]

    def known_sha256(self, version: int) -> str | None:
        return self.hashes.get(version) if self.knows else None

    knows = True
    """Whether it answers ``known_sha256`` (a node's cache knows only the versions its leases named)."""


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    """The runtime sets torch's thread count for the process: give the other tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def source() -> MemorySource:
    return MemorySource()


@pytest.fixture
async def runtime(source: MemorySource) -> AsyncIterator[TorchRuntime]:
    rt = TorchRuntime(source)
    yield rt
    await rt.aclose()


def _task(seed: int = 3, prompt: str | None = None) -> Task:
    task = ARITH.generate(seed, 1)
    return task if prompt is None else dataclasses.replace(task, prompt=prompt)


async def test_an_attempt_records_what_the_policy_sampled(blob: bytes, source: MemorySource,
                                                          runtime: TorchRuntime) -> None:
    version = source.publish(blob)
    agent = TorchAgent("tiny", runtime, temperature=1.0, max_tokens=12)
    task = _task()
    result = await agent.attempt(task, None, version, rollout_id=41)

    model = runtime.loaded(source.hashes[version])
    assert model is not None
    [turn] = result.turns
    prompt = model.model.tokenizer.prompt(task.prompt)
    assert turn.prompt_token_ids == prompt and prompt[0] == tinylm.BOS
    assert 1 <= len(turn.token_ids) <= 12 and len(turn.logprobs) == len(turn.token_ids) and turn.has_logprobs
    assert turn.finish_reason == ("stop" if turn.token_ids[-1] == tinylm.EOS else "length")
    text = model.model.tokenizer.decode(turn.token_ids)
    assert result.attempt.final == turn.completion == text
    assert [(m.role, m.content) for m in result.transcript] == [("user", task.prompt), ("assistant", text)]
    assert (turn.message_index, turn.prompt_messages) == (1, 1)
    [step] = result.steps
    assert (step.action, step.observation, step.exit_code) == (text, None, None) and step.seconds >= turn.latency
    n = len(turn.token_ids)
    assert result.usage == {"requests": 1, "retries": 0, "prompt_tokens": len(prompt), "completion_tokens": n,
                            "total_tokens": len(prompt) + n, **({"truncated_replies": 1} if n == 12 else {})}
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.requests) == (len(prompt), n, 1)
    assert result.sampling is not None
    assert result.sampling.model == f"torch:tiny@{source.hashes[version][:12]}"
    assert (result.sampling.temperature, result.sampling.top_p, result.sampling.max_tokens,
            result.sampling.seed, result.sampling.n) == (1.0, 1.0, 12, 41, 1)

    # What a trainer recomputes from the record is what was sampled with.
    row = torch.tensor([prompt + turn.token_ids])
    with torch.no_grad():
        again = tinylm.sequence_logprobs(model.model, row)[0, len(prompt):].tolist()
    assert again == pytest.approx(turn.logprobs, abs=1e-4)


async def test_a_rollout_samples_the_same_alone_or_in_a_batch_and_a_group_differs(
        untrained: bytes, source: MemorySource, runtime: TorchRuntime) -> None:
    version = source.publish(untrained)
    agent = TorchAgent("tiny", runtime)
    task = _task()
    alone = await agent.attempt(task, None, version, rollout_id=7)
    again = await agent.attempt(task, None, version, rollout_id=7)  # a retried rollout
    assert again.turns[0].token_ids == alone.turns[0].token_ids

    batcher = runtime.loaded(source.hashes[version]).batcher(1.0, 16)  # type: ignore[union-attr]
    before = batcher.batches
    results = await asyncio.gather(*[agent.attempt(task, None, version, rollout_id=i) for i in range(200)])
    assert batcher.batches - before <= 2
    assert results[7].turns[0].token_ids == alone.turns[0].token_ids
    assert results[7].turns[0].logprobs == pytest.approx(alone.turns[0].logprobs, abs=1e-5)
    completions = [tuple(r.turns[0].token_ids) for r in results]
    assert len(set(completions)) > 150, "rollouts of one group sample with their own seeds"


async def test_temperature_0_is_greedy_whatever_the_seed(blob: bytes, source: MemorySource,
                                                         runtime: TorchRuntime) -> None:
    version = source.publish(blob)
    agent = TorchAgent("tiny", runtime, temperature=0, max_tokens=8)
    task = _task(5)
    results = await asyncio.gather(*[agent.attempt(task, None, version, rollout_id=i) for i in range(20)])
    turns = [r.turns[0] for r in results]
    assert all(t.token_ids == turns[0].token_ids for t in turns)
    model = runtime.loaded(source.hashes[version]).model  # type: ignore[union-attr]
    row = torch.tensor([turns[0].prompt_token_ids + turns[0].token_ids])
    with torch.no_grad():
        best = model(row)[0].argmax(-1).tolist()
    start = len(turns[0].prompt_token_ids)
    assert turns[0].token_ids == best[start - 1:start - 1 + len(turns[0].token_ids)]


async def test_concurrent_attempts_share_one_load_and_a_few_batches(blob: bytes, source: MemorySource,
                                                                    runtime: TorchRuntime) -> None:
    version = source.publish(blob)
    greedy = TorchAgent("tiny", runtime, temperature=0)
    sampled = TorchAgent("tiny", runtime)
    tasks = [ARITH.generate(seed, 1 + seed % 3) for seed in range(300)]  # prompts of several lengths
    results = await asyncio.gather(*[(greedy if i % 2 else sampled).attempt(t, None, version, rollout_id=i)
                                     for i, t in enumerate(tasks)])
    assert len(results) == 300 and all(r.turns[0].token_ids for r in results)
    assert (source.reads, runtime.loads) == (1, 1), "the policy was fetched and loaded once"
    loaded = runtime.loaded(source.hashes[version])
    assert loaded is not None
    for temperature in (0.0, 1.0):
        batcher = loaded.batcher(temperature, 16)
        assert batcher.sampled == 150 and batcher.batches <= 3


async def test_prepare_loads_a_policy_before_any_attempt_asks_and_only_once(blob: bytes, source: MemorySource,
                                                                              runtime: TorchRuntime) -> None:
    version = source.publish(blob)
    agent = TorchAgent("tiny", runtime)
    for _ in range(3):  # a worker's every lease of that version's jobs
        agent.prepare(version)
    for _ in range(500):
        if runtime.loaded(source.hashes[version]) is not None:
            break
        await asyncio.sleep(0.01)
    assert runtime.loaded(source.hashes[version]) is not None, "loaded with no attempt asking"
    assert (await agent.attempt(_task(), None, version)).turns[0].token_ids
    assert (source.reads, runtime.loads) == (1, 1)

    agent.prepare(version + 1)  # no such version: nothing starts, nothing raises (an attempt says why)
    source.knows = False
    agent.prepare(source.publish(blob + b" "))  # a hash not known without asking: left to the attempts
    await asyncio.sleep(0.05)
    assert (source.reads, runtime.loads) == (1, 1)


async def test_a_cancelled_caller_leaves_the_batch_to_the_others(blob: bytes, source: MemorySource,
                                                                 runtime: TorchRuntime) -> None:
    version = source.publish(blob)
    agent = TorchAgent("tiny", runtime)
    await agent.attempt(_task(), None, version)  # loaded
    attempts = [asyncio.create_task(agent.attempt(_task(), None, version, rollout_id=i)) for i in range(10)]
    await asyncio.sleep(0)
    attempts[3].cancel()
    results = await asyncio.gather(*attempts, return_exceptions=True)
    assert isinstance(results[3], asyncio.CancelledError)
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 3)
    # ... and once a batch is under way too.
    attempts = [asyncio.create_task(agent.attempt(_task(), None, version, rollout_id=i)) for i in range(10)]
    for _ in range(3):
        await asyncio.sleep(0)
    attempts[0].cancel()
    results = await asyncio.gather(*attempts, return_exceptions=True)
    assert all(not isinstance(r, BaseException) for r in results[1:])


async def test_a_failing_sample_fails_its_batch_transiently(blob: bytes, source: MemorySource, runtime: TorchRuntime,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    version = source.publish(blob)
    agent = TorchAgent("tiny", runtime)
    await agent.attempt(_task(), None, version)

    def broken(*args: object, **kwargs: object) -> list[tinylm.Sampled]:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tinylm, "sample", broken)
    results = await asyncio.gather(*[agent.attempt(_task(), None, version, rollout_id=i) for i in range(5)],
                                   return_exceptions=True)
    assert all(isinstance(r, EndpointError) and r.transient and "out of memory" in str(r) for r in results)
    monkeypatch.undo()
    assert (await agent.attempt(_task(), None, version)).turns[0].token_ids  # the batcher goes on


async def test_what_the_policy_cannot_do_is_not_transient(blob: bytes, source: MemorySource,
                                                          runtime: TorchRuntime) -> None:
    agent = TorchAgent("tiny", runtime)
    good = source.publish(blob)
    cases = {
        "cannot read arith": (_task(prompt="4*2="), good),
        "'\\*'": (_task(prompt="4*2="), good),
        "no policy named 'tiny'": (_task(), 0),
        "version 99 not found": (_task(), 99),
        "hashes to": (_task(), source.publish(blob, sha256=hashlib.sha256(b"other").hexdigest())),
        "not a tinylm policy": (_task(), source.publish(b"garbage, not a policy")),
        "positions": (_task(prompt="1+" * 20 + "1="), good),
    }
    for why, (task, version) in cases.items():
        with pytest.raises(EndpointError, match=why) as caught:
            await agent.attempt(task, None, version)
        assert not caught.value.transient, why
    with pytest.raises(AgentError, match="submission tasks only"):
        await agent.attempt(action_task(), None, good)


async def test_the_torch_thread_runs_at_the_threads_asked_for(source: MemorySource) -> None:
    runtime = TorchRuntime(source, threads=1)
    try:
        assert await runtime.in_thread(torch.get_num_threads) == 1
    finally:
        await runtime.aclose()
    with pytest.raises(EndpointError, match="closed"):
        await runtime.in_thread(torch.get_num_threads)


async def test_a_policy_from_the_store(tmp_path: Path, blob: bytes) -> None:
    store = await Store.open(tmp_path / "farm.db")
    runtime = None
    try:
        policy = await store.add_policy(hashlib.sha256(blob).hexdigest(), blob, None, "tiny")
        policies = Policies(store, lambda version: None)
        runtime = TorchRuntime(policies)
        agent = make_agent("torch:tiny?temperature=0", torch=runtime)
        result = await agent.attempt(_task(), None, policy.version, rollout_id=1)
        assert result.turns[0].token_ids and result.sampling is not None
        assert result.sampling.model == f"torch:tiny@{policy.sha256[:12]}"
        with pytest.raises(EndpointError, match=f"version {policy.version + 1} not found") as caught:
            await agent.attempt(_task(), None, policy.version + 1)
        assert not caught.value.transient
    finally:
        if runtime is not None:
            await runtime.aclose()
        await store.close()


async def test_torch_specs(source: MemorySource, runtime: TorchRuntime) -> None:
    assert "torch:NAME[?temperature=T&max_tokens=N]" in FORMS
    agent = make_agent("torch:tiny", policies=source)
    assert isinstance(agent, TorchAgent) and (agent.name, agent.temperature, agent.max_tokens) == ("torch:tiny", 1, 16)
    assert agent.runtime is not runtime
    await agent.aclose()  # it made its own runtime: closing the agent closes it
    shared = [make_agent(spec, torch=runtime) for spec in ("torch:tiny?temperature=0&max_tokens=8", "torch:v2.b-c_d")]
    assert all(isinstance(a, TorchAgent) and a.runtime is runtime for a in shared)
    assert [(a.temperature, a.max_tokens) for a in shared if isinstance(a, TorchAgent)] == [(0, 8), (1, 16)]
    for spec, why in [("torch:", "expected torch:NAME"), ("torch:/models/p.pt", "a path or a URL"),
                      ("torch:-x", "expected torch:NAME"), ("torch:" + "a" * 65, "expected torch:NAME"),
                      ("torch:tiny?top_p=0.9", r"unknown option\(s\) top_p; a torch spec may set temperature, "),
                      ("torch:tiny?temperature=3", "temperature must be a number from 0 to 2"),
                      ("torch:tiny?temperature=nan", "finite"), ("torch:tiny?temperature=hot", "not a number"),
                      ("torch:tiny?max_tokens=0", "max_tokens must be positive"),
                      ("torch:tiny?max_tokens=1025", "from 1 to 1024"), ("torch:tiny?max_tokens=2.5", "integer"),
                      ("torch:tiny?max_tokens=1&max_tokens=2", "more than once"),
                      ("torch:tiny?x", "malformed")]:
        with pytest.raises(AgentSpecError, match=why):
            make_agent(spec, torch=runtime)
    with pytest.raises(AgentSpecError, match="this node has no policy source"):
        make_agent("torch:tiny")
    # Checked where no worker runs (a config's demand_agent): no source needed.
    assert parse_torch_spec(" torch:tiny?max_tokens=4 ") == TorchSpec("tiny", 1.0, 4)
    with pytest.raises(AgentSpecError, match="unknown option"):
        parse_torch_spec("torch:tiny?n=2")


async def test_a_policy_that_samples_nan_logprobs_fails_as_infrastructure_never_a_record(
        source: MemorySource, runtime: TorchRuntime) -> None:
    """Finite weights (so it loads) whose logits overflow float32: log_softmax gives NaN. Its output is out of its
    domain: an EndpointError (retried as infrastructure), never a trajectory carrying NaN to a trainer."""
    torch.manual_seed(1)
    model = tinylm.TinyLM(tinylm.LMConfig()).eval()
    with torch.no_grad():
        model.ln.weight.fill_(3e38)
        model.embed.weight.mul_(100)
    version = source.publish(tinylm.save(model))
    agent = TorchAgent("tiny", runtime, temperature=1.0, max_tokens=4)
    with pytest.raises(EndpointError) as failed:
        await agent.attempt(_task(), None, version, rollout_id=3)
    assert failed.value.transient and "logprobs[0] is nan" in str(failed.value), str(failed.value)


async def test_a_policy_that_declares_more_than_it_holds_is_refused_before_it_is_made(
        source: MemorySource, runtime: TorchRuntime) -> None:
    """What a node loads from its policy cache (or the coordinator's worker from its store) is checked as
    PublishPolicy checks it: each class of size lie is refused, for good, before torch makes anything of it."""
    from tests.clients import policy_blobs

    agent = TorchAgent("tiny", runtime)
    for name, hostile in policy_blobs.hostile().items():
        with pytest.raises(EndpointError, match="not a tinylm policy this worker can load") as caught:
            await agent.attempt(_task(), None, source.publish(hostile))
        assert not caught.value.transient, name
    assert runtime.loads == 0


def test_sampling_computes_each_position_once_and_gets_what_the_whole_sequence_gives(blob: bytes) -> None:
    """``extend`` with its keys and values (sampling's cache) gives the logits ``forward`` gives at each position."""
    model = tinylm.load(blob)
    ids = torch.tensor([model.tokenizer.prompt(t.prompt) for t in (ARITH.generate(s, 1) for s in range(40))
                        if len(t.prompt) == len(ARITH.generate(0, 1).prompt)][:4])
    with torch.no_grad():
        whole = model(ids)
        logits, cache = model.extend(ids[:, :3])
        assert torch.allclose(logits, whole[:, 2], atol=1e-5)
        for t in range(3, ids.shape[1]):
            logits, cache = model.extend(ids[:, t:t + 1], cache)
            assert torch.allclose(logits, whole[:, t], atol=1e-5), t
        with pytest.raises(ValueError, match="positions"):
            model.extend(ids[:, :1].repeat(1, model.config.max_len), cache)
