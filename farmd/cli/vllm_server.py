"""A vLLM OpenAI-compatible server on this machine, for ``make run ENGINE=vllm``, the benchmark and the tests.

vLLM runs from its own venv (``make vllm-setup``: ``.venv-vllm``, a link to its CPU build, which the checkouts on a
machine share), as ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` looks for a distribution named
"vllm" that the CPU wheel does not have), with ``VLLM_SERVER_DEV_MODE=1`` so farmd can reload weights and set and
read the weight label (``farmd.agents.weights``). The model is the loop's, built here (``farm_trainer.hf.build_model``: nothing
is downloaded). The server is its own process group, stopped with SIGTERM (its engine and worker processes go
with it), SIGKILL after a grace.

The settings that matter on two cores: ``--enforce-eager`` (no compile: ready in 20-40 s, not 77), float32
(what the trainer computes its logprobs in, so the ratio of the two starts at 1), a small KV cache
(``--kv-cache-memory-bytes`` 64 MiB: a prompt and answer are a few dozen tokens), and ``--max-num-seqs``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx

from farmd.errors import VllmFailed
from farmd.private import FILE_MODE

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"



def vllm_python() -> Path | None:
    """The vLLM venv's interpreter (``FARM_VLLM_PYTHON`` names another), or None when it is not built."""
    named = os.environ.get("FARM_VLLM_PYTHON")
    path = Path(named) if named else VLLM_PYTHON
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """One server of ``model_dir``, serving it under each of ``names`` (the first is the policy's)."""

    def __init__(self, model_dir: Path, names: tuple[str, ...], log_path: Path, *, port: int = 0,
                 max_num_seqs: int = 32, wait: bool = True, start_timeout_s: float = 240.0,
                 extra: tuple[str, ...] = ()) -> None:
        python = vllm_python()
        if python is None:
            raise VllmFailed(f"no vLLM venv at {VLLM_PYTHON}: run `make vllm-setup`")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.root = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        self._log: IO[bytes] = os.fdopen(fd, "ab")
        # vLLM names its engine's ZeroMQ sockets and its rendezvous files in the temporary directory and leaves
        # them there when its processes are killed: a directory of the server's own, removed when it stops.
        self.scratch = Path(tempfile.mkdtemp(prefix="farm-vllm-"))
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "TMPDIR": str(self.scratch), "VLLM_RPC_BASE_PATH": str(self.scratch)}
        try:
            self.proc = subprocess.Popen(
                [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                 "--served-model-name", *names, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                 "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20),
                 "--max-num-seqs", str(max_num_seqs), "--disable-uvicorn-access-log", "--generation-config", "vllm",
                 *extra],
                stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except BaseException:
            self._log.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        if wait:
            self.wait_ready(start_timeout_s)

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VllmFailed(f"vLLM exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.root + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VllmFailed(f"vLLM was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """``sig`` to the server's whole process group (its engine and workers)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a stopped server takes no SIGTERM
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)
        # Its engine and worker processes are in its group: none is left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ensure_model(directory: Path) -> Path:
    """The loop's model in ``directory``, built once (``farm_trainer.hf.build_model``) and kept."""
    if not (directory / "config.json").exists():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from farm_trainer.hf import build_model

        build_model(directory)
    return directory
