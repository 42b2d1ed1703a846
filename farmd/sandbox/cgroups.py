"""One cgroup per box, on cgroup v1 or v2, whichever the host has.

The cgroup is what bounds a box as a whole when farmd runs as root: memory
(tmpfs pages included), processes and threads (RLIMIT_NPROC does not bind root),
CPU bandwidth, and the CPU-time and memory figures of a result (wait4's rusage
cannot see processes that bwrap's init reaps). Writing files under /sys/fs/cgroup
is a few microseconds each, so these calls are made directly from the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from farmd.errors import CgroupUnavailable
from farmd.sandbox.owners import owner_alive

_PARENT_NAME = "farm.boxes"
_V1_REQUIRED = ("memory", "pids", "cpuacct")
_V1_OPTIONAL = ("cpu",)
_V2_REQUIRED = ("memory", "pids", "cpu")
_CFS_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class _Mount:
    path: Path
    fstype: str  # "cgroup" or "cgroup2"
    controllers: frozenset[str]


def _mounts() -> list[_Mount]:
    found: list[_Mount] = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields = left.split()
            rfields = right.split()
            if len(fields) < 5 or len(rfields) < 3:
                continue
            fstype = rfields[0]
            if fstype not in ("cgroup", "cgroup2"):
                continue
            opts = set(rfields[2].split(","))
            found.append(_Mount(Path(fields[4]), fstype, frozenset(opts)))
    return found


def _own_paths() -> dict[str, str]:
    """Controller name (or "" for v2) -> this process's cgroup path in that hierarchy."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if ctrls == "":
                own[""] = path
            for c in ctrls.split(","):
                if c:
                    own[c] = path
    return own


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    with open(path) as fh:
        return fh.read()


def _read_keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = _read(path)
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _rmdir_when_empty(path: Path, procs: Path, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        for pid in _pids_in(procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def _pids_in(procs: Path) -> list[int]:
    try:
        return [int(x) for x in _read(procs).split()]
    except (OSError, ValueError):
        return []


class BoxCgroup:
    """The cgroup of one box. Created empty; the box's pid 1 joins it before anything runs."""

    def __init__(self, driver: CgroupDriver, name: str) -> None:
        self.name = name
        self._driver = driver
        self.dirs: dict[str, Path] = {}

    def add(self, pid: int) -> None:
        """Move a whole process in (the slow path: it can wait for an RCU grace period)."""
        for d in self.dirs.values():
            _write(d / "cgroup.procs", str(pid))

    @contextlib.contextmanager
    def joined_by_this_thread(self) -> Iterator[None]:
        """Put the calling thread in this cgroup for the block, so that what it forks is born inside.

        Only on cgroup v1 (``driver.thread_join``), where a thread may sit in a cgroup
        of its own and moving the calling thread skips the global threadgroup lock.
        """
        self._driver.move_this_thread(self.dirs)
        try:
            yield
        finally:
            self._driver.move_this_thread(self._driver.home_dirs())

    def set_limits(self, memory_bytes: int, pids: int, cpus: float) -> None:
        self._driver.set_limits(self, memory_bytes, pids, cpus)

    def cpu_ns(self) -> int:
        return self._driver.cpu_ns(self)

    def memory_peak_bytes(self) -> int:
        return self._driver.memory_peak_bytes(self)

    def oom_kills(self) -> int:
        return self._driver.oom_kills(self)

    def pids_max_hits(self) -> int:
        return self._driver.pids_max_hits(self)

    def pids(self) -> list[int]:
        # Every process of a box is in all its controllers' cgroups: one list is all of them.
        for d in self.dirs.values():
            return _pids_in(d / "cgroup.procs")
        return []

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup (the pid namespace's death usually did it already)."""
        self._driver.kill_all(self)

    def remove(self) -> None:
        """Kill what is left and remove the cgroup. Nothing of the box stays behind."""
        for d in self.dirs.values():
            _rmdir_when_empty(d, d / "cgroup.procs")
        self.dirs.clear()


class CgroupDriver:
    """Creates box cgroups under a parent owned by farm."""

    version: int = 0
    thread_join: bool = False
    """True when a box can be born in its cgroup by forking from a thread that joined it."""

    def move_this_thread(self, dirs: dict[str, Path]) -> None:
        raise NotImplementedError

    def home_dirs(self) -> dict[str, Path]:
        raise NotImplementedError

    def create(self, name: str) -> BoxCgroup:
        raise NotImplementedError

    def set_limits(self, cg: BoxCgroup, memory_bytes: int, pids: int, cpus: float) -> None:
        raise NotImplementedError

    def cpu_ns(self, cg: BoxCgroup) -> int:
        raise NotImplementedError

    def memory_peak_bytes(self, cg: BoxCgroup) -> int:
        raise NotImplementedError

    def oom_kills(self, cg: BoxCgroup) -> int:
        raise NotImplementedError

    def pids_max_hits(self, cg: BoxCgroup) -> int:
        raise NotImplementedError

    def kill_all(self, cg: BoxCgroup) -> None:
        for pid in cg.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def parents(self) -> list[Path]:
        raise NotImplementedError

    def sweep(self) -> int:
        """Remove box cgroups left by a farmd that died (their owner pid is gone)."""
        removed = 0
        for parent in self.parents():
            try:
                entries = list(parent.iterdir())
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir() or not entry.name.startswith("box-") or owner_alive(entry.name):
                    continue
                with contextlib.suppress(OSError):
                    _rmdir_when_empty(entry, entry / "cgroup.procs")
                    removed += 1
        return removed


class _V1(CgroupDriver):
    version = 1
    thread_join = True

    def __init__(self, parents: dict[str, Path], home: dict[str, Path]) -> None:
        self._parents = parents
        self._home = home

    def home_dirs(self) -> dict[str, Path]:
        return self._home

    def move_this_thread(self, dirs: dict[str, Path]) -> None:
        # "0" in a v1 tasks file is the calling thread, which the kernel moves without
        # taking cgroup_threadgroup_rwsem for writing (no RCU grace period to wait for).
        for d in dirs.values():
            _write(d / "tasks", "0")

    def parents(self) -> list[Path]:
        return list(self._parents.values())

    def create(self, name: str) -> BoxCgroup:
        cg = BoxCgroup(self, name)
        try:
            for ctrl, parent in self._parents.items():
                d = parent / name
                os.mkdir(d)
                cg.dirs[ctrl] = d
        except OSError:
            cg.remove()
            raise
        return cg

    def set_limits(self, cg: BoxCgroup, memory_bytes: int, pids: int, cpus: float) -> None:
        mem = cg.dirs["memory"]
        # A lower limit than current usage fails with EBUSY; memsw must never sit below it.
        memsw = mem / "memory.memsw.limit_in_bytes"
        has_memsw = memsw.exists()
        current = int(_read(mem / "memory.limit_in_bytes"))
        if has_memsw and memory_bytes > current:
            _write(memsw, str(memory_bytes))
            _write(mem / "memory.limit_in_bytes", str(memory_bytes))
        else:
            _write(mem / "memory.limit_in_bytes", str(memory_bytes))
            if has_memsw:
                _write(memsw, str(memory_bytes))
        _write(cg.dirs["pids"] / "pids.max", str(pids))
        if "cpu" in cg.dirs:
            _write(cg.dirs["cpu"] / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
            _write(cg.dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(cpus * _CFS_PERIOD_US))))

    def cpu_ns(self, cg: BoxCgroup) -> int:
        return int(_read(cg.dirs["cpuacct"] / "cpuacct.usage"))

    def memory_peak_bytes(self, cg: BoxCgroup) -> int:
        return int(_read(cg.dirs["memory"] / "memory.max_usage_in_bytes"))

    def oom_kills(self, cg: BoxCgroup) -> int:
        # The oom_kill counter exists since Linux 4.13.
        return _read_keyed(cg.dirs["memory"] / "memory.oom_control").get("oom_kill", 0)

    def pids_max_hits(self, cg: BoxCgroup) -> int:
        return _read_keyed(cg.dirs["pids"] / "pids.events").get("max", 0)


class _V2(CgroupDriver):
    version = 2

    def __init__(self, parent: Path) -> None:
        self._parent = parent

    def parents(self) -> list[Path]:
        return [self._parent]

    def create(self, name: str) -> BoxCgroup:
        cg = BoxCgroup(self, name)
        d = self._parent / name
        os.mkdir(d)
        cg.dirs[""] = d
        return cg

    def set_limits(self, cg: BoxCgroup, memory_bytes: int, pids: int, cpus: float) -> None:
        d = cg.dirs[""]
        _write(d / "memory.max", str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(pids))
        _write(d / "cpu.max", f"{max(1000, int(cpus * _CFS_PERIOD_US))} {_CFS_PERIOD_US}")

    def cpu_ns(self, cg: BoxCgroup) -> int:
        return _read_keyed(cg.dirs[""] / "cpu.stat").get("usage_usec", 0) * 1000

    def memory_peak_bytes(self, cg: BoxCgroup) -> int:
        d = cg.dirs[""]
        try:
            return int(_read(d / "memory.peak"))
        except FileNotFoundError:  # kernels before 5.19
            return int(_read(d / "memory.current"))

    def oom_kills(self, cg: BoxCgroup) -> int:
        return _read_keyed(cg.dirs[""] / "memory.events").get("oom_kill", 0)

    def pids_max_hits(self, cg: BoxCgroup) -> int:
        return _read_keyed(cg.dirs[""] / "pids.events").get("max", 0)

    def kill_all(self, cg: BoxCgroup) -> None:
        try:
            _write(cg.dirs[""] / "cgroup.kill", "1")
        except OSError:  # before 5.14
            super().kill_all(cg)


def detect() -> CgroupDriver:
    """The best driver this host supports, with its parent cgroup created. Raises CgroupUnavailable."""
    mounts = _mounts()
    own = _own_paths()
    problems: list[str] = []
    v1 = {c: m for m in mounts if m.fstype == "cgroup" for c in m.controllers
          if c in _V1_REQUIRED + _V1_OPTIONAL}
    if all(c in v1 for c in _V1_REQUIRED):
        try:
            parents = _v1_parents(v1, own)
            home = {c: v1[c].path / own.get(c, "/").lstrip("/") for c in parents}
            return _V1(parents, home)
        except OSError as exc:
            problems.append(f"cgroup v1: cannot create {_PARENT_NAME} ({exc})")
    else:
        missing = [c for c in _V1_REQUIRED if c not in v1]
        problems.append(f"cgroup v1: controllers not mounted: {', '.join(missing)}")
    for m in mounts:
        if m.fstype != "cgroup2":
            continue
        try:
            return _V2(_v2_parent(m.path, own.get("", "/")))
        except (OSError, CgroupUnavailable) as exc:
            problems.append(f"cgroup v2 at {m.path}: {exc}")
    if not any(m.fstype == "cgroup2" for m in mounts):
        problems.append("cgroup v2: not mounted")
    raise CgroupUnavailable("; ".join(problems))


def _v1_parents(v1: dict[str, _Mount], own: dict[str, str]) -> dict[str, Path]:
    parents: dict[str, Path] = {}
    for ctrl, mount in v1.items():
        parent = mount.path / own.get(ctrl, "/").lstrip("/") / _PARENT_NAME
        try:
            parent.mkdir(exist_ok=True)
        except OSError:
            if ctrl in _V1_OPTIONAL:
                continue
            raise
        parents[ctrl] = parent
    if "memory" in parents:
        # Without hierarchy, a box's charges would not count against farmd's own limit.
        with contextlib.suppress(OSError):
            _write(parents["memory"] / "memory.use_hierarchy", "1")
    return parents


def _v2_parent(mount: Path, own: str) -> Path:
    wanted = {"memory", "pids", "cpu"}
    available = set(_read(mount / "cgroup.controllers").split())
    if not wanted <= available:
        raise CgroupUnavailable(f"controllers {sorted(wanted - available)} are not available")
    # The hierarchy root is exempt from the no-internal-processes rule, so a parent
    # there works whatever cgroup farmd itself sits in; else use farmd's own cgroup.
    candidates = [mount, mount / own.lstrip("/")]
    last: Exception | None = None
    for base in candidates:
        try:
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
            parent = base / _PARENT_NAME
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
            return parent
        except OSError as exc:
            last = exc
    raise CgroupUnavailable(f"cannot delegate memory, pids and cpu to {_PARENT_NAME}: {last}")
