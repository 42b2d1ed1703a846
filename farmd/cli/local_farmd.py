"""A ``farmd serve`` child process on this machine: started on port 0 (or joined to a coordinator,
``join``), found through its run file, stopped with SIGTERM. For ``make run`` and the benchmarks (the
tests keep their own, with pytest's reporting)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from farmd.errors import FarmdFailed
from farmd.private import FILE_MODE, make_dir

FARMD = str(Path(sys.executable).parent / "farmd")


class LocalFarmd:
    """``join``: a worker node for the coordinator at that address (``--join``), not a farm on ``listen``; its
    ``addr`` stays empty. ``wait`` False: return at once, and ``wait_started`` later (nodes started together).
    ``listen``: port 0 unless a farm must come back where its clients were pointed (a restart in place)."""

    def __init__(self, data_dir: Path, *flags: str, log_path: Path | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 120.0, join: str | None = None,
                 wait: bool = True, listen: str = "127.0.0.1:0") -> None:
        self.data_dir = data_dir
        self.log_path = log_path or data_dir / "farmd.log"
        make_dir(data_dir)  # farmd's alone, the log too
        self._runfile = data_dir / "farmd.json"
        self._runfile.unlink(missing_ok=True)
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        self._log: IO[bytes] = os.fdopen(log_fd, "ab")  # closed in stop
        self._joined = join is not None
        where = ["--join", join] if join else ["--listen", listen]
        self.proc = subprocess.Popen([FARMD, "serve", *where, "--data", str(data_dir), *flags],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.addr = ""
        self.console = ""
        """Where its web console is (``--http``), once started; empty when it serves none."""
        if wait:
            self.wait_started(start_timeout_s)

    def wait_started(self, timeout_s: float = 120.0) -> None:
        """Until farmd wrote its run file (listening, or welcomed by its coordinator); ``FarmdFailed`` if it
        exits or takes longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise FarmdFailed(f"farmd exited {self.proc.returncode}:\n{self.log_tail()}")
            if self.serving():
                return
            time.sleep(0.02)
        self.stop()
        raise FarmdFailed(f"farmd did not start within {timeout_s:g}s:\n{self.log_tail()}")

    def serving(self) -> bool:
        """Whether its run file is written (listening, or welcomed by its coordinator), at once; its ``addr`` and
        ``console`` are set when it is. A standby coordinator writes it only once it takes over."""
        try:
            info = json.loads(self._runfile.read_text())
            if info.get("pid") != self.proc.pid:
                return False
            self.addr = "" if self._joined else str(info["addr"])
            self.console = str(info.get("console") or "")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return True

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (a graceful stop), then SIGKILL if it does not end within ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> LocalFarmd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
