"""End to end: a farm whose agent talks to an OpenAI-compatible server that returns token ids and logprobs
gives a trainer tensors whose loss mask covers exactly the model's tokens, and the trainer's guide's loop trains."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import load_dataset
from farm_client import FarmClient
from farm_client.record import Trajectory
from farm_client.sequences import group_advantages
from farm_client.tensors import FarmDataset, TensorBatch
from torch.utils.data import DataLoader

from tests.clients.openai_server import SPECIAL, decode, encode_message, logprob, openai_server, prompt_ids
from tests.clients.records import GUIDE, TinyLM, trainer_code

ARITHMETIC = re.compile(r"Calculate ([\d\s+\-*/().]+?)\.(?:\s|$)")
SHELL_COMMAND = "```sh\nls -R\n```"


class Policy:
    """Scripted replies. Arithmetic: each task answered right on its 1st, 3rd, ... request and wrong on the
    others, so a group's rewards differ. Anything else (a shell task): one command, then an answer."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        task = messages[1]["content"]
        found = ARITHMETIC.search(task)
        if found is None:
            return SHELL_COMMAND if not any(m["role"] == "assistant" for m in messages) else "ANSWER: 2"
        with self.lock:
            self.asked[task] += 1
            right = self.asked[task] % 2 == 1
        value = eval(found.group(1), {"__builtins__": {}})  # digits and operators only (the pattern)
        value = int(value) if float(value).is_integer() else value
        return f"Thinking.\n<answer>{value if right else value + 1}</answer>"


def expected_row(t: Trajectory) -> tuple[list[int], list[int]]:
    """The chat template over the conversation up to its last reply, and 1 exactly on the model's tokens:
    each reply's bytes and its end token (not the [ASSISTANT] header the template put before it)."""
    last = max(turn.message_index for turn in t.turns)
    ids: list[int] = []
    mask: list[int] = []
    for m in t.messages[:last + 1]:
        encoded = encode_message({"role": m.role, "content": m.content})
        ids += encoded
        mask += [0] + [1] * (len(encoded) - 1) if m.role == "assistant" else [0] * len(encoded)
    return ids, mask


def stream_all(data: FarmDataset, expected: int) -> tuple[list[TensorBatch], dict[int, Trajectory]]:
    seen: dict[int, Trajectory] = {}
    batches = []
    # batch_size=None: the dataset's items are batches already.
    for batch in DataLoader(data, batch_size=None):
        batches.append(batch)
        seen.update((t.id, t) for t in batch.trajectories)
        if len(seen) >= expected:
            return batches, seen
    raise AssertionError("the stream ended")


@pytest.mark.sandbox  # farmd with workers: it refuses to start on a host that cannot isolate
@pytest.mark.timeout(90)
def test_the_stream_gives_tensors_masked_on_exactly_the_models_tokens(running_farm: Any, tmp_path: Path) -> None:
    policy = Policy()
    with openai_server(policy) as server:
        config = tmp_path / "farm.toml"
        config.write_text(f'[endpoints.local]\nurl = "{server.url}"\n')
        farm_proc = running_farm("--config", str(config), "--workers", "2")
        with FarmClient(farm_proc.addr) as farm:
            farm.run("rg:basic_arithmetic", "openai:tiny@local", rollouts=8, group_size=4)
            farm.run("shell", "openai:tiny@local", rollouts=2, group_size=2)
            started = time.monotonic()
            data = FarmDataset(farm, "e2e", batch_size=64, auto_ack=False)
            batches, trajectories = stream_all(data, 10)
            streamed_s = time.monotonic() - started
            data.ack(batches[-1])
            (consumer,) = [c for c in farm.status()["consumers"] if c["name"] == "e2e"]
            assert consumer["lag"] == 0 and consumer["whole_groups"], consumer

            # The farm asked like a trainer needs, and stored what the server sent, unchanged.
            sent = [[{"role": m["role"], "content": m.get("content")} for m in r["messages"]] for r in server.requests]
            assert all(r.get("logprobs") and r.get("return_token_ids") for r in server.requests)
            for t in trajectories.values():
                assert t.status == "ok", (t.id, t.reasons)
                assistant = [i for i, m in enumerate(t.messages) if m.role == "assistant"]
                assert [turn.message_index for turn in t.turns] == assistant
                for turn in t.turns:
                    asked = [{"role": m.role, "content": m.content} for m in t.messages[:turn.prompt_messages]]
                    assert asked in sent, "a prompt the server never saw"
                    content = t.messages[turn.message_index].content
                    assert decode(turn.token_ids) == content == turn.completion
                    assert turn.prompt_token_ids == prompt_ids(asked)
                    assert turn.has_logprobs and turn.finish_reason == "stop"
                    assert turn.logprobs == pytest.approx([logprob(i, tok) for i, tok in enumerate(turn.token_ids)],
                                                          rel=1e-6, abs=1e-7)
            shell = [t for t in trajectories.values() if t.env == "shell"]
            assert len(shell) == 2 and all(len(t.turns) == 2 for t in shell)
            assert all(t.messages[3].role == "user" and t.steps[0].observation for t in shell)
            arithmetic = [t for t in trajectories.values() if t.env == "rg:basic_arithmetic"]
            assert {t.passed for t in arithmetic} == {True, False}

            # The tensors: one row per trajectory, its mask exactly the model's tokens.
            rows = 0
            for batch in batches:
                rows += len(batch)
                assert not batch.per_turn.any() and not batch.truncated.any()
                for b, traj_id in enumerate(batch.trajectory_ids.tolist()):
                    t = trajectories[traj_id]
                    ids, mask = expected_row(t)
                    n = int(batch.attention_mask[b].sum())
                    assert batch.input_ids[b, :n].tolist() == ids
                    assert batch.loss_mask[b, :n].tolist() == mask
                    assert not batch.loss_mask[b, n:].any() and batch.input_ids[b, n:].eq(0).all()
                    model = batch.loss_mask[b].bool()
                    assert batch.logprobs[b][model].tolist() == pytest.approx(
                        [lp for turn in t.turns for lp in turn.logprobs], rel=1e-6, abs=1e-7)
                    assert not batch.logprobs[b][~model].any()
                    assert batch.input_ids[b][model].tolist() == [x for turn in t.turns for x in turn.token_ids]
                    assert SPECIAL["user"] in batch.input_ids[b][~model].tolist()
                    if t.env == "shell":  # the box's output went back to the model, and is not its token
                        observation = t.messages[3].content.encode()
                        unmasked = bytes(x for x in batch.input_ids[b][~model].tolist() if x < 256)
                        assert observation in unmasked
                    assert batch.rewards[b].item() == pytest.approx(t.reward)
                    assert batch.policy_versions[b].item() == t.policy_version
                group_ids = batch.group_ids.tolist()
                assert batch.advantages.tolist() == pytest.approx(
                    group_advantages(batch.rewards.tolist(), group_ids), abs=1e-5)
                assert all(Counter(group_ids)[g] in (2, 4) for g in group_ids)  # whole groups only
            assert rows == 10
            assert any(abs(a) > 0.5 for batch in batches for a in batch.advantages.tolist())
            print(f"10 trajectories streamed as tensors in {streamed_s:.1f}s; {len(server.requests)} requests")

            # The same trajectories exported to Parquet load in `datasets` with the conversation intact.
            out = tmp_path / "e2e.parquet"
            farm_proc.farmctl("export", "--format", "parquet", "--out", str(out))
            rows_out = {r["id"]: r for r in load_dataset("parquet", data_files=str(out), split="train")}
            assert set(rows_out) == set(trajectories)
            for t in trajectories.values():
                row = rows_out[t.id]
                assert [(m["role"], m["content"]) for m in row["messages"]] == [(m.role, m.content) for m in t.messages]
                assert [turn["token_ids"] for turn in row["turns"]] == [turn.token_ids for turn in t.turns]
                for stored, turn in zip(row["turns"], t.turns, strict=True):
                    assert stored["logprobs"] == pytest.approx(turn.logprobs, rel=1e-6)
                assert row["task"]["prompt"] == t.task.prompt != "" and row["reward"] == t.reward

            # The trainer's guide's code, as written, against this farm and a tiny model: one step.
            model = TinyLM()
            before = model.head.weight.detach().clone()
            code = trainer_code().replace('"127.0.0.1:7431"', repr(farm_proc.addr))
            scope = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.5), "device": "cpu",
                     "num_steps": 1}
            exec(compile(code, str(GUIDE), "exec"), scope)
            assert scope["step"] == 0 and not torch.equal(before, model.head.weight)
            assert farm.status()["policy_version"] >= 1
