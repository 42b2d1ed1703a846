"""The learning loop, short: farmd and the reference trainer for about a minute (``make run``'s ``run_loop``).

Then the data dir is opened again and checked from outside: the policy version advanced; every
trajectory of the trained policy carries the version that sampled it (its logprobs are that version's,
recomputed); a stream that bounds staleness keeps old ones out; and the trained policy beats the
warmed-up one on held-out problems it never trained on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import grpc
import pytest
import torch
from farm.v1 import farm_pb2, farm_pb2_grpc
from farm_client import FarmClient
from farm_client import tinylm as lm

from farmd.cli.loop_report import read_jsonl
from farmd.cli.main_job import AGENT, ENV, LoopFiles, run_loop
from farmd.envs import get

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.clocked]


SAMPLES = 8
KEEP_ALL = 1_000_000
"""Samples per held-out problem for the sampled pass rate."""


def held_out(model: lm.TinyLM, level: int = 1) -> tuple[float, float, float]:
    """On every held-out problem at ``level`` that the first 600 seeds pose (about 300): the sampled pass
    rate (``SAMPLES`` completions each at temperature 1, fixed seeds: what the loop's reward is, measured on
    about 2,400 attempts), the greedy pass rate, and the mean probability the policy gives the right answer
    (its tokens and eos, teacher-forced). The greedy rate is shown, not held to: after a minute of training
    a few argmax flips move it either way (once 0.215 -> 0.208 while the right answer's probability rose from
    0.129 to 0.163), while the sampled rate and the probability move with the policy itself."""
    env = get("arith:heldout")
    tasks = list({t.prompt: t for t in (env.generate(seed, level) for seed in range(600))}.values())
    tok = model.tokenizer
    prompts = [tok.prompt(t.prompt) for t in tasks]

    def passed(temperature: float, repeats: int) -> float:
        outs = lm.sample(model, prompts * repeats, max_new_tokens=8, temperature=temperature,
                         seeds=list(range(len(prompts) * repeats)))
        return sum(env.judge(t, tok.decode(o.token_ids)).passed
                   for t, o in zip(tasks * repeats, outs, strict=True)) / len(outs)

    ids, mask = lm.sft_rows(tok, [(t.prompt, env.reference(t).final) for t in tasks], model.config.max_len)
    with torch.no_grad():
        right = (lm.sequence_logprobs(model, ids) * mask).sum(dim=1).exp().mean().item()
    return passed(1.0, SAMPLES), passed(0.0, 1), right


def test_a_short_loop_learns_through_the_farm(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "loop"
    # Every version's content kept (farmd keeps only the newest few): each trajectory is checked against its own.
    summary = run_loop(data, 1.0, keep_policies=KEEP_ALL)
    files = LoopFiles(data)
    assert (files.report_dir / "learning-curve.png").stat().st_size > 10_000
    assert json.loads((files.report_dir / "summary.json").read_text())["rollouts"] == summary.rollouts
    metrics = read_jsonl(files.metrics)
    published = {r["version"]: r["sha256"] for r in metrics if r["kind"] == "publish"}
    assert len(published) >= 5, f"the policy version advanced only to {sorted(published)}"
    stale = [r["staleness_max"] for r in metrics if r["kind"] == "step" and r["staleness_max"] is not None]
    # One batch a version (demand_per_version): learned from one version after sampling, or none; a retried job
    # can land a batch later.
    assert stale and max(stale) <= 2 and sum(s <= 1 for s in stale) >= 0.9 * len(stale), stale

    keep = tmp_path / "keep.toml"
    keep.write_text(f"[scheduler]\npolicy_keep_newest = {KEEP_ALL}\n")
    farm = running_farm("--workers", "0", "--config", str(keep), data_dir=data)  # the loop's farm, opened again
    with FarmClient(farm.addr) as client:
        stored = [t for page in client.trajectory_pages(ENV, full=True) for t in page if t.agent == AGENT]
        assert len(stored) > 1000
        assert {t.policy_version for t in stored} <= set(published), "only versions the trainer published"
        models: dict[int, lm.TinyLM] = {}
        for t in random.Random(0).sample(stored, 300):
            if t.policy_version not in models:
                version, blob, _ = client.get_policy(published[t.policy_version])
                assert version == t.policy_version
                models[version] = lm.load(blob)
            turn = t.turns[0]
            assert t.sampling.model.endswith(published[t.policy_version][:12])
            ids = torch.tensor([turn.prompt_token_ids + turn.token_ids])
            recomputed = lm.sequence_logprobs(models[t.policy_version], ids)[0, len(turn.prompt_token_ids):]
            assert torch.allclose(recomputed, torch.tensor(turn.logprobs), atol=1e-4), \
                f"trajectory {t.id}: its logprobs are not version {t.policy_version}'s"

        # Three more versions of the line: everything stored is now more than two behind, and kept out.
        newest = max(published)
        for i in range(3):
            torch.manual_seed(i)
            client.publish_policy(lm.save(lm.TinyLM(lm.LMConfig())), name="tiny")
        stub = farm_pb2_grpc.FarmServiceStub(client._channel)
        sent = []
        with pytest.raises(grpc.RpcError) as ended:
            for reply in stub.StreamTrajectories(farm_pb2.StreamTrajectoriesRequest(
                    consumer="stale-check", whole_groups=True, max_staleness=2, agent=AGENT, envs=[ENV]),
                    timeout=3):
                sent.extend(reply.trajectories)
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert sent == [], f"{len(sent)} trajectories at least three versions old were streamed"

        _, first, _ = client.get_policy(published[min(published)])
        _, last, _ = client.get_policy(published[newest])
    (rate_before, greedy_before, right_before) = held_out(lm.load(first))
    (rate_after, greedy_after, right_after) = held_out(lm.load(last))
    shown = (f"held-out at level 1, warmed up -> trained: sampled pass rate {rate_before:.3f} -> {rate_after:.3f}, "
             f"probability of the right answer {right_before:.3f} -> {right_after:.3f} (greedy pass rate "
             f"{greedy_before:.3f} -> {greedy_after:.3f})")
    assert rate_after > rate_before + 0.01 and right_after > right_before + 0.01, shown
