"""farmd's SandboxFusion API beside a plain subprocess running the same program, in one run.

Two programs, as a code reward runs them: Python's ``print(1)`` and bash's ``echo 1``. Each is run through
``farmd serve --sandbox-fusion`` with the ``sandbox-fusion`` client's own ``run_code`` (a fresh farm box a call:
no network, farm's bounds, a scratch directory) and, alternately, as a plain ``subprocess.run`` of the same
interpreter on the host (no isolation at all, SandboxFusion's default "none"). Figures: median and p90 latency
of one call at a time, the added latency (farmd's median minus the subprocess's), and calls a second with as many
callers as farmd runs boxes at once. Goal: added latency at most 20 ms median.

SandboxFusion publishes no per-call overhead figure (its repository's README and docs give none); its docs say
the service "is for offline scenarios, where throughput is more important than latency"
(docs/docs/docs/how-to/run-code/jupyter-mode.mdx, bytedance/SandboxFusion). That is what is printed beside.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.common import free_port, verdicts
from farmd.api.sandbox_fusion import MAX_RUNNING
from farmd.cli.local_farmd import FARMD
from farmd.sandbox.config import SandboxConfig

GOAL_ADDED_MS = 20.0
PUBLISHED = ("SandboxFusion publishes no per-call overhead figure; its docs: \"for offline scenarios, where "
             "throughput is more important than latency\" (bytedance/SandboxFusion, "
             "docs/docs/docs/how-to/run-code/jupyter-mode.mdx)")
PROGRAMS = {"python": ("print(1)", [str(SandboxConfig().box_python), "-c", "print(1)"]),
            "bash": ("echo 1", ["bash", "-c", "echo 1"])}


@contextlib.contextmanager
def _farmd(data: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = subprocess.Popen([FARMD, "serve", "--listen", "127.0.0.1:0", "--workers", "0", "--data", str(data),
                             "--sandbox-fusion", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if json.loads((data / "farmd.json").read_text())["sandbox_fusion"]:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("farmd --sandbox-fusion did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def _call(endpoint: str, language: str) -> Callable[[], None]:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    request = RunCodeRequest(code=PROGRAMS[language][0], language=language)

    def call() -> None:
        resp = run_code(request, endpoint=endpoint, max_attempts=1)
        assert resp.status == RunStatus.Success and resp.run_result and resp.run_result.stdout == "1\n", resp
    return call


def _plain(language: str) -> Callable[[], None]:
    argv = PROGRAMS[language][1]

    def call() -> None:
        done = subprocess.run(argv, capture_output=True, check=True)
        assert done.stdout == b"1\n"
    return call


def _timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _throughput(fn: Callable[[], None], calls: int, callers: int) -> float:
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(callers) as pool:
        for f in [pool.submit(fn) for _ in range(calls)]:
            f.result()
    return calls / (time.perf_counter() - started)


def _cpu(proc: psutil.Process) -> float:
    """CPU seconds of farmd and of what it reaped: its boxes (bwrap waits for the box's processes)."""
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


async def _box_alone(n: int) -> dict[str, float]:
    """The same programs in farm boxes with no HTTP in between (``Sandbox.run`` in this process, under the API's
    supervisor, warm boxes as farmd keeps them): what of the added latency is the box, and what the API."""
    from farmd.api.sandbox_fusion import _PROGRAM, _SUPERVISOR, WARM_BOXES
    from farmd.sandbox import Sandbox
    from farmd.sandbox.policy import DEFAULT_POLICY

    out = {}
    async with Sandbox(SandboxConfig(warm_boxes=WARM_BOXES, max_boxes=MAX_RUNNING + WARM_BOXES)) as sandbox:
        for language, (code, _) in PROGRAMS.items():
            name = _PROGRAM[language][0]
            argv = ["python3", "-c", _SUPERVISOR, language, name, ""]  # as farmd runs a call's code
            times = []
            for i in range(n + 5):
                started = time.perf_counter()
                result = await sandbox.run(argv, DEFAULT_POLICY, files={name: code.encode()})
                if i >= 5:
                    times.append(time.perf_counter() - started)
                assert result.stdout == b"1\n", result
                await asyncio.sleep(0.05)
            out[language] = 1000 * statistics.median(times)
    return out


def measure(n: int, calls: int, progress: Progress) -> dict[str, Any]:
    task = progress.add_task("sandbox-fusion: /run_code beside subprocess", total=len(PROGRAMS) * (n + 2))
    out: dict[str, Any] = {"n": n, "calls": calls, "callers": MAX_RUNNING, "published": PUBLISHED,
                           "goal_added_ms": GOAL_ADDED_MS}
    with tempfile.TemporaryDirectory() as tmp, _farmd(Path(tmp) / "farm") as (endpoint, pid):
        farmd = psutil.Process(pid)
        for language in PROGRAMS:
            farm, plain = _call(endpoint, language), _plain(language)
            for _ in range(5):  # warm: the box pool filled, the interpreter's files in the page cache
                farm()
                plain()
            farm_s, plain_s = [], []
            farm_cpu = plain_cpu = 0.0
            for _ in range(n):  # alternately, so both see the same machine
                before, client = _cpu(farmd), time.thread_time()
                farm_s.append(_timed(farm))
                farm_cpu += _cpu(farmd) - before + time.thread_time() - client
                before = _children_cpu()
                plain_s.append(_timed(plain))
                plain_cpu += _children_cpu() - before
                time.sleep(0.05)  # one call at a time, as a sequential caller makes them: the warm box is back
                progress.advance(task)
            farm_rate = _throughput(farm, calls, MAX_RUNNING)
            progress.advance(task)
            plain_rate = _throughput(plain, calls, MAX_RUNNING)
            progress.advance(task)
            fm, pm = 1000 * statistics.median(farm_s), 1000 * statistics.median(plain_s)
            out[language] = {"farmd_median_ms": fm, "farmd_p90_ms": 1000 * _p90(farm_s),
                             "subprocess_median_ms": pm, "subprocess_p90_ms": 1000 * _p90(plain_s),
                             "added_median_ms": fm - pm, "ratio": fm / pm,
                             "farmd_cpu_ms": 1000 * farm_cpu / n, "subprocess_cpu_ms": 1000 * plain_cpu / n,
                             "farmd_calls_per_s": farm_rate, "subprocess_calls_per_s": plain_rate}
    box = asyncio.run(_box_alone(n))
    out["load_average"] = os.getloadavg()[0]
    out["cores"] = os.cpu_count()
    for language in PROGRAMS:
        out[language]["box_alone_median_ms"] = box[language]
    return out


def render(rep: dict[str, Any], console: Console) -> None:
    table = Table("program", "farmd /run_code", "plain subprocess", "farmd / subprocess", "added",
                  title=f"SandboxFusion API: one call at a time ({rep['n']} each, alternating), and {rep['calls']} "
                        f"calls from {rep['callers']} callers")
    for language in PROGRAMS:
        f = rep[language]
        table.add_row(f"{language} median ms", f"{f['farmd_median_ms']:.1f}", f"{f['subprocess_median_ms']:.1f}",
                      f"{f['ratio']:.2f}", f"{f['added_median_ms']:+.1f} ms")
        table.add_row(f"{language} p90 ms", f"{f['farmd_p90_ms']:.1f}", f"{f['subprocess_p90_ms']:.1f}",
                      f"{f['farmd_p90_ms'] / f['subprocess_p90_ms']:.2f}", "")
        table.add_row(f"{language} CPU ms a call", f"{f['farmd_cpu_ms']:.1f}", f"{f['subprocess_cpu_ms']:.1f}",
                      f"{f['farmd_cpu_ms'] / f['subprocess_cpu_ms']:.2f}", f"{f['farmd_cpu_ms'] - f['subprocess_cpu_ms']:+.1f} ms")
        table.add_row(f"{language} calls/s", f"{f['farmd_calls_per_s']:.1f}", f"{f['subprocess_calls_per_s']:.1f}",
                      f"{f['farmd_calls_per_s'] / f['subprocess_calls_per_s']:.2f}", "")
    console.print(table)
    for language in PROGRAMS:
        f = rep[language]
        console.print(f"  {language}, where the added {f['added_median_ms']:.1f} ms go: the box "
                      f"{f['box_alone_median_ms'] - f['subprocess_median_ms']:+.1f} ms (Sandbox.run alone, "
                      f"{f['box_alone_median_ms']:.1f} ms median), the API and its client "
                      f"{f['farmd_median_ms'] - f['box_alone_median_ms']:+.1f} ms (HTTP, JSON, the client's pydantic)")
    console.print(f"  beside: {rep['published']}")
    console.print(f"  measured at a load average of {rep['load_average']:.1f} on {rep['cores']} cores: every figure "
                  "here is a latency of several processes, and a box's (bwrap, its init, the program) wait longer "
                  "for a core than one subprocess does; CPU a call (farmd, its box and the client's thread, "
                  "against the subprocess) depends on the load far less")
    worst = max(rep[language]["added_median_ms"] for language in PROGRAMS)
    verdicts(console, {"added latency of a /run_code call": worst <= rep["goal_added_ms"]}, [
        "farmd: the client's HTTP call (a new connection each, pydantic on both ends of the client), the body "
        "parsed off the event loop, the call's files copied into a warm box (launched ahead, off the call's "
        "path), its cgroup bounds set, the program released and watched, the reply written off the loop",
        "subprocess: fork and exec of the interpreter on the host, nothing else; its start-up dominates both",
    ], goals={"added latency of a /run_code call": f"at most {rep['goal_added_ms']:g} ms median; measured "
                                                  f"{worst:+.1f} ms"})
