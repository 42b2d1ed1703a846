"""What ``farmctl redteam`` checks on the host, outside every box: a breach the verdicts alone would miss.

Every leftover an escape tries to leave (a file, a process, a mount point, a cgroup) carries the run's
nonce in its name (``escapes.leftover_name``), so after the run it is looked for by that name: in the
filesystem's writable places, in every process's command line, in the mount tables and under the cgroup
hierarchy. A TCP canary listens on the host's every address during the run: a box that reached it reached
the host's network. And every stored red-team trajectory is read for the farm's secrets (the verifier
key, in every form a program could print it, and the tokens this command knows).
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

WRITABLE_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home", "/srv", "/opt", "/")
"""Where a file left by an escape would land; searched a few levels deep (``/`` itself one level)."""
_MAX_ENTRIES = 200_000
"""A bound on the walk: a host with millions of files is searched this far and says so."""
_CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Breach:
    what: str
    """``file``, ``process``, ``mount``, ``cgroup``, ``connection`` or ``secret``."""
    evidence: str


class Canary:
    """A TCP listener on every address of the host, counting who connects (from a box: a breach)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self.peers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="redteam-canary", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.peers.append(f"{peer[0]}:{peer[1]}")
            conn.close()

    def close(self) -> list[Breach]:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()
        return [Breach("connection", f"a connection reached the host's canary port {self.port} from {peer}")
                for peer in self.peers]


def leftovers(nonce: str, extra_roots: Sequence[Path] = ()) -> list[Breach]:
    """Every file, process, mount and cgroup on this host that carries ``nonce`` in its name."""
    found = [Breach("file", str(p)) for p in _files(nonce, [*map(Path, WRITABLE_ROOTS), *extra_roots])]
    found += [Breach("process", f"pid {pid}: {cmd}") for pid, cmd in _processes(nonce)]
    found += [Breach("mount", line) for line in _mounts(nonce)]
    found += [Breach("cgroup", str(p)) for p in _files(nonce, [Path(_CGROUP_ROOT)], depth=8, dirs_only=True)]
    return found


def _files(nonce: str, roots: Iterable[Path], depth: int = 4, dirs_only: bool = False) -> Iterator[Path]:
    seen = 0
    for root in roots:
        limit = 1 if str(root) == "/" else depth
        stack = [(root, 0)]
        while stack and seen < _MAX_ENTRIES:
            path, level = stack.pop()
            try:
                with os.scandir(path) as entries:
                    for entry in entries:
                        seen += 1
                        is_dir = entry.is_dir(follow_symlinks=False)
                        if nonce in entry.name and (is_dir or not dirs_only):
                            yield Path(entry.path)
                        if is_dir and level + 1 < limit and not entry.path.startswith(("/proc", "/sys")):
                            stack.append((Path(entry.path), level + 1))
            except OSError:
                continue


def _processes(nonce: str) -> Iterator[tuple[int, str]]:
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        if nonce.encode() in raw:
            yield int(entry.name), raw.replace(b"\0", b" ").decode("utf-8", "replace")[:200]


def _mounts(nonce: str) -> list[str]:
    lines: list[str] = []
    for table in ("/proc/self/mountinfo", "/proc/1/mountinfo"):
        try:
            lines += [line for line in Path(table).read_text().splitlines() if nonce in line]
        except OSError:
            continue
    return sorted(set(lines))


def secret_forms(secrets: Mapping[str, bytes]) -> dict[str, str]:
    """Each secret as a program would print it: raw (when it is text), hex, and base64 (both alphabets)."""
    forms: dict[str, str] = {}
    for name, value in secrets.items():
        if len(value) < 8:
            continue
        with contextlib.suppress(UnicodeDecodeError):
            forms[f"{name} (text)"] = value.decode("ascii")
        forms[f"{name} (hex)"] = value.hex()
        forms[f"{name} (base64)"] = base64.b64encode(value).decode().rstrip("=")
        forms[f"{name} (urlsafe base64)"] = base64.urlsafe_b64encode(value).decode().rstrip("=")
    return forms


def secrets_in(records: Iterable[tuple[str, str]], secrets: Mapping[str, bytes]) -> list[Breach]:
    """(where, text) records that hold any form of any secret."""
    forms = secret_forms(secrets)
    return [Breach("secret", f"{name} is in {where}") for where, text in records
            for name, form in forms.items() if form in text]
