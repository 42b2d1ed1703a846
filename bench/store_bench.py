"""The trajectory store with trainer-sized records, each figure beside raw SQLite in the same run.

    .venv/bin/python -m bench --only store
    .venv/bin/python -m bench --only store --json

A record is what a chat agent's rollout stores: a py-func task as posed, a three-message conversation
(system, the task, the reply), one turn of a ~200-token prompt and a 256-token completion with its token
ids and sampled logprobs, the sampling parameters; groups of 8.

Figures (medians over rounds; each round measures farm and raw back to back):
- ingest: trajectories/s through the farm's own path (``Store.enqueue`` of a round's groups at once,
  as a Run call does, then ``lease`` and ``complete`` 64 at a time, as a worker flushes), against raw
  ``sqlite3`` writing the same rows (the columns and compressed bodies the farm stored) into an
  identical table, one transaction per 64, same pragmas;
- the trainer stream: trajectories/s read back as records (``Store.trajectories`` in pages, and whole
  groups as the stream picks them), and received by a trainer (``FarmClient.batches(whole_groups=True)``
  from a ``farmd serve --workers 0`` on the ingested store, each batch acked), against raw ``sqlite3``
  selecting the same rows and decoding their bodies to plain values (``zlib``, ``json.loads``, and the
  token ids and logprobs that follow the JSON as arrays).

These print figures; they assert nothing.
"""

from __future__ import annotations

import json
import random
import sqlite3
import statistics
import struct
import tempfile
import time
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
from farm_client import FarmClient
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from bench.common import drain, farmd, raw_insert, raw_table, stored_rows, verdicts
from farmd.envs import get
from farmd.records import (
    ChatMessage,
    Job,
    JobState,
    PosedTask,
    SamplingParams,
    Step,
    Timings,
    Trajectory,
    Turn,
    Usage,
)
from farmd.rollout.worker import _FLUSH_MAX
from farmd.store import Store
from farmd.store.codec import checked_bodies

GROUP = 8  # the scheduler's default group size
FLUSH = _FLUSH_MAX  # trajectories per complete call: what a busy worker flushes
LEASE_S = 600.0
PAGE = 512  # a trainer's batch: 64 whole groups
PROMPT_TOKENS = 200
COMPLETION_TOKENS = 256
VOCAB = 151_936  # Qwen2.5's: ids of five and six digits, as a real tokenizer's are
PAYLOADS = 64
"""Distinct conversations, cycled: each record's body is compressed alone, so more would change nothing."""

GOALS = {"ingest_ratio": 0.5}  # farm / raw, trajectories/s

_SYSTEM = "You are a careful Python programmer. Think briefly, then answer with one ```python block."
_WORDS = ("the", "function", "takes", "each", "digit", "list", "sum", "then", "we", "return", "value", "so",
          "first", "compute", "absolute", "of", "its", "and", "square", "number", "step", "prefix", "check",
          "example", "gives", "which", "matches", "input", "output", "integer", "loop", "over", "a", "is")


# -- trainer-sized records ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Payload:
    """What one rollout of a chat agent adds to its job: the task, the conversation, the sampled tokens."""

    task: PosedTask
    messages: tuple[ChatMessage, ...]
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    final: str


def _logprob(rng: random.Random) -> float:
    """A sampled token's logprob as a server sends it: mostly near 0, a float32 widened to a double
    (so its repr runs to ~20 characters, as real ones do)."""
    value = -rng.expovariate(8.0) if rng.random() < 0.9 else -rng.expovariate(0.5)
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _payloads(n: int) -> list[_Payload]:
    env = get("py-func")
    rng = random.Random(8)
    out = []
    for i in range(n):
        task = env.generate(i, 1 + i % env.max_difficulty)
        code = env.reference(task).final
        thinking = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(120, 150)))
        reply = f"{thinking.capitalize()}.\n\n```python\n{code}```\n"
        posed = PosedTask(kind=task.kind, prompt=task.prompt, entry_point=task.entry_point or "",
                          answer_format=task.answer_format or "", examples=list(task.examples),
                          metadata=dict(task.metadata))
        messages = (ChatMessage("system", _SYSTEM), ChatMessage("user", task.prompt), ChatMessage("assistant", reply))
        out.append(_Payload(
            task=posed, messages=messages,
            prompt_token_ids=tuple(rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)),
            token_ids=tuple(rng.randrange(VOCAB) for _ in range(COMPLETION_TOKENS)),
            logprobs=tuple(_logprob(rng) for _ in range(COMPLETION_TOKENS)), final=code))
    return out


def _trajectory(job: Job, p: _Payload) -> Trajectory:
    """The record the rollout runner would hand the worker for ``job`` (already sealed: nothing to cut)."""
    turn = Turn(message_index=2, prompt_messages=2, completion=p.messages[2].content,
                prompt_token_ids=list(p.prompt_token_ids), token_ids=list(p.token_ids), logprobs=list(p.logprobs),
                has_logprobs=True, finish_reason="stop",
                usage=Usage(PROMPT_TOKENS, COMPLETION_TOKENS, PROMPT_TOKENS + COMPLETION_TOKENS, 1, 0), latency=2.31)
    return Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed, difficulty=job.difficulty,
        agent=job.agent, policy_version=job.policy_version, reward=1.0, passed=True, status="ok",
        reasons=["all 10 tests passed"], flags=[], verifier_version="1",
        steps=[Step(duration=0.021)], final=p.final, node="bench-node", verdict_details={"tests": 10, "failed": 0},
        task=p.task, messages=[ChatMessage(m.role, m.content) for m in p.messages], turns=[turn],
        sampling=SamplingParams(model="Qwen/Qwen2.5-7B-Instruct", temperature=1.0, max_tokens=COMPLETION_TOKENS),
        usage=Usage(PROMPT_TOKENS, COMPLETION_TOKENS, PROMPT_TOKENS + COMPLETION_TOKENS, 1, 0),
        timings=Timings(task=0.0012, agent=2.31, verify=0.021, total=2.333), started_at=time.time() - 2.333)


# -- ingest ---------------------------------------------------------------------------------------


async def _farm_ingest(db: Path, n: int, payloads: list[_Payload]) -> dict[str, float]:
    """``n`` rollouts queued in one call, then leased and completed ``FLUSH`` at a time by one worker.

    Making each record (the runner's work) is left out of the time; everything the store does is in.
    """
    store = await Store.open(db)
    try:
        groups = [("py-func", i, 1 + i % 5, "chat:bench", GROUP) for i in range(n // GROUP)]
        t0 = time.perf_counter()
        await store.enqueue(groups)
        enqueue_s = time.perf_counter() - t0
        lease_s = complete_s = 0.0
        owner = "bench-node:1:worker"
        stored = 0
        while True:
            t0 = time.perf_counter()
            jobs = await store.lease(owner, FLUSH, LEASE_S, 0)
            lease_s += time.perf_counter() - t0
            if not jobs:
                break
            batch = [(owner, _trajectory(job, payloads[job.id % len(payloads)])) for job in jobs]
            t0 = time.perf_counter()
            stored += len(await store.complete(batch))
            complete_s += time.perf_counter() - t0
    finally:
        await store.close()
    if stored != n:
        raise RuntimeError(f"the store kept {stored} of {n} trajectories")
    total_s = enqueue_s + lease_s + complete_s
    return {"per_s": n / total_s, "complete_per_s": n / complete_s, "enqueue_share": enqueue_s / total_s,
            "lease_share": lease_s / total_s, "complete_share": complete_s / total_s}


def _pack_rate(payloads: list[_Payload], n: int) -> float:
    """Bodies/s of the store's own packing of such records, alone, on one thread, as ``complete`` packs them:
    each checked for its domain, then packed (``checked_bodies``)."""
    jobs = [Job(id=i + 1, group_id=i // GROUP + 1, env="py-func", seed=i, difficulty=1, agent="chat:bench",
                state=JobState.LEASED, attempts=1) for i in range(n)]
    records = {job.id: _trajectory(job, payloads[job.id % len(payloads)]) for job in jobs}
    t0 = time.perf_counter()
    checked_bodies(records)
    return n / (time.perf_counter() - t0)


def _raw_ingest(db: Path, raw: Path) -> dict[str, float]:
    """The farm's rows, bodies already packed, into an identical table: one transaction per ``FLUSH``.

    The table's REFERENCES to jobs is not enforced here (there are no jobs): the farm's check of it
    is part of what the farm pays.
    """
    ddl, columns, rows = stored_rows(db)
    with raw_table(raw, ddl) as con:
        elapsed = sum(raw_insert(con, columns, rows, FLUSH))
    return {"per_s": len(rows) / elapsed, "body_bytes": statistics.mean(len(r[columns.index("body")]) for r in rows)}


# -- reading back -----------------------------------------------------------------------------------


async def _farm_read(db: Path, n: int) -> dict[str, float]:
    """Records with bodies, in pages of ``PAGE`` (a stream of trajectories), and in whole groups (the
    two calls a ``whole_groups`` stream makes per batch)."""
    store = await Store.open(db)
    try:
        read = after = 0
        t0 = time.perf_counter()
        while page := await store.trajectories(after_seq=after, limit=PAGE):
            read += len(page)
            after = page[-1].seq
        paged_s = time.perf_counter() - t0
        grouped = done = 0
        t0 = time.perf_counter()
        while groups := await store.finished_groups(done, PAGE // GROUP):
            grouped += len(await store.group_trajectories([g.id for g in groups]))
            done = groups[-1].done_seq
        grouped_s = time.perf_counter() - t0
    finally:
        await store.close()
    if read != n or grouped != n:
        raise RuntimeError(f"read {read} and {grouped} of {n} trajectories")
    return {"paged_per_s": n / paged_s, "grouped_per_s": n / grouped_s}


_ARRAY_CODES = {"u32": "I", "f64": "d"}


def _raw_body(blob: bytes) -> dict[str, Any]:
    """A body as plain values with nothing of the store's: inflate and parse the JSON, and turn the arrays
    after it (a turn's ``{"u32": n}`` / ``{"f64": n}`` markers, in order) into lists."""
    inflate = zlib.decompressobj()
    body: dict[str, Any] = json.loads(inflate.decompress(blob))
    tail = inflate.unused_data
    at = 0
    for turn in body.get("turns", []):
        for name, marker in turn.items():
            if isinstance(marker, dict) and len(marker) == 1 and next(iter(marker)) in _ARRAY_CODES:
                ((kind, count),) = marker.items()
                values = array(_ARRAY_CODES[kind])
                end = at + count * values.itemsize
                values.frombytes(tail[at:end])
                turn[name], at = values.tolist(), end
    return body


def _raw_read(raw: Path, n: int) -> float:
    """The same rows in pages of ``PAGE`` with plain sqlite3, every body decoded: trajectories/s."""
    con = sqlite3.connect(f"file:{raw}?mode=ro", uri=True)
    try:
        columns = [c[1] for c in con.execute("PRAGMA table_info(trajectories)")]
        seq_at, body_at = columns.index("seq"), columns.index("body")
        select = f"SELECT {','.join(columns)} FROM trajectories WHERE seq > ? ORDER BY seq LIMIT ?"
        read = after = 0
        t0 = time.perf_counter()
        while page := con.execute(select, (after, PAGE)).fetchall():
            bodies = [_raw_body(row[body_at]) for row in page]
            read += len(bodies)
            after = page[-1][seq_at]
        elapsed = time.perf_counter() - t0
    finally:
        con.close()
    if read != n:
        raise RuntimeError(f"raw read {read} of {n} trajectories")
    return n / elapsed


def _stream(client: FarmClient, consumer: str, n: int) -> float:
    """``n`` trajectories of whole groups as a trainer takes them, each batch acked: trajectories/s."""
    t0 = time.perf_counter()
    got = len(drain(client, consumer, n, PAGE, whole_groups=True, deadline_s=120.0))
    return got / (time.perf_counter() - t0)


# -- all of it --------------------------------------------------------------------------------------


def _median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def measure(n: int, rounds: int, progress: Progress) -> dict[str, Any]:
    n = max(GROUP, n - n % GROUP)
    bar: TaskID = progress.add_task("store: trainer-sized records", total=3 * rounds)
    payloads = _payloads(PAYLOADS)
    ingest: list[dict[str, float]] = []
    reads: list[dict[str, float]] = []
    streams: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="farm-store-bench-") as tmp:
        root = Path(tmp)
        for r in range(rounds):
            progress.update(bar, description=f"store: ingest, round {r + 1} of {rounds}, farm then raw")
            data, raw = root / f"farm-{r}", root / f"raw-{r}.db"
            farm = uvloop.run(_farm_ingest(data / "farm.db", n, payloads))  # the file farmd opens in its data dir
            base = _raw_ingest(data / "farm.db", raw)
            pack = _pack_rate(payloads, n)
            ingest.append({**farm, "raw_per_s": base["per_s"], "ratio": farm["per_s"] / base["per_s"],
                           "ratio_complete": farm["complete_per_s"] / base["per_s"], "pack_per_s": pack,
                           "ratio_pack": pack / base["per_s"], "pack_share": farm["per_s"] / pack,
                           "body_bytes": base["body_bytes"]})
            progress.advance(bar)
        # Reads go over the last round's rows again and again: the page cache is as warm for farm as for raw.
        for r in range(rounds):
            progress.update(bar, description=f"store: reading back, round {r + 1} of {rounds}, farm then raw")
            farm = uvloop.run(_farm_read(data / "farm.db", n))
            base_read = _raw_read(raw, n)
            reads.append({**farm, "raw_per_s": base_read, "ratio_paged": farm["paged_per_s"] / base_read,
                          "ratio_grouped": farm["grouped_per_s"] / base_read})
            progress.advance(bar)
        progress.update(bar, description="store: starting farmd --workers 0 on the last round's store")
        with farmd(data, 0) as addr, FarmClient(addr) as client:
            for r in range(rounds):
                progress.update(bar, description=f"store: trainer stream over gRPC, round {r + 1} of {rounds}")
                rate = _stream(client, f"trainer-{r}", n)  # a new consumer: its cursor starts at the beginning
                base_read = _raw_read(raw, n)
                streams.append({"grpc_per_s": rate, "raw_per_s": base_read, "ratio": rate / base_read})
                progress.advance(bar)
    rep: dict[str, Any] = {
        "trajectories": n, "rounds": rounds, "group": GROUP, "flush": FLUSH, "page": PAGE,
        "prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
        "body_bytes": _median(ingest, "body_bytes"),
        "ingest": {k: _median(ingest, k) for k in ingest[0] if k != "body_bytes"},
        "read": {k: _median(reads, k) for k in reads[0]},
        "stream": {k: _median(streams, k) for k in streams[0]},
        "goals": GOALS,
    }
    rep["met"] = {"ingest_ratio": rep["ingest"]["ratio"] >= GOALS["ingest_ratio"]}
    return rep


def render(rep: dict[str, Any], console: Console) -> None:
    ing, rd, st = rep["ingest"], rep["read"], rep["stream"]
    table = Table("figure", "farm /s", "raw sqlite3 /s", "farm / raw", "goal",
                  title=f"store, trainer-sized records: {rep['trajectories']} trajectories a round in groups of "
                        f"{rep['group']}, medians of {rep['rounds']} rounds")
    table.add_row(f"ingest: enqueue, lease, complete {rep['flush']} a call", f"{ing['per_s']:,.0f}",
                  f"{ing['raw_per_s']:,.0f}", f"{ing['ratio']:.2f}", f">= {GOALS['ingest_ratio']:g}")
    table.add_row("  complete calls alone", f"{ing['complete_per_s']:,.0f}", f"{ing['raw_per_s']:,.0f}",
                  f"{ing['ratio_complete']:.2f}", "")
    table.add_row("  packing bodies alone (no SQL)", f"{ing['pack_per_s']:,.0f}", f"{ing['raw_per_s']:,.0f}",
                  f"{ing['ratio_pack']:.2f}", "")
    table.add_row(f"read records, pages of {rep['page']}", f"{rd['paged_per_s']:,.0f}", f"{rd['raw_per_s']:,.0f}",
                  f"{rd['ratio_paged']:.2f}", "")
    table.add_row(f"read records, whole groups, {rep['page']} a batch", f"{rd['grouped_per_s']:,.0f}",
                  f"{rd['raw_per_s']:,.0f}", f"{rd['ratio_grouped']:.2f}", "")
    table.add_row("trainer stream over gRPC, whole groups", f"{st['grpc_per_s']:,.0f}", f"{st['raw_per_s']:,.0f}",
                  f"{st['ratio']:.2f}", "")
    console.print(table)
    console.print(f"  a record: a py-func task, system/user/assistant messages, one turn of {rep['prompt_tokens']} "
                  f"prompt and {rep['completion_tokens']} completion token ids with logprobs; its stored body "
                  f"{rep['body_bytes']:,.0f} bytes")
    console.print("  farm ingest: Store.enqueue (the round's groups in one call), then lease and complete "
                  f"{rep['flush']} at a time (a worker's flush); making the records is not counted. Of its time: "
                  f"enqueue {ing['enqueue_share']:.0%}, lease {ing['lease_share']:.0%}, complete "
                  f"{ing['complete_share']:.0%}; packing the bodies (inside complete, timed apart) is about "
                  f"{ing['pack_share']:.0%} of the whole")
    console.print("  raw ingest: the rows the farm stored (same columns, same body bytes) into an identical table, "
                  f"WAL and synchronous=NORMAL, executemany in one transaction per {rep['flush']}")
    console.print("  reads: Store.trajectories, and finished_groups + group_trajectories, to records; "
                  "FarmClient.batches(whole_groups=True) from farmd --workers 0, each batch acked. Raw: a paged "
                  "SELECT and every body decoded to plain values (zlib, json, arrays), in the same round")
    verdicts(console, rep["met"], LIMITS, goals={name: f"farm / raw ingest >= {goal:g}"
                                                 for name, goal in GOALS.items()})


LIMITS = [
    "ingest: packing a body (its numbers checked for their domain, lists of token ids and logprobs by msgspec in C, "
    "its JSON by orjson, deflated by ISA-L, the token ids and logprobs copied as arrays) takes about 2.2 times "
    "what raw's insert of a row does, alone (0.46 of raw's rate; 0.31 before the lists' checks moved to C, 0.43 before "
    "trees were looked at quickly first); the "
    "rest is SQL the raw figure does not do (a lease transaction per batch, the jobs' rows and "
    "indexes, the groups' done order) and a round trip to aiosqlite's thread per statement (~0.1 ms each on a "
    "loaded 2-core VM). Raw inserts bodies packed beforehand: at 0.5 all of that would have to fit in the time of "
    "one more raw insert, and the SQL alone (bodies packed for free) measured about 0.3-0.4",
    "reads: building a record from its row (nested dataclasses; lists of numbers are copied whole) costs about "
    "as much as decoding the body, which is all the raw read does",
    "the gRPC stream adds the proto conversion at both ends (farmd's to_message, farm_client's from_message)",
    "this VM is noisy: rerun and compare ratios, not absolute figures",
]
