"""farmd end to end, each figure beside a baseline measured in the same run.

    .venv/bin/python -m bench --only farm
    .venv/bin/python -m bench --only farm --json

Figures:
- rollouts/s: the ``reference`` agent on ``py-func`` through a real ``farmd serve`` (a Run
  call, then the trainer stream until the last trajectory arrives), against an inline
  loop in one process that makes the same tasks, runs the reference in a plain,
  unsandboxed ``python3`` and scores it, at the same concurrency; and, between the two,
  the same tasks through farm's own verifier and sandbox without farmd (so the gap
  splits into the box's price and farmd's);
- the store: trajectories/s ingested (``complete``, 64 per call, as a worker flushes) and
  read back in stream order (pages of 1000), against raw ``sqlite3`` on an identical
  table; and the stream over gRPC (``FarmClient.batches``, 1000 a batch) from a
  coordinator-only farmd whose store was filled beforehand;
- verdict to trainer: p50/p99 of the time from a trajectory's verdict to a trainer
  holding it, streamed against polled (``ListTrajectories`` every 100 ms), with an
  upper bound measured from the Run call.

These print figures; they assert nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import uvloop
from farm_client import FarmClient
from farm_client.record import Trajectory as StreamedTrajectory
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from bench.common import drain, farmd, raw_insert, raw_table, stored_rows, verdicts
from farmd.envs import VerifyContext, get
from farmd.envs.pyfunc import PyFunc
from farmd.records import Job, Step, Timings, Trajectory
from farmd.rollout.worker import _FLUSH_S
from farmd.sandbox import Sandbox, SandboxConfig
from farmd.store import Store
from farmd.verifier import VerifierKey

PYTHON = "/usr/bin/python3"  # the box's interpreter (SandboxConfig.box_python), run here without a box
PYTHON_FLAGS = ("-I", "-S", "-B")  # as the verifier's judge runs it
KEY = VerifierKey(b"bench-key-bench-key-bench-key!!")
GROUP = 8  # the scheduler's default group size
COMPLETE_BATCH = 64  # what a worker flushes at most per complete call (worker._FLUSH_MAX)
PAGE = 1000
LATENCY_ENV = "rg:basic_arithmetic"
LATENCY_GROUP = 2
LATENCY_EVERY_S = 0.1  # one group of 2 every 100 ms: 20 rollouts/s, well under what 2 cores can do
POLL_S = 0.1

GOALS = {
    "rollouts_ratio": 0.8,  # farmd / inline loop, rollouts/s
    "ingest_per_s": 20_000.0,
    "stream_per_s": 20_000.0,
    "latency_p50_ms": 50.0,
}

# The inline loop's judge: run the submission on the tests' inputs, print the values as JSON.
_RUNNER = """\
import copy, json
ns = {}
exec(open("submission.py").read(), ns)
fn = ns["transform"]
print(json.dumps([fn(copy.deepcopy(a)) for a in json.load(open("tests.json"))]))
"""


def _pct(samples: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile."""
    s = sorted(samples)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


# -- a real farmd ---------------------------------------------------------------------------------


# -- 1. rollouts/s: farmd against an inline loop ----------------------------------------------------


def _farmd_rollouts(data: Path, rollouts: int, workers: int, tick: Callable[[int], None]
                    ) -> tuple[float, list[dict[str, Any]]]:
    with farmd(data, workers) as addr, FarmClient(addr) as client:
        # One-off set-up (the box runtime, page cache, imports) is not what a rollout costs.
        warm = client.run("py-func", "reference", 2 * workers, GROUP)["jobs"]
        drain(client, "bench", warm, 64)
        t0 = time.perf_counter()
        client.run("py-func", "reference", rollouts, GROUP)
        got = drain(client, "bench", rollouts, 64, tick=tick)
        elapsed = time.perf_counter() - t0
    return rollouts / elapsed, got


async def _inline_one(env: PyFunc, seed: int, difficulty: int, scratch: Path) -> bool:
    """One rollout without farm: make the task, run the reference in a plain python3, score it."""
    task = env.generate(seed, difficulty)
    source = env.reference(task).final
    inputs = env.hidden_inputs(task, VerifyContext(sandbox=None, key=KEY))  # type: ignore[arg-type]
    ref = env._chain(seed, difficulty).function()
    expected = json.loads(json.dumps([ref(copy.deepcopy(x)) for x in inputs]))
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        work = Path(tmp)
        (work / "submission.py").write_text(source)
        (work / "tests.json").write_text(json.dumps(inputs))
        (work / "run.py").write_text(_RUNNER)
        proc = await asyncio.create_subprocess_exec(
            PYTHON, *PYTHON_FLAGS, "run.py", cwd=work, env={}, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return False
    if proc.returncode != 0:
        return False
    try:
        got = json.loads(out)
    except ValueError:
        return False
    return bool(got == expected)


async def _pool(tasks: list[tuple[int, int]], concurrency: int, one: Callable[[int, int], Awaitable[bool]],
                tick: Callable[[int], None]) -> tuple[float, int]:
    """Rollouts/s and passes of ``one(seed, difficulty)`` over ``tasks``, ``concurrency`` at a time."""
    for seed, difficulty in tasks[:concurrency]:  # warm up as farmd was: page cache, first imports
        await one(seed, difficulty)
    queue = list(reversed(tasks))
    passed = 0

    async def worker() -> None:
        nonlocal passed
        while queue:
            ok = await one(*queue.pop())  # not `passed += await ...`, which reads passed before the await
            passed += ok
            tick(1)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return len(tasks) / (time.perf_counter() - t0), passed


async def _inline_rollouts(tasks: list[tuple[int, int]], concurrency: int, scratch: Path,
                           tick: Callable[[int], None]) -> tuple[float, int]:
    env = get("py-func")
    assert isinstance(env, PyFunc)
    return await _pool(tasks, concurrency, functools.partial(_inline_one, env, scratch=scratch), tick)


async def _boxed_rollouts(tasks: list[tuple[int, int]], concurrency: int, tick: Callable[[int], None]
                          ) -> tuple[float, int]:
    """The same rollouts through farm's own verifier and sandbox, but no farmd: no queue, store or stream."""
    env = get("py-func")
    async with Sandbox(SandboxConfig(max_boxes=2 * concurrency + 2)) as sandbox:  # as farmd sizes it
        ctx = VerifyContext(sandbox=sandbox, key=KEY)

        async def one(seed: int, difficulty: int) -> bool:
            task = await asyncio.to_thread(env.generate, seed, difficulty)  # as the rollout runner does
            verdict = await env.verify(task, env.reference(task), ctx)
            return verdict.passed

        return await _pool(tasks, concurrency, one, tick)


def _measure_rollouts(root: Path, rollouts: int, workers: int, progress: Progress, bar: TaskID) -> dict[str, Any]:
    def tick(n: int) -> None:
        progress.advance(bar, n)

    progress.update(bar, description=f"farm: {rollouts} py-func rollouts through farmd")
    farm_rate, got = _farmd_rollouts(root / "rollouts", rollouts, workers, tick)
    tasks = [(t.seed, t.difficulty) for t in sorted(got, key=lambda t: t.id)][:rollouts]
    progress.update(bar, description=f"farm: the same {len(tasks)} rollouts inline, unsandboxed")
    scratch = root / "inline"
    scratch.mkdir()
    inline_rate, inline_passed = uvloop.run(_inline_rollouts(tasks, workers, scratch, tick))
    progress.update(bar, description="farm: the same rollouts boxed and verified, without farmd")
    boxed_rate, boxed_passed = uvloop.run(_boxed_rollouts(tasks, workers, tick))
    return {
        "rollouts": len(tasks), "workers": workers, "tasks": len(set(tasks)),
        "farmd_per_s": farm_rate, "boxed_per_s": boxed_rate, "inline_per_s": inline_rate,
        "ratio": farm_rate / inline_rate, "ratio_boxed": farm_rate / boxed_rate,
        "farmd_passed": sum(1 for t in got if t.passed), "boxed_passed": boxed_passed,
        "inline_passed": inline_passed,
    }


# -- 2. the store: ingest and stream rates ------------------------------------------------------


def _templates() -> list[tuple[str, int]]:
    """Reference sources of a few py-func tasks, and their test counts: what a stored trajectory holds."""
    env = get("py-func")
    assert isinstance(env, PyFunc)
    out = []
    for seed in range(16):
        task = env.generate(seed, 1 + seed % env.max_difficulty)
        tests = len(env.hidden_inputs(task, VerifyContext(sandbox=None, key=KEY)))  # type: ignore[arg-type]
        out.append((env.reference(task).final, tests))
    return out


def _trajectory(job: Job, template: tuple[str, int]) -> Trajectory:
    source, tests = template
    return Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version="1", seed=job.seed, difficulty=job.difficulty,
        agent=job.agent, policy_version=job.policy_version, reward=1.0, passed=True, status="ok",
        reasons=[f"all {tests} tests passed"], flags=[], verifier_version="1",
        steps=[Step()], final=source, node="bench", timings=Timings(task=0.0012, agent=0.0003, verify=0.021, total=0.0225),
        verdict_details={"tests": tests, "failed": 0},
    )


async def _store_rates(db: Path, n: int, tick: Callable[[int], None]) -> dict[str, Any]:
    templates = _templates()
    store = await Store.open(db)
    try:
        groups = [("py-func", i, 1 + i % 5, "reference", GROUP) for i in range(math.ceil(n / GROUP))]
        await store.enqueue(groups)  # as one Run call of n rollouts does: the whole queue at once
        lease_s = complete_s = 0.0
        per_call: list[float] = []
        stored = 0
        owner = "bench-node:1:worker"
        while True:
            t0 = time.perf_counter()
            jobs = await store.lease(owner, COMPLETE_BATCH, 600.0, 0)
            lease_s += time.perf_counter() - t0
            if not jobs:
                break
            batch = [(owner, _trajectory(job, templates[job.group_id % len(templates)])) for job in jobs]
            t0 = time.perf_counter()
            stored += len(await store.complete(batch))
            took = time.perf_counter() - t0
            complete_s += took
            per_call.append(took)
            tick(len(batch))
        read = 0
        after = 0
        t0 = time.perf_counter()
        while True:
            page = await store.trajectories(after_seq=after, limit=PAGE)
            if not page:
                break
            read += len(page)
            after = page[-1].seq
            tick(len(page))
        read_s = time.perf_counter() - t0
    finally:
        await store.close()
    return {"stored": stored, "ingest_per_s": stored / complete_s, "complete_median_ms": statistics.median(per_call)
            * 1000, "lease_per_s": stored / lease_s, "read": read, "read_per_s": read / read_s}


def _raw_rates(db: Path, raw: Path, tick: Callable[[int], None]) -> dict[str, Any]:
    """The same rows into an identical table with plain sqlite3 (64 a transaction), and read back."""
    ddl, columns, rows = stored_rows(db)
    with raw_table(raw, ddl) as con:
        per_call = raw_insert(con, columns, rows, COMPLETE_BATCH, tick)
        read = 0
        after = 0
        seq_at = columns.index("seq")
        select = f"SELECT {','.join(columns)} FROM trajectories WHERE seq > ? ORDER BY seq LIMIT ?"
        t0 = time.perf_counter()
        while True:
            page = con.execute(select, (after, PAGE)).fetchall()
            if not page:
                break
            read += len(page)
            after = page[-1][seq_at]
            tick(len(page))
        read_s = time.perf_counter() - t0
    return {"ingest_per_s": len(rows) / sum(per_call), "complete_median_ms": statistics.median(per_call) * 1000,
            "read_per_s": read / read_s}


def _grpc_stream(data: Path, n: int, tick: Callable[[int], None]) -> float:
    with farmd(data, 0) as addr, FarmClient(addr) as client:
        t0 = time.perf_counter()
        got = drain(client, "drain", n, PAGE, tick=tick)
        elapsed = time.perf_counter() - t0
    return len(got) / elapsed


def _measure_store(root: Path, n: int, progress: Progress, bar: TaskID) -> dict[str, Any]:
    def tick(k: int) -> None:
        progress.advance(bar, k)

    data = root / "store"
    data.mkdir()
    db = data / "farm.db"  # the file farmd opens in its data directory
    progress.update(bar, description=f"farm: store, {n} trajectories in and out")
    store = uvloop.run(_store_rates(db, n, tick))
    progress.update(bar, description="farm: raw sqlite3, the same rows in and out")
    raw = _raw_rates(db, root / "raw.db", tick)
    progress.update(bar, description="farm: streaming them over gRPC from farmd --workers 0")
    stream = _grpc_stream(data, store["stored"], tick)
    return {"trajectories": store["stored"], "store": store, "raw": raw, "grpc_stream_per_s": stream}


# -- 3. verdict to trainer: streamed against polled ------------------------------------------------


Received = list[tuple[float, StreamedTrajectory]]
"""(wall clock at receipt, trajectory) pairs."""


def _receive_stream(client: FarmClient, want: int, got: Received, stop: threading.Event,
                    tick: Callable[[int], None]) -> None:
    with contextlib.suppress(grpc.RpcError):  # the channel closed under it: the phase is over
        for batch in client.batches("lat", batch_size=1):
            now = time.time()
            got.extend((now, t) for t in batch.trajectories)
            client.ack(batch)
            tick(len(batch))
            if len(got) >= want or stop.is_set():
                return


def _receive_polled(client: FarmClient, want: int, got: Received, stop: threading.Event,
                    tick: Callable[[int], None], after: int) -> None:
    with contextlib.suppress(grpc.RpcError):
        while len(got) < want and not stop.is_set():
            # A poller asks for the newest and keeps what it has not seen.
            rows = [t for t in client.trajectories(limit=PAGE, newest_first=True) if t.seq > after]
            now = time.time()
            got.extend((now, t) for t in rows)
            tick(len(rows))
            after = max([after, *(t.seq for t in rows)])
            stop.wait(POLL_S)


def _phase(addr: str, groups: int, receive: Callable[[FarmClient, int, Received, threading.Event], None]
           ) -> tuple[Received, dict[int, float]]:
    """Queue ``groups`` small groups at a steady pace while ``receive`` collects in a thread.

    Returns what was received and, per group, the wall clock when its Run call returned.
    """
    want = groups * LATENCY_GROUP
    got: Received = []
    queued: dict[int, float] = {}
    stop = threading.Event()
    with FarmClient(addr) as submitter, FarmClient(addr) as trainer:
        thread = threading.Thread(target=receive, args=(trainer, want, got, stop), daemon=True)
        thread.start()
        time.sleep(0.2)  # the trainer is listening before the first rollout can finish
        start = time.monotonic()
        for i in range(groups):
            time.sleep(max(0.0, start + i * LATENCY_EVERY_S - time.monotonic()))
            reply = submitter.run(LATENCY_ENV, "reference", LATENCY_GROUP, LATENCY_GROUP)
            queued[reply["group_ids"][0]] = time.time()  # durable from here on
        thread.join(30)
        stop.set()
        trainer.close()  # ends a stream still waiting for a trajectory that never came
        thread.join(5)
    return got, queued


async def _rollout_seconds(db: Path) -> dict[int, float]:
    store = await Store.open(db)
    try:
        out: dict[int, float] = {}
        after = 0
        while page := await store.trajectories(after_seq=after, limit=PAGE):
            out.update((t.id, t.timings.total) for t in page)
            after = page[-1].seq
        return out
    finally:
        await store.close()


def _latencies(got: Received, queued: dict[int, float], rollout_s: dict[int, float]
               ) -> dict[str, Any]:
    ms = 1000.0
    stored = [(now - t.finished_at) * ms for now, t in got]
    bound = [(now - queued[t.group_id] - rollout_s.get(t.id, 0.0)) * ms for now, t in got
             if t.group_id in queued]
    return {
        "samples": len(stored),
        "stored_p50_ms": _pct(stored, 0.5), "stored_p99_ms": _pct(stored, 0.99),
        "bound_p50_ms": _pct(bound, 0.5), "bound_p99_ms": _pct(bound, 0.99),
    }


def _measure_latency(root: Path, seconds: float, workers: int, progress: Progress, bar: TaskID) -> dict[str, Any]:
    def tick(k: int) -> None:
        progress.advance(bar, k)

    groups = max(1, round(seconds / LATENCY_EVERY_S))
    data = root / "latency"
    with farmd(data, workers) as addr, FarmClient(addr) as client:
        progress.update(bar, description=f"farm: warming up {LATENCY_ENV}")
        warm = client.run(LATENCY_ENV, "reference", 2 * workers, LATENCY_GROUP)["jobs"]
        drain(client, "lat", warm, 64)  # reasoning-gym's first import is a second, not latency
        progress.update(bar, description="farm: verdict to trainer, streamed")
        streamed, queued = _phase(addr, groups, functools.partial(_receive_stream, tick=tick))
        after = max((t.seq for _, t in streamed), default=0)
        after = max([after, *(t.seq for t in client.trajectories(limit=PAGE, newest_first=True))])
        progress.update(bar, description=f"farm: verdict to trainer, polled every {POLL_S * 1000:.0f} ms")
        polled, queued_polled = _phase(addr, groups, functools.partial(_receive_polled, tick=tick, after=after))
    rollout_s = uvloop.run(_rollout_seconds(data / "farm.db"))
    return {"rollouts": groups * LATENCY_GROUP, "env": LATENCY_ENV,
            "rate_per_s": LATENCY_GROUP / LATENCY_EVERY_S, "flush_every_ms": _FLUSH_S * 1000,
            "streamed": _latencies(streamed, queued, rollout_s),
            "polled": _latencies(polled, queued_polled, rollout_s)}


# -- all of it --------------------------------------------------------------------------------------


def measure(rollouts: int, trajectories: int, latency_s: float, progress: Progress) -> dict[str, Any]:
    workers = os.cpu_count() or 1
    groups = max(1, round(latency_s / LATENCY_EVERY_S))
    bars = (progress.add_task("farm: rollouts", total=3 * rollouts),
            progress.add_task("farm: store", total=5 * trajectories),
            progress.add_task("farm: latency", total=2 * groups * LATENCY_GROUP))
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        root = Path(tmp)
        rep = {
            "rollouts": _measure_rollouts(root, rollouts, workers, progress, bars[0]),
            "store": _measure_store(root, trajectories, progress, bars[1]),
            "latency": _measure_latency(root, latency_s, workers, progress, bars[2]),
        }
    r, s, lat = rep["rollouts"], rep["store"], rep["latency"]
    rep["met"] = {
        "rollouts_ratio": r["ratio"] >= GOALS["rollouts_ratio"],
        "ingest_per_s": s["store"]["ingest_per_s"] >= GOALS["ingest_per_s"],
        "stream_per_s": s["grpc_stream_per_s"] >= GOALS["stream_per_s"],
        "latency_p50_ms": lat["streamed"]["stored_p50_ms"] < GOALS["latency_p50_ms"],
    }
    rep["goals"] = GOALS
    return rep


def render(rep: dict[str, Any], console: Console) -> None:
    r = rep["rollouts"]
    table = Table("run", "rollouts/s", "passed", "farmd / this", "goal",
                  title=f"farmd end to end: py-func, reference agent, {r['rollouts']} rollouts of {r['tasks']} "
                        f"tasks, {r['workers']} at a time")
    table.add_row("farmd", f"{r['farmd_per_s']:.1f}", str(r["farmd_passed"]), "1.00", "")
    table.add_row("boxed loop, no farmd", f"{r['boxed_per_s']:.1f}", str(r["boxed_passed"]),
                  f"{r['ratio_boxed']:.2f}", "")
    table.add_row("inline loop, no box", f"{r['inline_per_s']:.1f}", str(r["inline_passed"]), f"{r['ratio']:.2f}",
                  f">= {GOALS['rollouts_ratio']:g}")
    console.print(table)
    console.print("  farmd: from the Run call to the last trajectory received on the trainer stream (acked)")
    console.print(f"  inline loop: one process, {r['workers']} at a time: make the task, write its reference and "
                  "hidden tests to a temp dir, run a plain python3 (no box), compare the values on the host")
    console.print("  boxed loop: one process, the same tasks through farm's own verifier and sandbox, no "
                  "farmd: farmd / boxed is farmd's own cost, boxed / inline the box's")

    s = rep["store"]
    st, raw = s["store"], s["raw"]
    table = Table("figure", "farm", "raw sqlite3", "farm / raw", "goal",
                  title=f"farm store, {s['trajectories']} trajectories")
    table.add_row(f"ingested/s, {COMPLETE_BATCH} a call", f"{st['ingest_per_s']:,.0f}",
                  f"{raw['ingest_per_s']:,.0f}", f"{st['ingest_per_s'] / raw['ingest_per_s']:.2f}",
                  f">= {GOALS['ingest_per_s']:,.0f}")
    table.add_row(f"ms a call of {COMPLETE_BATCH}, median", f"{st['complete_median_ms']:.2f}",
                  f"{raw['complete_median_ms']:.2f}", f"{st['complete_median_ms'] / raw['complete_median_ms']:.1f}",
                  "")
    table.add_row(f"read/s, pages of {PAGE}", f"{st['read_per_s']:,.0f}",
                  f"{raw['read_per_s']:,.0f}", f"{st['read_per_s'] / raw['read_per_s']:.2f}", "")
    table.add_row(f"gRPC stream/s, batches of {PAGE}", f"{s['grpc_stream_per_s']:,.0f}",
                  f"{raw['read_per_s']:,.0f}", f"{s['grpc_stream_per_s'] / raw['read_per_s']:.2f}",
                  f">= {GOALS['stream_per_s']:,.0f}")
    console.print(table)
    console.print("  farm: Store.complete (as a worker flushes), Store.trajectories in stream order, and "
                  "FarmClient.batches from a farmd --workers 0 on that store, each batch acked")
    console.print("  raw: the same rows (already packed) into an identical table, same pragmas, one "
                  f"transaction per {COMPLETE_BATCH}; read back with a paged SELECT, nothing decoded")
    console.print(f"  leasing (not in the ingest figure): {st['lease_per_s']:,.0f} jobs/s, "
                  f"{COMPLETE_BATCH} a call")

    lat = rep["latency"]
    table = Table("figure", "streamed", f"polled every {POLL_S * 1000:.0f} ms", "goal",
                  title=f"to the trainer, {lat['env']} at {lat['rate_per_s']:g} rollouts/s")
    for key, name, goal in (("stored_p50_ms", "verdict -> trainer p50 ms", f"< {GOALS['latency_p50_ms']:g}"),
                            ("stored_p99_ms", "verdict -> trainer p99 ms", ""),
                            ("bound_p50_ms", "upper bound p50 ms", ""),
                            ("bound_p99_ms", "upper bound p99 ms", "")):
        table.add_row(name, f"{lat['streamed'][key]:.1f}", f"{lat['polled'][key]:.1f}", goal)
    table.add_row("samples", str(lat["streamed"]["samples"]), str(lat["polled"]["samples"]), "")
    console.print(table)
    console.print("  verdict -> trainer: receipt minus the trajectory's finished_at (wall clock, stamped when the "
                  f"verdict is in): the worker's batched flush (every {lat['flush_every_ms']:.0f} ms), the commit "
                  "and the stream")
    console.print("  upper bound: receipt minus the Run reply minus the rollout's own time (its timings.total); "
                  "it adds the wait for a lease")
    verdicts(console, rep["met"], LIMITS)


LIMITS = [
    "rollouts: the box (bwrap, the judge's Python) on 2 cores; farmd's queue, store and stream add little "
    "beside it (farmd / boxed)",
    "ingest: a few statements per batch, each a round trip to aiosqlite's thread, and three indexes on "
    "jobs updated per state change; the raw figure is one executemany into a table nobody queries",
    "read and stream: Store.trajectories builds a record per row; summary-only streams skip the "
    "compressed body, exports and whole-record streams inflate it",
    "this VM is noisy: rerun and compare ratios, not absolute figures",
]
