"""Farm's own rollouts reach a trainer that speaks only Atropos: ``/register``, then ``/batch``.

A real farmd with boxes and a published tiny policy produces ``torch:tiny`` groups on ``arith`` because the
Atropos feed's consumer asks for them (``demand_consumers``); each batch the trainer takes is the stored
trainer-grade records as Atropos groups: tokens, masks, sampling logprobs, scores and messages."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from farm_client import FarmClient, tinylm

from tests.api.test_atropos import REGISTRATION
from tests.conftest import RunningFarm

pytestmark = [pytest.mark.sandbox]

AGENT = "torch:tiny?max_tokens=6"


def test_farm_rollouts_reach_an_atropos_trainer_as_scored_groups(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "farm.toml"
    config.write_text(f'''[scheduler]
demand_agent = "{AGENT}"
demand_envs = ["arith"]
demand_consumers = ["atropos"]
demand_buffer = 16
group_size = 4

[atropos]
envs = ["arith"]
agent = "{AGENT}"
ahead_groups = 4
''')
    farm: RunningFarm = running_farm("--workers", "2", "--atropos", "127.0.0.1:0", "--config", str(config))
    url = "http://" + json.loads((farm.data_dir / "farmd.json").read_text())["atropos"]
    with FarmClient(farm.addr) as client:
        client.publish_policy(tinylm.save(tinylm.TinyLM(tinylm.LMConfig()).eval()), name="tiny")
        assert httpx.post(url + "/register", json=REGISTRATION).status_code == 200
        batches = []
        deadline = time.monotonic() + 90
        while len(batches) < 2:
            assert time.monotonic() < deadline, "no batch of farm rollouts within 90 s"
            batch = httpx.get(url + "/batch", timeout=30).json()["batch"]
            if batch:
                batches.append(batch)
            else:
                time.sleep(0.2)
        stored = {tuple(t.turns[0].prompt_token_ids + t.turns[0].token_ids): t
                  for t in client.trajectories("arith", limit=1000, full=True, agent=AGENT)}

    for batch in batches:
        assert sum(len(g["tokens"]) for g in batch) == REGISTRATION["batch_size"]
        for group in batch:
            assert len(group["tokens"]) == 4 and group["env_id"] is None
            for tokens, masks, logprobs, score, conversation in zip(
                    group["tokens"], group["masks"], group["inference_logprobs"], group["scores"], group["messages"],
                    strict=True):
                record = stored[tuple(tokens)]  # the very record farm stored
                turn = record.turns[0]
                prompt = len(turn.prompt_token_ids)
                assert masks == [-100] * prompt + list(turn.token_ids), "the model's tokens only"
                assert logprobs[:prompt] == [1.0] * prompt
                assert logprobs[prompt:] == pytest.approx(list(turn.logprobs), abs=1e-6), "as sampled"
                assert score == record.reward and conversation[0]["content"] == record.messages[0].content
    with FarmClient(farm.addr) as client:
        (feed,) = [c for c in client.status()["consumers"] if c["name"] == "atropos"]
    assert feed["whole_groups"] and feed["cursor"] >= 4, "farm's delivery was taken by the feed, as by any trainer"
