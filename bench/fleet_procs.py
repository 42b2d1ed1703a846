"""The processes ``bench.fleet_bench`` starts: worker nodes (``farmd serve --join``) and a simulated model
server, each stopped on the way out; and CPU readings of processes and of the machine.

Both the coordinator (``farmd serve --workers 0``) and the nodes are ``farmd.cli.local_farmd.LocalFarmd``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from farmd.cli.local_farmd import LocalFarmd


def farmd_env() -> dict[str, str]:
    """This environment less any farm token: the bench's coordinator asks for none, its nodes send none."""
    return {k: v for k, v in os.environ.items() if k not in ("FARM_TOKEN", "FARM_TOKEN_FILE")}


class Node(LocalFarmd):
    """``farmd serve --join ADDR --node-name NAME --workers N`` with its own data dir and log, and its CPU."""

    def __init__(self, data_dir: Path, join: str, name: str, *, workers: int = 1, config: Path | None = None) -> None:
        self.name = name
        flags = ["--node-name", name, "--workers", str(workers), *(["--config", str(config)] if config else [])]
        super().__init__(data_dir, *flags, log_path=data_dir.parent / f"{data_dir.name}.log", env=farmd_env(),
                         join=join, wait=False)
        self.process = psutil.Process(self.proc.pid)

    def cpu_s(self) -> float:
        """User + system seconds of the node and of its children it has reaped (its boxes)."""
        t = self.process.cpu_times()
        return process_cpu_s(self.process) + float(t.children_user + t.children_system)


@contextlib.contextmanager
def nodes(root: Path, join: str, names: list[str], *, workers: int = 1, config: Path | None = None,
          timeout_s: float = 60.0) -> Iterator[list[Node]]:
    """Nodes started together, each joined before this yields; every one stopped on the way out."""
    started: list[Node] = []
    try:
        for name in names:
            started.append(Node(root / name, join, name, workers=workers, config=config))
        for node in started:
            node.wait_started(timeout_s)
        yield started
    finally:
        for node in started:  # all told at once, so they stop together
            if node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.proc.send_signal(signal.SIGTERM)
        for node in started:
            node.stop()


def process_cpu_s(process: psutil.Process) -> float:
    """User + system seconds of ``process``, all its threads (ended ones too), children left out.

    Read from the kernel's CPU clock of the process (nanoseconds; ``clock_getcpuclockid``'s clock id,
    which Python does not wrap); psutil's figure (whole clock ticks, 10 ms) where that clock cannot be read.
    """
    try:
        return time.clock_gettime(((~process.pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        t = process.cpu_times()
        return float(t.user + t.system)


def machine_busy_s() -> float:
    """CPU seconds this machine has spent on anything but idling, over all cores, since boot."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
                 - getattr(t, "guest_nice", 0.0))


# -- a simulated model ---------------------------------------------------------------------------------

_CHAIN = re.compile(r"^\s*(\d+(?:[+-]\d+)*)=\s*$", re.ASCII)


def chain_value(expression: str) -> int | None:
    """The value of an ``arith`` chain (``4-1+5``), left to right; None for anything else."""
    found = _CHAIN.match(expression)
    if not found:
        return None
    tokens = re.findall(r"[+-]|\d+", found.group(1))
    total = int(tokens[0])
    for op, term in zip(tokens[1::2], tokens[2::2], strict=True):
        total = total + int(term) if op == "+" else total - int(term)
    return total


class SimModel:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that waits ``latency_s`` before each reply (a model
    server elsewhere generating), then answers an ``arith`` prompt right (the first line of the last user
    message, ``4-1+5=``). One thread per connection: replies wait in parallel, using no CPU while they wait."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.requests = 0
        self._lock = threading.Lock()
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the agents' client reuses its connections
            disable_nagle_algorithm = True  # the head and the body go in two writes: no 40 ms delayed-ACK wait

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    reply = sim.reply(json.loads(body)) if self.path.endswith("/chat/completions") else None
                except ValueError:
                    reply = None
                data = json.dumps(reply or {"error": {"message": f"no route {self.path}"}}).encode()
                self.send_response(200 if reply else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="sim-model", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def reply(self, request: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.latency_s)
        with self._lock:
            self.requests += 1
        users = [m.get("content") or "" for m in request.get("messages", []) if m.get("role") == "user"]
        value = chain_value(users[-1].splitlines()[0]) if users and users[-1] else None
        text = "0" if value is None else str(value)
        return {"id": f"sim-{self.requests}", "object": "chat.completion", "model": request.get("model", "sim"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}

    def __enter__(self) -> SimModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
