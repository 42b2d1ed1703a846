"""A real PostgreSQL server for the tests: ``initdb`` in a temporary directory, started on a free port, stopped
and removed after. As root, the server runs as ``nobody`` (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

USER = "farm"
"""The server's superuser, trusted on its loopback port and socket: a test server, reached only from here."""


def bindir() -> Path:
    """Where Debian's (or any) PostgreSQL binaries are; ``make postgresql`` installs them."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("no PostgreSQL here: make postgresql (apt-get install postgresql)")
    return Path(initdb).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``start()``, then ``new_database()`` for each test's own database; ``stop()`` removes everything."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="farm-pg-"))
        self.port = 0
        self._names = itertools.count(1)
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "nobody"
            entry = pwd.getpwnam("nobody")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def _run(self, *cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, user=self._user, timeout=60, cwd=self.dir)

    def start(self) -> PostgresServer:
        data = self.dir / "data"
        self._log = open(self.dir / "log", "ab")  # noqa: SIM115 (closed in stop)
        self._run(str(bindir() / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--locale=C")
        for _ in range(5):  # another process may take the free port between its choice and the server's bind
            self.port = _free_port()
            self._proc = subprocess.Popen(
                [str(bindir() / "postgres"), "-D", str(data), "-p", str(self.port), "-h", "127.0.0.1",
                 "-k", str(self.dir), "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=200"],
                user=self._user, stdout=subprocess.DEVNULL, stderr=self._log, cwd=self.dir)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self._proc.poll() is None:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                    if self._ready():
                        return self
                time.sleep(0.05)
            self._proc.kill()
            self._proc.wait()
        raise RuntimeError(f"PostgreSQL did not start: {(self.dir / 'log').read_text()[-2000:]}")

    def _ready(self) -> bool:
        return subprocess.run([str(bindir() / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER],
                              capture_output=True, timeout=10).returncode == 0

    @property
    def pid(self) -> int | None:
        """The postmaster's (its backends are its children); None before ``start``."""
        return self._proc.pid if self._proc is not None else None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new, empty database's URL."""
        name = f"t{os.getpid()}_{next(self._names)}"
        subprocess.run([str(bindir() / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER,
                        "-T", "template0", name], check=True, capture_output=True, timeout=60)
        return self.url(name)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # fast shutdown: SIGTERM's smart one waits for every client
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
