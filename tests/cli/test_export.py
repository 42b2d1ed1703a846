"""``farmctl export`` and ``farmctl trajectories show`` on records with a whole conversation.

Records are written straight into a store in a temp data dir (no model needed for token ids), then
exported from that data dir and from a farmd started on it: the two must be the same file, and the
file must load in ``datasets``, pandas and pyarrow as it is.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farmd.records import (
    ChatMessage,
    PosedTask,
    SamplingParams,
    Step,
    Timings,
    ToolCall,
    Trajectory,
    Turn,
    Usage,
)
from farmd.store import Store
from tests.cli.hostile import HOSTILE, SHOWN, assert_shown_safely
from tests.conftest import farmctl

STAMP = pa.timestamp("us", tz="UTC")
STARTED, FINISHED = 1_700_000_000.25, 1_700_000_003.5
PROMPT_IDS, REPLY_IDS, REPLY_LOGPROBS = [1, 2, 3, 70000], [11, 12, 13], [-0.5, -0.25, -0.125]
"""Logprobs exact in 32 bits, so they compare equal after the wire's ``float``."""


def chat(job: Any, hostile: str = "") -> Trajectory:
    """A model's attempt: system and user messages, a reply with tokens and logprobs, a tool round, a
    second reply without logprobs; a step that ran, and free-form details."""
    messages = [ChatMessage("system", "You solve puzzles."), ChatMessage("user", f"What is 2+3?{hostile}"),
                ChatMessage("assistant", "Let me check.", [ToolCall("c1", f"sh{hostile}", '{"cmd": "echo hi"}')]),
                ChatMessage("tool", f"exit 0{hostile}", tool_call_id="c1"),
                ChatMessage("assistant", "<answer>5</answer>")]
    turns = [Turn(message_index=2, prompt_messages=2, completion="Let me check.", prompt_token_ids=PROMPT_IDS,
                  token_ids=REPLY_IDS, logprobs=REPLY_LOGPROBS, has_logprobs=True, finish_reason="stop",
                  usage=Usage(4, 3, 7, 1, 0), latency=0.5),
             Turn(message_index=4, prompt_messages=4, completion="<answer>5</answer>", token_ids=[21, 22],
                  finish_reason="length", usage=Usage(9, 2, 11, 1, 1), latency=0.75)]
    return Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version="3", seed=job.seed, difficulty=job.difficulty,
        agent=job.agent, policy_version=2, reward=1.0, passed=True, status="ok", reasons=[f"right{hostile}"],
        flags=["timeout"], verifier_version="1", steps=[Step(f"echo hi{hostile}", f"hi{hostile}\n", 0, 0.25,
                                                              ["wall"])],
        final="5", node=f"n1{hostile}", verdict_details={"tests": [{"ok": True, "ms": 1.5}], "speedup": 2},
        task=PosedTask("actions", f"What is 2+3?{hostile}", "", "<answer>N</answer>", [{"input": [2, 3]}],
                       {"level": "easy"}),
        messages=messages, turns=turns,
        sampling=SamplingParams("m", 0.7, 0.95, 64, 7, ["</answer>"], 2, {"top_k": 20}),
        usage=Usage(13, 5, 18, 2, 1), timings=Timings(0.125, 2.0, 0.5, 3.25), started_at=STARTED,
        finished_at=FINISHED)


def scripted(job: Any, status: str = "ok") -> Trajectory:
    """A scripted agent's attempt: no conversation, one submission."""
    return Trajectory(id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed,
                      difficulty=job.difficulty, agent=job.agent, policy_version=0, reward=0.0, passed=False,
                      status=status, reasons=["no tests passed"], flags=[], verifier_version="1",
                      steps=[Step(exit_code=1, duration=0.5)], final="def f(x): return x",
                      task=PosedTask("submission", "Write f.", "f"), started_at=STARTED, finished_at=FINISHED)


def seed_store(data: Path, hostile: str = "") -> list[int]:
    """Two model attempts at one task, a scripted one, and one the verifier could not judge; ids in order."""
    async def write() -> list[int]:
        store = await Store.open(data / "farm.db")
        try:
            await store.enqueue([("rg:chain_sum", 4, 2, "openai:m@fake", 2), ("py-func", 9, 1, "random", 2)])
            jobs = sorted(await store.lease("seed", 10, 60, lambda _agent: 2), key=lambda j: j.id)
            records = [chat(jobs[0], hostile), chat(jobs[1]), scripted(jobs[2]), scripted(jobs[3], "error")]
            assert await store.complete([("seed", r) for r in records]) == [j.id for j in jobs]
            await store.add_scores([(jobs[0].id, "2", 0.5, False, "ok", [f"stricter{hostile}"], ["truncated"])])
            return [j.id for j in jobs]
        finally:
            await store.close()

    data.mkdir(parents=True, exist_ok=True)
    return asyncio.run(write())


def export(*args: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(farmctl("export", "--json", *args).stdout)
    return summary


def rfc3339(value: datetime.datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="microseconds").replace("+00:00", "Z")


def as_jsonl(value: Any) -> Any:
    """A row read from Parquet as the jsonl writes it: times as RFC 3339 strings."""
    if isinstance(value, dict):
        return {k: as_jsonl(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_jsonl(v) for v in value]
    if isinstance(value, datetime.datetime):
        return rfc3339(value)
    return value


def test_farmd_and_a_data_dir_export_the_same_typed_record(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "farm"
    ids = seed_store(data)
    farm = running_farm("--workers", "0", data_dir=data)
    served = {fmt: tmp_path / f"served.{fmt}" for fmt in ("parquet", "jsonl")}
    for fmt, path in served.items():
        summary = json.loads(farm.farmctl("export", "--format", fmt, "--out", str(path), "--json").stdout)
        assert summary == {"exported": 4, "path": str(path), "format": fmt, "view": "record", "withdrawn_left_out": 0,
                           "manifest": f"{path}.manifest.json", "verdict_mark": summary["verdict_mark"]}
    assert farm.stop() == 0
    direct = {fmt: tmp_path / f"direct.{fmt}" for fmt in ("parquet", "jsonl")}
    for fmt, path in direct.items():
        assert export("--format", fmt, "--out", str(path), "--data", str(data))["exported"] == 4
    assert direct["jsonl"].read_text() == served["jsonl"].read_text(), "the data dir holds what farmd serves"
    assert pq.read_table(direct["parquet"]).equals(pq.read_table(served["parquet"]))

    table = pq.read_table(served["parquet"])
    schema = table.schema
    assert [schema.field(n).type for n in ("started_at", "finished_at")] == [STAMP, STAMP]
    assert schema.field("scores").type.value_type.field("scored_at").type == STAMP
    turn = schema.field("turns").type.value_type
    assert turn.field("token_ids").type == pa.list_(pa.int64()) and turn.field("logprobs").type == pa.list_(pa.float32())
    assert pa.types.is_struct(schema.field("task").type) and schema.field("verdict_details").type == pa.string()

    rows = table.to_pylist()
    assert [r["id"] for r in rows] == ids
    first = rows[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert first["messages"][2]["tool_calls"] == [{"id": "c1", "name": "sh", "arguments": '{"cmd": "echo hi"}'}]
    assert first["messages"][3]["tool_call_id"] == "c1"
    assert first["messages"][4]["content"] == "<answer>5</answer>"
    assert [(t["message_index"], t["token_ids"], t["has_logprobs"]) for t in first["turns"]] == [
        (2, REPLY_IDS, True), (4, [21, 22], False)]
    assert first["turns"][0]["prompt_token_ids"] == PROMPT_IDS and first["turns"][0]["logprobs"] == REPLY_LOGPROBS
    assert first["turns"][0]["completion"] == "Let me check.", "a turn's text comes back from its message"
    assert first["started_at"] == datetime.datetime.fromtimestamp(STARTED, datetime.UTC)
    assert first["finished_at"] == datetime.datetime.fromtimestamp(FINISHED, datetime.UTC)
    assert json.loads(first["verdict_details"]) == {"speedup": 2, "tests": [{"ms": 1.5, "ok": True}]}
    assert json.loads(first["task"]["examples"]) == [{"input": [2, 3]}]
    assert first["sampling"]["seed"] == 7 and json.loads(first["sampling"]["extra"]) == {"top_k": 20}
    assert first["steps"] == [{"action": "echo hi", "observation": "hi\n", "exit_code": 0, "duration": 0.25,
                               "violations": ["wall"]}]
    assert first["timings"] == {"task": 0.125, "agent": 2.0, "verify": 0.5, "total": 3.25}
    # The later score is its current verdict (issue 24); the one it was stored with stays first in its scores.
    assert (first["reward"], first["passed"], first["flags"], first["verifier_version"]) == (0.5, False, ["truncated"],
                                                                                            "2")
    assert [(s["verifier_version"], s["reward"], s["flags"]) for s in first["scores"]] == [
        ("1", 1.0, ["timeout"]), ("2", 0.5, ["truncated"])]
    assert first["verdict_version"] == first["scores"][1]["verdict_version"] > 0 == first["scores"][0]["verdict_version"]
    assert isinstance(first["scores"][0]["scored_at"], datetime.datetime), "every score is exported with the record"
    assert rows[1]["verdict_version"] == 0 and [s["verdict_version"] for s in rows[1]["scores"]] == [0]
    assert rows[2]["messages"] == [] and rows[2]["steps"][0]["exit_code"] == 1 and rows[2]["status"] == "ok"
    assert rows[3]["status"] == "error"

    lines = [json.loads(line) for line in served["jsonl"].read_text().splitlines()]
    assert lines == [as_jsonl(r) for r in rows], "jsonl: the same fields and values, times as RFC 3339"
    assert lines[0]["started_at"] == "2023-11-14T22:13:20.250000Z"


def test_the_parquet_loads_in_datasets_and_pandas_as_it_is(tmp_path: Path) -> None:
    import datasets
    import pandas as pd

    data = tmp_path / "farm"
    seed_store(data)
    out = tmp_path / "all.parquet"
    export("--format", "parquet", "--out", str(out), "--data", str(data))

    ds = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 4
    assert ds.features["started_at"] == datasets.Value("timestamp[us, tz=UTC]")
    assert ds[0]["turns"][0]["token_ids"] == REPLY_IDS and ds[0]["turns"][0]["logprobs"] == REPLY_LOGPROBS
    assert [m["content"] for m in ds[0]["messages"]][:2] == ["You solve puzzles.", "What is 2+3?"]
    assert ds[0]["task"]["prompt"] == "What is 2+3?"

    frame = pd.read_parquet(out)
    assert str(frame["finished_at"].dtype) == "datetime64[us, UTC]"
    assert frame["finished_at"].iloc[0] == pd.Timestamp(FINISHED, unit="s", tz="UTC")
    assert list(frame["turns"].iloc[0][0]["token_ids"]) == REPLY_IDS


def test_the_flat_view_is_prompt_completion_reward(tmp_path: Path) -> None:
    import datasets

    data = tmp_path / "farm"
    seed_store(data)
    out = tmp_path / "flat.parquet"
    summary = export("--format", "parquet", "--out", str(out), "--data", str(data), "--view", "flat")
    assert {k: summary[k] for k in ("exported", "path", "format", "view", "withdrawn_left_out")} == {
        "exported": 4, "path": str(out), "format": "parquet", "view": "flat", "withdrawn_left_out": 0}
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert set(ds.column_names) == {"id", "group_id", "env", "prompt", "completion", "reward", "passed", "status"}
    first = ds[0]
    assert first["prompt"] == [{"role": "system", "content": "You solve puzzles."},
                               {"role": "user", "content": "What is 2+3?"}]
    assert [m["role"] for m in first["completion"]] == ["assistant", "tool", "assistant"]
    assert first["completion"][-1]["content"] == "<answer>5</answer>"
    assert (first["reward"], first["passed"], first["env"]) == (0.5, False, "rg:chain_sum"), "its current verdict"
    assert (ds[1]["reward"], ds[1]["passed"]) == (1.0, True)
    script = ds[2]
    assert script["prompt"] == [{"role": "user", "content": "Write f."}]
    assert script["completion"] == [{"role": "assistant", "content": "def f(x): return x"}]
    assert (script["reward"], script["passed"]) == (0.0, False)
    assert (ds[3]["reward"], ds[3]["passed"], ds[3]["status"]) == (None, None, "error"), "an error is no score"

    jsonl = tmp_path / "flat.jsonl"
    export("--format", "jsonl", "--out", str(jsonl), "--data", str(data), "--view", "flat", "--env", "py-func")
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert lines == [{k: v for k, v in row.items()} for row in ds.to_list()[2:]]


def test_an_empty_export_is_a_valid_file_and_a_failed_one_leaves_none(tmp_path: Path) -> None:
    data = tmp_path / "farm"
    seed_store(data)
    for fmt in ("parquet", "jsonl"):
        out = tmp_path / "empty" / f"none.{fmt}"
        assert export("--format", fmt, "--out", str(out), "--data", str(data), "--env", "shell")["exported"] == 0
        if fmt == "parquet":
            table = pq.read_table(out)
            assert table.num_rows == 0 and table.schema.field("finished_at").type == STAMP
            assert "turns" in table.schema.names
        else:
            assert out.read_text() == ""
    assert sorted(os.listdir(tmp_path / "empty")) == ["none.jsonl", "none.jsonl.manifest.json", "none.parquet",
                                                      "none.parquet.manifest.json"], "no partial file is left"

    nowhere = tmp_path / "nowhere.parquet"
    missing = farmctl("export", "--format", "parquet", "--out", str(nowhere), "--data", str(tmp_path / "empty"),
                      check=False)
    assert missing.returncode == 1 and b"holds no farm.db" in missing.stderr
    down = farmctl("--addr", "127.0.0.1:1", "export", "--format", "jsonl", "--out",
                   str(nowhere.with_suffix(".jsonl")), "--json", check=False)
    assert down.returncode == 1 and json.loads(down.stdout)["error"]["code"] == "UNAVAILABLE"
    assert not any(p.name.startswith((".nowhere", "nowhere")) for p in tmp_path.iterdir())


def test_the_file_name_decides_the_format_and_a_contradiction_is_refused(tmp_path: Path) -> None:
    import datasets

    data = tmp_path / "farm"
    seed_store(data)
    named = tmp_path / "x.parquet"
    assert export("--out", str(named), "--data", str(data))["format"] == "parquet"
    assert pq.read_table(named).num_rows > 0
    assert datasets.load_dataset("parquet", data_files=str(named), split="train").num_rows > 0
    plain = tmp_path / "x.data"
    assert export("--out", str(plain), "--data", str(data))["format"] == "jsonl", "no extension: jsonl, as before"
    assert json.loads(plain.read_text().splitlines()[0])["id"]
    for fmt, name in (("jsonl", "y.parquet"), ("parquet", "y.jsonl")):
        refused = farmctl("export", "--format", fmt, "--out", str(tmp_path / name), "--data", str(data),
                          check=False)
        assert refused.returncode == 2 and b"--format is " + fmt.encode() in refused.stderr, refused.stderr
        assert not (tmp_path / name).exists()


def test_show_escapes_everything_an_attempt_wrote(running_farm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "farm"
    first, *_ = seed_store(data, hostile=HOSTILE)
    farm = running_farm("--workers", "0", data_dir=data)
    shown = farm.farmctl("trajectories", "show", str(first), env={**os.environ, "COLUMNS": "400"})
    assert_shown_safely(shown.stdout)
    out = shown.stdout.decode()
    # node, the prompt, a user and a tool message, a tool call, a step's action and its output, the current
    # verdict's reason (the later score's), and in the table of every verdict the first's and the later one's
    assert out.count(SHOWN) == 10, out
    for expected in ("[2] assistant", "[3] tool answering c1", "tool call sh", "3 completion tokens", "logprobs stored", "no logprobs", "exit 0",
                     "violations: wall", "verifier 2", "flags: truncated", "every verdict it was given", "timeout",
                     "first", "current", "2023-11-14T22:13:20.250"):
        assert expected in out, (expected, out)

    record = json.loads(farm.farmctl("trajectories", "show", str(first), "--json").stdout)
    assert record["messages"][1]["content"] == f"What is 2+3?{HOSTILE}", "--json keeps every character"
    assert record["turns"][0]["token_ids"] == REPLY_IDS
    assert record["started_at"] == pytest.approx(STARTED, abs=1e-6)
    assert [(s["verifier_version"], s["reward"]) for s in record["scores"]] == [("1", 1.0), ("2", 0.5)]


@pytest.mark.parametrize("view", ["record", "flat"])
def test_an_export_is_written_page_by_page(tmp_path: Path, view: str) -> None:
    from farmd.cli import export_cmd

    data = tmp_path / "farm"
    data.mkdir()
    n = export_cmd.STORE_PAGE * 2 + 3

    async def write() -> None:
        store = await Store.open(data / "farm.db")
        try:
            await store.enqueue([("py-func", 1, 1, "random", n)])
            jobs = await store.lease("seed", n, 60, lambda _agent: 0)
            await store.complete([("seed", scripted(j)) for j in jobs])
        finally:
            await store.close()

    asyncio.run(write())
    out = tmp_path / "many.parquet"
    assert export("--format", "parquet", "--out", str(out), "--data", str(data), "--view", view)["exported"] == n
    parquet = pq.ParquetFile(out)
    assert parquet.metadata.num_rows == n and parquet.num_row_groups == 3, "one row group per page read"
