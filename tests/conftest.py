"""Shared test helpers: run farmctl for real, start a real farmd on port 0, find isolation gaps."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BIN = Path(sys.executable).parent
FARMCTL = str(BIN / "farmctl")
FARMD = str(BIN / "farmd")


@functools.cache
def isolation_gaps() -> tuple[str, ...]:
    from farmd.sandbox import check_host
    from farmd.sandbox.host import missing

    return tuple(missing(check_host()))


@pytest.fixture(autouse=True)
def _require_isolation(request: pytest.FixtureRequest) -> None:
    """Tests marked ``sandbox`` fail (not skip) when the host cannot isolate: a skipped escape test proves nothing."""
    if request.node.get_closest_marker("sandbox") and isolation_gaps():
        pytest.fail("this host cannot isolate a box, so the sandbox tests cannot run:\n" + "\n".join(isolation_gaps()))


FULL_SWEEP = bool(os.environ.get("FARM_FULL_SWEEP"))
"""``make test-sweeps``: reference sweeps over every seed they name; ``make test`` takes an eighth of them, to
keep the suite inside its ten minutes on two cores (a sweep is a recall check, not a behaviour: every level
of every environment is still checked, over fewer seeds)."""


def sweep_seeds(full: int) -> range:
    """Seeds 0..``full``-1 under ``FARM_FULL_SWEEP``; the first eighth otherwise."""
    return range(full if FULL_SWEEP else max(1, full // 8))


def farmctl(*args: str, timeout: float = 120, check: bool = True, env: dict[str, str] | None = None,
            input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run the installed farmctl with ``args``; fail the test on a non-zero exit when ``check``."""
    proc = subprocess.run([FARMCTL, *args], capture_output=True, timeout=timeout, env=env, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"farmctl {' '.join(args)[:200]} exited {proc.returncode}\nstdout: {proc.stdout[-2000:]!r}\n"
            f"stderr: {proc.stderr[-4000:]!r}"
        )
    return proc


def box(*cmd: str, files: Path | None = None, out: Path | None = None, timeout: float = 120,
        **bounds: Any) -> dict[str, Any]:
    """``farmctl sandbox run [--bound value ...] [--files D] [--out D] -- cmd``, parsed.

    Bounds are given as Python names: ``wall_time=2`` becomes ``--wall-time 2``.
    """
    args = ["sandbox", "run"]
    for name, value in bounds.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    if files is not None:
        args += ["--files", str(files)]
    if out is not None:
        args += ["--out", str(out)]
    proc = farmctl(*args, "--", *cmd, timeout=timeout)
    return json.loads(proc.stdout)


def py(code: str, **kwargs: Any) -> dict[str, Any]:
    """Run Python ``code`` in a box (``python3 -c code``)."""
    return box("python3", "-c", code, **kwargs)


def box_processes() -> list[int]:
    """Host pids of every process running as a slot uid (a box's), for leftover checks."""
    from farmd.sandbox.config import DEFAULT_UID_BASE, DEFAULT_UID_COUNT

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
        except FileNotFoundError:
            continue
        if DEFAULT_UID_BASE <= uid < DEFAULT_UID_BASE + DEFAULT_UID_COUNT:
            found.append(int(entry))
    return found


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (a unique string a test put in a box's argv)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


class RunningFarm:
    """A real ``farmd serve`` on port 0 with its own data directory."""

    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None,
                 listen: str = "127.0.0.1:0") -> None:
        self.data_dir = data_dir
        self.log = data_dir.parent / f"{data_dir.name}.log"
        self._log_fh = open(self.log, "ab")  # noqa: SIM115 (closed in stop); a restarted farm appends
        self.proc = subprocess.Popen(
            [FARMD, "serve", "--listen", listen, "--data", str(data_dir), *extra],
            stdout=self._log_fh, stderr=subprocess.STDOUT, env=env,
        )
        try:
            self.addr = self._wait_for_addr()
        except BaseException:  # pytest's timeout too: the caller never holds this farm, so nobody else stops it
            self.stop(sig=9)
            raise

    def _wait_for_addr(self, timeout_s: float = 60) -> str:
        import time

        runfile = self.data_dir / "farmd.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log_fh.close()
                raise AssertionError(f"farmd exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                info = json.loads(runfile.read_text())
                if info["pid"] == self.proc.pid:
                    return str(info["addr"])
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"farmd did not start within {timeout_s}s: {self.log.read_text()[-3000:]}")

    def farmctl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return farmctl("--addr", self.addr, *args, **kwargs)

    def stop(self, sig: int = 15, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_fh.close()
        return self.proc.returncode


@pytest.fixture
def running_farm(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start farmd on port 0 (``running_farm(*flags)``); every farm started is stopped afterwards."""
    farms: list[RunningFarm] = []

    def start(*extra: str, env: dict[str, str] | None = None, data_dir: Path | None = None,
              listen: str = "127.0.0.1:0") -> RunningFarm:
        """A new farm, or with ``data_dir`` (and ``listen``) one restarted on an earlier farm's data."""
        farm = RunningFarm(data_dir or tmp_path / f"farm{len(farms)}", *extra, env=env, listen=listen)
        farms.append(farm)
        return farm

    yield start
    for farm in farms:
        farm.stop()


@pytest.fixture(scope="session")
def postgres() -> Any:
    """A real PostgreSQL server for this test session (one per xdist worker), stopped and removed after."""
    from tests.pg import PostgresServer

    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test against each backend: on ``postgresql`` every ``Store.open(path)`` it makes opens a database of
    that session's server instead, one per path (the same path again is the same database: a restart), the
    data directory still ``path``'s. A test marked ``sqlite_only`` reads the SQLite file itself."""
    if request.param == "postgresql":
        if request.node.get_closest_marker("sqlite_only"):
            pytest.skip("reads or writes the SQLite file itself")
        from farmd.store.store import Store

        server = request.getfixturevalue("postgres")
        databases: dict[str, str] = {}
        opener = Store.open.__func__  # type: ignore[attr-defined]

        async def open_on_server(cls: type[Store], path: Path, url: str | None = None) -> Store:
            if url is None:
                key = os.fspath(path)
                if key not in databases:
                    databases[key] = server.new_database()
                url = databases[key]
            return await opener(cls, path, url)

        monkeypatch.setattr(Store, "open", classmethod(open_on_server))
    return str(request.param)
