"""A fleet on one machine: a coordinator (``running_farm``) and worker nodes (``farmd serve --join``),
real processes with their own data dirs, every one stopped after the test."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FARMD, RunningFarm


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a coordinator that must come back on the same address after a restart."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RunningNode(RunningFarm):
    """``farmd serve --join ADDR`` with its own data dir; ``wrap`` runs it elsewhere (another netns). It is
    stopped as a farm is (``RunningFarm.stop``); it has no address of its own."""

    def __init__(self, data_dir: Path, join: str, name: str, *extra: str, workers: int = 1,
                 wrap: Callable[[list[str]], list[str]] | None = None, env: dict[str, str] | None = None,
                 wait: bool = True) -> None:
        # Not RunningFarm's start: a node has no --listen, and being welcomed is what it waits for.
        self.data_dir = data_dir
        self.name = name
        self.log = data_dir.parent / f"{data_dir.name}.log"
        self._log_fh = open(self.log, "ab")  # noqa: SIM115 (closed in stop)
        argv = [FARMD, "serve", "--join", join, "--node-name", name, "--data", str(data_dir),
                "--workers", str(workers), *extra]
        self.proc = subprocess.Popen(wrap(argv) if wrap else argv, stdout=self._log_fh, stderr=subprocess.STDOUT,
                                     env=env)
        if wait:
            self.wait_joined()

    def wait_joined(self, timeout_s: float = 60) -> None:
        runfile = self.data_dir / "farmd.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"node {self.name} exited {self.proc.returncode}: {self.text()[-3000:]}")
            try:
                if json.loads(runfile.read_text())["pid"] == self.proc.pid:
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"node {self.name} did not join within {timeout_s}s: {self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, words: str, timeout_s: float = 60) -> None:
        """Until the node's log says ``words`` while it runs (a loaded machine starts it slowly: no fixed sleep)."""
        deadline = time.monotonic() + timeout_s
        while words not in self.text():
            if self.proc.poll() is not None:
                raise AssertionError(f"node {self.name} exited {self.proc.returncode}: {self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"node {self.name} never said {words!r}: {self.text()[-3000:]}")
            time.sleep(0.1)

    def exited(self, timeout_s: float = 30) -> int:
        """Wait for the node to exit by itself (refused); its exit code."""
        try:
            return self.proc.wait(timeout_s)
        finally:
            self._log_fh.close()


@pytest.fixture
def worker_node(tmp_path: Path) -> Iterator[Callable[..., RunningNode]]:
    """``worker_node(join_addr, name, *flags, workers=1, wrap=None)``: a joined node, stopped afterwards."""
    nodes: list[RunningNode] = []

    def start(join: str, name: str, *extra: str, **kwargs: Any) -> RunningNode:
        node = RunningNode(tmp_path / f"node-{name}-{len(nodes)}", join, name, *extra, **kwargs)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop(sig=9) if node.proc.poll() is None and _stopped(node.proc.pid) else node.stop()


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP): a stopped process never handles SIGTERM."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False
