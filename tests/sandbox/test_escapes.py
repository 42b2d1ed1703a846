"""Escape tests: every probe an attacker's program would try, run in a real box, and checked.

Each test runs a small program (inline, or from ``probes/``) in a box through the
``farmctl sandbox run`` CLI and asserts that the box held. Where the program's own
word cannot be trusted (did a file appear outside, did a listener get a connection,
is a process left over, which uid did it really run as), the check is made from the
host. Every test also ends with a host-side check that the box left nothing behind:
no process of a slot uid, no scratch mount, no box cgroup (``_box_leaves_nothing``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farmd.sandbox.owners import box_name_owner, owner_alive
from tests.conftest import FARMCTL, box, box_processes, farmctl, py

pytestmark = pytest.mark.sandbox

PROBES = Path(__file__).with_name("probes")
BOX_ENV = {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS",
           "OPENBLAS_NUM_THREADS", "PWD"}


# -- helpers ----------------------------------------------------------------------------------


def probe(name: str) -> str:
    return (PROBES / name).read_text()


def new_marker() -> str:
    return f"farm-escape-{uuid.uuid4().hex}"


def slot_range() -> range:
    from farmd.sandbox.config import DEFAULT_UID_BASE, DEFAULT_UID_COUNT

    return range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + DEFAULT_UID_COUNT)


def run_dir() -> Path:
    from farmd.sandbox.runtime import default_run_dir

    return default_run_dir()


@functools.cache
def cgroup_parents() -> tuple[Path, ...]:
    from farmd.sandbox import cgroups

    return tuple(cgroups.detect().parents())


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def proc_status(pid: int) -> dict[str, list[str]]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.split() for k, v in (line.split(":", 1) for line in lines if ":" in line)}


def others_box(name: str) -> bool:
    """True for a box (``<pid>-<n>``, ``box-<pid>-<n>``) of a farmd or farmctl that still runs and is
    not this test's: the host is shared, and another process's boxes are not this test's leftovers.
    (Every farmctl a test starts has exited by the time its leftovers are counted.)"""
    owner = box_name_owner(name)
    return owner is not None and owner != os.getpid() and owner_alive(name)


def _box_of(pid: int) -> str:
    """The box cgroup a process is in (``box-<pid>-<n>``), or "" if none."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            for part in line.rpartition(":")[2].split("/"):
                if part.startswith("box-"):
                    return part
    return ""


def live_box_processes() -> list[int]:
    """Processes of slot uids that can still run code, but for other running farms' boxes. A zombie
    cannot: an orphaned one waits for the host's pid 1, which on some VMs reaps lazily. Its state is read
    after its cgroup: another test's box process that ends between the two reads has no cgroup left to
    name its owner, and is gone, not left over."""
    found = []
    for pid in box_processes():
        box = _box_of(pid)
        if proc_state(pid) not in (None, "Z") and not others_box(box):
            found.append(pid)
    return found


def pids_with(text: str, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Host pids whose command line holds ``text`` (zombies, whose cmdline is empty, never match)."""
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def traces() -> set[str]:
    """Scratch mount points and box cgroups on the host, as paths, but for other running farms' boxes."""
    found = set()
    with contextlib.suppress(FileNotFoundError):
        found |= {str(p) for p in (run_dir() / "boxes").iterdir() if not others_box(p.name)}
    for parent in cgroup_parents():
        with contextlib.suppress(FileNotFoundError):
            found |= {str(p) for p in parent.iterdir()
                      if p.is_dir() and p.name.startswith("box-") and not others_box(p.name)}
    return found


def remove_tree(root: Path) -> None:
    """rm -rf for trees deeper than the recursion limit or longer than PATH_MAX (which shutil.rmtree,
    and pytest's own tmp_path cleanup, die on): every subdirectory is first lifted next to ``root``."""
    pending, lifted = [root], 0
    while pending:
        d = pending.pop()
        with os.scandir(d) as entries:
            for entry in list(entries):
                if entry.is_dir(follow_symlinks=False):
                    lifted += 1
                    target = root.with_name(f"{root.name}.lifted{lifted}")
                    os.rename(entry.path, target)
                    pending.append(target)
                else:
                    os.unlink(entry.path)
        os.rmdir(d)


def sandbox_args(*cmd: str, files: Path | None = None, out: Path | None = None, **bounds: Any) -> list[str]:
    args = [FARMCTL, "sandbox", "run"]
    for name, value in bounds.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    if files is not None:
        args += ["--files", str(files)]
    if out is not None:
        args += ["--out", str(out)]
    return [*args, "--", *cmd]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a farmctl we started: Ctrl-C first (it then tears its box down), SIGKILL if that fails."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.communicate()


@contextlib.contextmanager
def background_box(*cmd: str, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
                   **bounds: Any) -> Iterator[subprocess.Popen[bytes]]:
    """farmctl running a box in the background; never outlives the block."""
    proc = subprocess.Popen(sandbox_args(*cmd, **bounds), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, pass_fds=pass_fds)
    try:
        yield proc
    finally:
        stop(proc)


def result_of(proc: subprocess.Popen[bytes], timeout: float, why: str = "") -> dict[str, Any]:
    """The JSON result of a background farmctl; fails the test if it does not come within ``timeout``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail(f"farmctl gave no result within {timeout} s. {why}")
    assert proc.returncode == 0, f"farmctl exited {proc.returncode}: {err[-3000:]!r}"
    return json.loads(out)


@pytest.fixture(autouse=True)
def _box_leaves_nothing() -> Iterator[None]:
    """After every test: no live process of a slot uid, no new scratch mount or box cgroup."""
    before = traces()
    yield
    clean = wait_until(lambda: not live_box_processes() and not traces() - before, 3.0)
    assert clean, (f"left over after the box: processes {live_box_processes()}, "
                   f"traces {sorted(traces() - before)}")


@pytest.fixture
def secret_file(tmp_path: Path) -> tuple[Path, str]:
    """A root-only (0600) file on the host, in a root-only directory, with a unique content."""
    secret = f"farm-secret-{uuid.uuid4().hex}"
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    path = d / "secret.txt"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path, secret


# -- 1. host files ----------------------------------------------------------------------------


def test_root_only_host_file_is_unreadable_by_any_path(tmp_path: Path, secret_file: tuple[Path, str]) -> None:
    """Reading a host secret: directly, through /proc/<pid>/root and cwd of every box process, and
    through a symlink smuggled in with --files. The box's root is its own, so every path must fail,
    and the secret's content must appear nowhere in what the box printed. /etc/shadow is absent."""
    path, secret = secret_file
    files = tmp_path / "files"
    files.mkdir()
    (files / "smuggled_link").symlink_to(path)
    (files / "plain.txt").write_text("plain\n")
    code = """
import errno, json, os, sys
path = sys.argv[1]
tries = [path, "/proc/self/root" + path, "/proc/1/root" + path, "/proc/2/root" + path,
         "/proc/1/cwd/../.." + path, "/proc/self/cwd/../../.." + path, "smuggled_link",
         "/etc/shadow", "/proc/1/root/etc/shadow", "/etc/gshadow"]
out = {}
for p in tries:
    try:
        out[p] = "read: " + open(p).read()
    except OSError as exc:
        out[p] = errno.errorcode.get(exc.errno)
out["listing"] = sorted(os.listdir("."))
out["etc"] = sorted(os.listdir("/etc"))
print(json.dumps(out))
"""
    res = box("python3", "-c", code, str(path), files=files, wall_time=5)
    assert res["exit_code"] == 0, res["stderr"]
    assert secret not in res["stdout"] + res["stderr"]
    seen = json.loads(res["stdout"])
    for p, outcome in seen.items():
        if p not in ("listing", "etc"):
            assert not outcome.startswith("read"), f"the box read {p}"
    assert seen["/etc/shadow"] == "ENOENT"
    assert "shadow" not in seen["etc"] and "gshadow" not in seen["etc"]
    assert seen["listing"] == ["plain.txt"], "a symlink in --files must not be copied (or followed)"


# -- 2. host processes ------------------------------------------------------------------------


def test_host_processes_are_invisible() -> None:
    """Seeing (or signalling) the host's processes: a host process with a marker in its argv, and
    pytest itself, must not appear in the box's /proc, which must hold only the box's own few
    processes; kill(host pid, 0) must find nothing."""
    marker = new_marker()
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        code = """
import errno, json, os, sys
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
cmdlines = {p: open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace") for p in pids}
signals = {}
for target in map(int, sys.argv[1:]):
    try:
        os.kill(target, 0)
        signals[target] = "exists"
    except OSError as exc:
        signals[target] = errno.errorcode.get(exc.errno)
print(json.dumps({"pids": pids, "cmdlines": cmdlines, "signals": signals}))
"""
        res = box("python3", "-c", code, str(host.pid), str(os.getpid()), wall_time=5)
    finally:
        host.kill()
        host.wait()
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    assert marker not in json.dumps(seen["cmdlines"])
    assert "pytest" not in json.dumps(seen["cmdlines"])
    assert len(seen["pids"]) <= 4 and max(seen["pids"]) < 100, seen["pids"]
    assert set(seen["signals"].values()) == {"ESRCH"}, seen["signals"]


# -- 3. farmd's environment and descriptors ---------------------------------------------------


def test_farmctl_environment_and_inherited_descriptor_do_not_reach_the_box(tmp_path: Path) -> None:
    """farmctl runs with a secret in its environment and an extra descriptor (on a secret file)
    inherited from its caller. The box must see neither: not in its environ, not in any visible
    process's /proc/<pid>/environ or descriptors; the program holds only 0, 1, 2 (+ its listing's)."""
    secret = f"farm-secret-{uuid.uuid4().hex}"
    secret_path = tmp_path / "inherited-secret.txt"
    secret_path.write_text(secret)
    fd = os.open(secret_path, os.O_RDONLY)
    try:
        env = {**os.environ, "FARM_SECRET": secret, "FARM_TOKEN": secret}
        with background_box("python3", "-c", probe("leaks.py"), str(fd), env=env, pass_fds=(fd,),
                            wall_time=5) as proc:
            res = result_of(proc, 60)
    finally:
        os.close(fd)
    assert res["exit_code"] == 0, res["stderr"]
    assert secret not in res["stdout"] + res["stderr"]
    assert "inherited-secret" not in res["stdout"]
    seen = json.loads(res["stdout"])
    assert set(seen["environ"]) <= BOX_ENV, set(seen["environ"]) - BOX_ENV
    assert seen["own_fds"] == [0, 1, 2, 3], seen["own_fds"]
    assert seen["inherited"] == "EBADF"
    for pid, info in seen["procs"].items():
        if info["environ"].startswith("<"):
            continue  # unreadable (e.g. a non-dumpable init): nothing leaks through it either
        names = {kv.partition("=")[0] for kv in info["environ"].split("\0") if kv}
        assert not names - BOX_ENV, f"pid {pid} has environment {names - BOX_ENV}"
        assert "FARM" not in info["environ"]


# -- 4. the host's network --------------------------------------------------------------------


def _host_addresses() -> list[str]:
    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                ip = a.address.split("%")[0]
                if not ip.startswith(("127.", "fe80")) and ip != "::1":
                    out.append(ip)
    return out


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_host_listeners_get_nothing() -> None:
    """Connecting out to the host: TCP and UDP listeners on 127.0.0.1 and ::1, TCP/UDP listeners on
    every host address, and abstract unix sockets (which are per network namespace). Asserted from
    the host: no listener has a pending connection or datagram. In the box every connect fails,
    and only a loopback interface exists."""
    sockets: list[socket.socket] = []

    def listen(family: socket.AddressFamily, kind: socket.SocketKind, addr: Any) -> socket.socket:
        s = socket.socket(family, kind)
        sockets.append(s)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(addr)
        if kind == socket.SOCK_STREAM:
            s.listen(16)
        s.setblocking(False)
        return s

    try:
        targets: dict[str, list[Any]] = {"tcp": [], "udp": [], "abstract_stream": [], "abstract_dgram": []}
        v6 = _ipv6_loopback()
        for host in ["127.0.0.1", *(["::1"] if v6 else [])]:
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            targets["tcp"].append([host, listen(fam, socket.SOCK_STREAM, (host, 0)).getsockname()[1]])
            targets["udp"].append([host, listen(fam, socket.SOCK_DGRAM, (host, 0)).getsockname()[1]])
        any4_tcp = listen(socket.AF_INET, socket.SOCK_STREAM, ("0.0.0.0", 0)).getsockname()[1]
        any4_udp = listen(socket.AF_INET, socket.SOCK_DGRAM, ("0.0.0.0", 0)).getsockname()[1]
        any6_tcp = listen(socket.AF_INET6, socket.SOCK_STREAM, ("::", 0)).getsockname()[1] if v6 else 0
        for ip in _host_addresses():
            if ":" in ip:
                if v6:
                    targets["tcp"].append([ip, any6_tcp])
            else:
                targets["tcp"].append([ip, any4_tcp])
                targets["udp"].append([ip, any4_udp])
        # Also the loopback through the wildcard listeners, as a program would try first.
        targets["tcp"].append(["127.0.0.1", any4_tcp])
        targets["udp"].append(["127.0.0.1", any4_udp])
        name = new_marker()
        listen(socket.AF_UNIX, socket.SOCK_STREAM, "\0" + name)
        listen(socket.AF_UNIX, socket.SOCK_DGRAM, "\0" + name + "-dgram")
        targets["abstract_stream"].append(name)
        targets["abstract_dgram"].append(name + "-dgram")

        res = box("python3", "-c", probe("network.py"), json.dumps(targets), wall_time=20)

        readable, _, _ = select.select(sockets, [], [], 0)
        assert readable == [], f"host listeners got traffic from the box: {[s.getsockname() for s in readable]}"
    finally:
        for s in sockets:
            s.close()
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    for kind, target, outcome in seen["attempts"]:
        if kind in ("tcp", "abstract_stream"):
            assert outcome != "connected", f"{kind} {target} connected"
    assert seen["interfaces"] == ["lo"]
    assert all(outcome != "answered" for _, outcome in seen["dns"]), seen["dns"]


# -- 5. names ---------------------------------------------------------------------------------


def test_name_resolution_fails() -> None:
    """Resolving names (the first step of any exfiltration): example.com must not resolve;
    localhost may, but only to loopback. The box has no resolv.conf to find a DNS server in."""
    code = """
import json, os, socket
out = {"resolv.conf": os.path.exists("/etc/resolv.conf")}
try:
    out["example.com"] = sorted({a[4][0] for a in socket.getaddrinfo("example.com", 80)})
except socket.gaierror as exc:
    out["example.com"] = "gaierror " + str(exc.errno)
out["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80)})
out["hostname"] = socket.gethostname()
print(json.dumps(out))
"""
    res = py(code, wall_time=10)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    assert str(seen["example.com"]).startswith("gaierror"), seen
    assert set(seen["localhost"]) <= {"127.0.0.1", "::1"}, seen
    assert seen["resolv.conf"] is False
    assert seen["hostname"] == "box"


# -- 6. writing outside the scratch directory -------------------------------------------------


def test_writes_outside_scratch_do_not_reach_the_host(tmp_path: Path) -> None:
    """Planting a file anywhere outside /box: the root, /usr, /etc, numpy's site, /proc/sys, farm's
    run directory, the host's /tmp and a host temp directory. Checked on the host: none of those
    files exists afterwards, and the host's hostname is unchanged. Inside, /box, /tmp and /dev/shm
    are writable (and private: the host's /tmp gets nothing)."""
    marker = new_marker()
    rd = run_dir()
    host_dirs = ["/", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/etc", "/opt", "/opt/farm", "/root",
                 "/dev", "/dev/shm", "/tmp", "/run", str(rd), str(rd / "slots"), str(rd / "boxes"),
                 str(rd / "runtime"), str(tmp_path)]
    host_dirs += [str(p) for p in (rd / "runtime").iterdir() if p.is_dir()]
    host_dirs += [str(Path(sys.prefix) / "box-site"), str(Path(sys.prefix) / "box-site" / "numpy")]
    box_dirs = [*host_dirs, "/opt/farm/site", "/opt/farm/site/numpy", "/box", "/proc", "/proc/sys",
                "/proc/1/root/etc", "/proc/1/cwd/..", "/sys/fs/cgroup"]
    code = """
import errno, json, sys
marker, dirs = sys.argv[1], sys.argv[2:]
out = {}
for d in dirs:
    try:
        with open(f"{d}/{marker}", "w") as fh:
            fh.write("escaped")
        out[d] = "written"
    except OSError as exc:
        out[d] = errno.errorcode.get(exc.errno)
for p in ("/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname"):
    try:
        with open(p, "w") as fh:
            fh.write("escaped")
        out[p] = "written"
    except OSError as exc:
        out[p] = errno.errorcode.get(exc.errno)
print(json.dumps(out))
"""
    hostname = socket.gethostname()
    try:
        res = box("python3", "-c", code, marker, *box_dirs, wall_time=5)
        leaked = [d for d in host_dirs if os.path.lexists(os.path.join(d, marker))]
        assert leaked == [], f"the box wrote into host directories: {leaked}"
        assert socket.gethostname() == hostname
    finally:
        for d in host_dirs:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(d, marker))
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    writable = {d for d, outcome in seen.items() if outcome == "written"}
    # /dev is the box's own 64 KiB tmpfs (its device nodes are binds): private, like /tmp.
    assert {"/box", "/tmp", "/dev/shm"} <= writable <= {"/box", "/tmp", "/dev/shm", "/dev"}, writable


# -- 7, 8. processes and threads --------------------------------------------------------------


def test_fork_bomb_is_bounded_by_pids() -> None:
    """A fork bomb: the pids bound stops it, the whole box is killed with "pids" named, nothing is
    left over (see the autouse check) and the host can still start processes."""
    code = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    res = py(code, pids=32, wall_time=10, memory_mb=256)
    assert "pids" in res["violations"], res
    assert not res["timed_out"], "the pids bound, not the wall clock, must end a fork bomb"
    assert subprocess.run(["true"], check=False).returncode == 0


def test_thread_bomb_is_bounded_by_pids() -> None:
    """Threads count as processes: starting threads in a loop hits the pids bound, named "pids"."""
    code = """
import threading, time
while True:
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
"""
    res = py(code, pids=32, wall_time=10)
    assert "pids" in res["violations"], res
    assert not res["timed_out"]


# -- 9. descriptors ---------------------------------------------------------------------------


def test_descriptor_exhaustion_stops_at_open_files() -> None:
    """Opening files until EMFILE: the count stays at --open-files, the limit cannot be raised, a
    child process has the same limit, and the box ends normally."""
    code = """
import json, os, resource
def fill():
    fds = []
    try:
        while True:
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as exc:
        err = exc.errno
    for fd in fds:
        os.close(fd)
    return len(fds), err
out = {"parent": fill()}
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    out["raise"] = "raised"
except (ValueError, OSError) as exc:
    out["raise"] = type(exc).__name__
r, w = os.pipe()
if os.fork() == 0:
    os.write(w, json.dumps(fill()).encode())
    os._exit(0)
os.wait()
out["child"] = json.loads(os.read(r, 100))
print(json.dumps(out))
"""
    res = py(code, open_files=32, wall_time=5)
    assert res["exit_code"] == 0 and res["violations"] == [], res
    seen = json.loads(res["stdout"])
    for who in ("parent", "child"):
        count, err = seen[who]
        assert err == errno.EMFILE
        assert 32 - 8 <= count + 3 <= 32 + 2, f"{who} opened {count} descriptors with --open-files 32"
    assert seen["raise"] != "raised"


# -- 10. memory -------------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 8], ids=["one-process", "spread-over-8"])
def test_memory_bomb_is_killed(processes: int) -> None:
    """Allocating and touching 2 GiB with --memory-mb 128, in one process or spread over eight
    (each under the bound): the memory cgroup counts the box as a whole, kills it, and says so."""
    code = f"""
import os
n = {processes}
for _ in range(n - 1):
    if os.fork() == 0:
        break
b = bytearray((2 << 30) // n)
for i in range(0, len(b), 4096):
    b[i] = 1
print("survived", flush=True)
"""
    res = py(code, memory_mb=128, wall_time=20)
    assert res["oom"] is True, res
    assert "memory" in res["violations"]
    assert "survived" not in res["stdout"]
    assert res["memory_peak_mb"] <= 128 + 1


# -- 11. scratch, /tmp, /dev/shm --------------------------------------------------------------


FILL = """
import sys
n = 0
try:
    with open(sys.argv[1], "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
            fh.flush()
            n += 1
except OSError as exc:
    print("stopped:", exc.strerror, n * 64, "KiB", flush=True)
"""


@pytest.mark.parametrize(("path", "bounds", "violation"), [
    ("/box/fill", {"disk_mb": 8}, "disk"),
    ("/tmp/fill", {"tmp_mb": 8}, "tmp"),
    ("/dev/shm/fill", {}, "shm"),
], ids=["scratch", "tmp", "shm"])
def test_filling_a_tmpfs_is_bounded_and_named(path: str, bounds: dict[str, int], violation: str) -> None:
    """Writing until ENOSPC into the scratch directory, /tmp or /dev/shm: the write stops at the
    mount's size and the result names the bound."""
    res = box("python3", "-c", FILL, path, wall_time=10, **bounds)
    assert violation in res["violations"], res
    size_mb = bounds.get("disk_mb", bounds.get("tmp_mb", 16))
    if res["stdout"]:
        written_kib = int(res["stdout"].split()[-2])
        assert written_kib <= size_mb * 1024


def test_filling_scratch_inodes_is_bounded() -> None:
    """Creating empty files until the scratch runs out of inodes: named "disk" like a full disk."""
    code = """
import os
n = 0
try:
    while True:
        open(f"/box/f{n}", "w").close()
        n += 1
except OSError as exc:
    print(exc.strerror, n)
"""
    res = py(code, wall_time=10)
    assert "disk" in res["violations"], res
    assert int(res["stdout"].split()[-1] if res["stdout"] else 0) <= 65536


def test_tmp_writes_count_against_memory() -> None:
    """/tmp is RAM: with --memory-mb 64 and --tmp-mb 256, writing 200 MB there must be stopped by
    the memory bound (or the tmp one), never allowed to take 200 MB of the host's memory."""
    code = """
n = 0
with open("/tmp/fill", "wb") as fh:
    for _ in range(200 * 16):
        fh.write(b"x" * 65536)
        fh.flush()
        n += 1
print("wrote", n // 16, "MB")
"""
    res = py(code, memory_mb=64, tmp_mb=256, wall_time=20)
    assert {"memory", "tmp"} & set(res["violations"]), res
    assert "wrote 200 MB" not in res["stdout"]
    assert res["memory_peak_mb"] <= 64 + 1


# -- 12. output -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood_is_cut_promptly(stream: str) -> None:
    """100 MB to stdout (or stderr): the box is killed at the output bound, the captured stream is
    cut at it, and the whole farmctl call returns promptly."""
    code = f"""
import sys
chunk = b"A" * (1 << 20)
for _ in range(100):
    sys.{stream}.buffer.write(chunk)
sys.{stream}.flush()
"""
    started = time.monotonic()
    res = py(code, output_kb=64, wall_time=30)
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"farmctl took {elapsed:.1f} s"
    assert len(res[stream].encode()) <= 64 * 1024
    assert res["output_truncated"] is True
    assert "output" in res["violations"]
    assert not res["timed_out"]


# -- 13. time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [
    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n",
    "import time\ntime.sleep(10**6)\n",
], ids=["busy-ignoring-sigterm", "sleep-forever"])
def test_wall_time_bound_ends_the_box(code: str) -> None:
    """A loop that ignores SIGTERM, or a sleep forever, under --wall-time 1 (and a CPU bound far
    away): killed at the wall bound, reported as timed out, and farmctl returns promptly."""
    started = time.monotonic()
    res = py(code, wall_time=1, cpu_time=100)
    elapsed = time.monotonic() - started
    assert res["timed_out"] is True, res
    assert "wall_time" in res["violations"]
    assert abs(res["wall_s"] - 1) < 1, res["wall_s"]
    assert elapsed < 6, f"farmctl took {elapsed:.1f} s for a 1 s bound"


@pytest.mark.parametrize("processes", [1, 4], ids=["one-process", "spread-over-4"])
def test_cpu_time_bound_ends_the_box(processes: int) -> None:
    """Busy loops with --cpu-time 1 and --wall-time 20, in one process or spread over four (each
    under a per-process limit): the box's CPU time as a whole ends it, named "cpu_time"."""
    code = f"""
import os
for _ in range({processes} - 1):
    if os.fork() == 0:
        break
while True:
    pass
"""
    started = time.monotonic()
    res = py(code, cpu_time=1, wall_time=20)
    elapsed = time.monotonic() - started
    assert "cpu_time" in res["violations"], res
    assert not res["timed_out"]
    assert 1 <= res["cpu_s"] < 3, res["cpu_s"]
    assert elapsed < 10


# -- 14. daemons ------------------------------------------------------------------------------


def test_double_forked_daemon_dies_with_the_box() -> None:
    """A setsid, double-forked daemon with closed stdio, re-exec'd with a marker in its argv, that
    keeps writing heartbeats. After farmctl returns, no process with the marker exists on the host
    (checked again after a grace), and no slot uid runs anything."""
    marker = new_marker()
    code = """
import os, sys, time
marker = sys.argv[1]
beat = "import time\\nwhile True:\\n    open('/box/heartbeat', 'a').write('.')\\n    time.sleep(0.02)\\n"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        os.execv("/usr/bin/python3", ["python3", "-c", beat, marker])
    os._exit(0)
os.wait()
while not os.path.exists("/box/heartbeat"):
    time.sleep(0.01)
print("daemon running", flush=True)
"""
    with background_box("python3", "-c", code, marker, wall_time=10) as proc:
        res = result_of(proc, 60)
        farmctl_pid = proc.pid
    assert res["stdout"] == "daemon running\n", res
    assert not res["timed_out"], "the box must end when its program does, daemon or not"
    # Gone, and still gone a moment later: a daemon that survived its box runs on, and is found at every look.
    # One look is not enough on a loaded host, and an empty answer from a process being torn down is not proof.
    assert wait_until(lambda: not pids_with(marker, {farmctl_pid}) and time.sleep(0.3) is None
                      and not pids_with(marker, {farmctl_pid}), 5.0), \
        f"the daemon outlived its box: {[_described(pid) for pid in pids_with(marker, {farmctl_pid})]}"
    # Another test's box may be starting at this moment (a slot uid not yet in its cgroup): a leftover stays.
    assert wait_until(lambda: not live_box_processes(), 5.0), \
        f"slot uids still run: {[_described(pid) for pid in live_box_processes()]}"


def _described(pid: int) -> str:
    """What the host knows of ``pid``, for a failure's message."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:300]
        return f"{pid} {proc_state(pid)} ppid={proc_status(pid).get('PPid')} {cmdline!r}"
    except OSError as exc:
        return f"{pid} ({exc})"


# -- 15. killing the box's own infrastructure -------------------------------------------------


def test_killing_pid1_and_the_init_still_gives_a_result() -> None:
    """The program signals its pid 1 (kill and pidfd_send_signal) and SIGKILLs its parent, the init
    that reports to the host, leaving a child behind. farmctl still prints a result and exits 0,
    and nothing of the box is left on the host."""
    code = """
import os, signal, time
if os.fork() == 0:
    time.sleep(1000)
    os._exit(0)
for how in ("kill", "pidfd"):
    try:
        if how == "kill":
            os.kill(1, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(os.pidfd_open(1), signal.SIGKILL)
    except OSError as exc:
        print(how, exc.errno, flush=True)
print("parent next", flush=True)
os.kill(os.getppid(), signal.SIGKILL)
time.sleep(1000)
"""
    started = time.monotonic()
    proc = farmctl(*sandbox_args("python3", "-c", code, wall_time=5)[1:], check=False, timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert res["exit_code"] is not None or res["signal"] is not None, res
    assert elapsed < 20


# -- 16. denied kernel surfaces ---------------------------------------------------------------


EPERM, ENOSYS, EAFNOSUPPORT = "EPERM", "ENOSYS", "EAFNOSUPPORT"


def test_dangerous_syscalls_are_denied() -> None:
    """ptrace, process_vm_*, kcmp, pidfd_getfd, every mount API, unshare/setns, keyrings, bpf, perf,
    io_uring, userfaultfd, modules, kexec, reboot, swap, clocks, syslog, handles, memfd_secret,
    weakening personality flags, clone3 and clone with any namespace flag, netlink/packet/raw and
    other socket families, TIOCSTI: each must fail with the filter's errno, never return >= 0."""
    res = py(probe("syscalls.py"), wall_time=10)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    went_through = {name: r for name, r in seen.items() if r[0] >= 0}
    assert went_through == {}, f"calls the box was allowed to make: {went_through}"
    for name, (_, err) in seen.items():
        if name == "clone3":
            expected: set[str] = {ENOSYS}
        elif name == "setuid0":
            expected = {EPERM, "EINVAL"}  # uid 0 does not even exist in the box's user namespace
        elif name.startswith(("socket_inet", "socket_inet6")):
            expected = {EPERM}  # allowed families, denied raw/packet types
        elif name.startswith(("socket", "python_netlink")):
            expected = {EAFNOSUPPORT, EPERM}  # a denied family (EPERM when the type is raw too)
        else:
            expected = {EPERM}
        assert err in expected, f"{name} failed with {err}, expected {expected}"
    for required in ("ptrace_attach_1", "mount_tmpfs", "unshare_user", "keyctl_get_session", "bpf_prog_load",
                     "io_uring_setup", "perf_event_open", "userfaultfd", "clone_newuser", "clone3",
                     "socket_netlink_raw", "socket_packet_raw", "socket_inet_raw", "tiocsti_fd0"):
        assert required in seen


# -- 17. uids ---------------------------------------------------------------------------------


WAIT_FOR_USR1 = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
signal.sigwait({signal.SIGUSR1})
print("released", os.getuid(), os.geteuid(), flush=True)
"""


def test_box_processes_run_as_unprivileged_slot_uids() -> None:
    """From the host, while a box runs: every process farmctl started for it (setpriv/bwrap, pid 1,
    the init, the program, found by a marker in its argv) has real, effective, saved and fs uids
    and gids that are non-zero slot ids, and no supplementary groups. Inside, the program is uid
    1000. The program then exits when the host releases it (SIGUSR1, once it waits for that signal)."""
    marker = new_marker()
    # "-X utf8" is not emulated by the box's init, so python3 is exec'd and its argv holds the marker.
    with background_box("python3", "-X", "utf8", "-c", WAIT_FOR_USR1, marker, wall_time=30) as proc:
        found: list[int] = []

        def program_waits() -> bool:  # in rt_sigtimedwait (128), so SIGUSR1 cannot kill it
            found[:] = pids_with(marker, {proc.pid})
            with contextlib.suppress(OSError):
                return len(found) == 1 and Path(f"/proc/{found[0]}/syscall").read_text().split()[0] == "128"
            return False

        assert wait_until(program_waits, 20), f"the marked program never showed up: {found}"
        tree = descendants(proc.pid)
        assert found[0] in tree
        slots = slot_range()
        for pid in tree:
            status = proc_status(pid)
            if not status:
                continue  # gone meanwhile
            uids, gids = [int(x) for x in status["Uid"]], [int(x) for x in status["Gid"]]
            assert all(u in slots for u in uids), f"pid {pid} runs with uids {uids}"
            assert all(g in slots for g in gids), f"pid {pid} runs with gids {gids}"
            assert status.get("Groups", []) == [], f"pid {pid} has groups {status['Groups']}"
        os.kill(found[0], signal.SIGUSR1)
        res = result_of(proc, 30)
    assert res["exit_code"] == 0, res
    assert res["stdout"] == "released 1000 1000\n"


def test_privileges_cannot_be_gained(tmp_path: Path) -> None:
    """Becoming root: setuid(0)/setgid(0)/setgroups fail; chown to root fails; a setuid bit on the
    box's own file is allowed but every writable mount is nosuid; the host's setuid binaries
    (mount) run without privilege; every box process has no capabilities, no_new_privs and a
    seccomp filter. The setuid bit never comes out with --out."""
    code = """
import errno, json, os
out = {}
for name, call in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                   ("setgroups", lambda: os.setgroups([0])), ("seteuid", lambda: os.seteuid(0))):
    try:
        call()
        out[name] = "succeeded"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno)
open("/box/mine", "w").write("x")
try:
    os.chown("/box/mine", 0, 0)
    out["chown"] = "succeeded"
except OSError as exc:
    out["chown"] = errno.errorcode.get(exc.errno)
os.chmod("/box/mine", 0o4755)
out["mine"] = [os.stat("/box/mine").st_uid, oct(os.stat("/box/mine").st_mode)]
out["ids"] = [os.getresuid(), os.getresgid(), os.getgroups()]
print(json.dumps(out))
"""
    out = tmp_path / "out"
    res = box("python3", "-c", code, out=out, wall_time=5)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    for name in ("setuid", "setgid", "setgroups", "seteuid", "chown"):
        assert seen[name] in ("EPERM", "EINVAL"), f"{name}: {seen[name]}"
    assert seen["mine"][0] == 1000
    assert seen["ids"] == [[1000, 1000, 1000], [1000, 1000, 1000], []]
    harvested = out / "mine"
    assert harvested.read_text() == "x"
    assert harvested.stat().st_mode & 0o7000 == 0, oct(harvested.stat().st_mode)

    views = json.loads(py(probe("views.py"), wall_time=10)["stdout"])
    for path, flags in views["mount flags"].items():
        assert flags[0] is True, f"{path} is not nosuid"
        if path not in ("/box", "/tmp", "/dev/shm"):
            assert flags[1] is True, f"{path} is writable"
    if "setuid mount" in views:
        assert views["setuid mount"][0] != 0, views["setuid mount"]
    for pid, status in views["status"].items():
        assert status["CapEff"] == ["0000000000000000"], (pid, status)
        assert status["CapPrm"] == ["0000000000000000"], (pid, status)
        assert status["NoNewPrivs"] == ["1"], (pid, status)
        assert status["Seccomp"] == ["2"], (pid, status)


# -- 18. links and --out ----------------------------------------------------------------------


def test_out_never_follows_links_to_host_files(tmp_path: Path, secret_file: tuple[Path, str]) -> None:
    """The box plants symlinks to /etc/shadow, /etc/passwd, a root-only host secret, /, /etc and
    /usr/bin (also inside a subdirectory, and chained), a FIFO, hard links between its own files,
    and tries hard links to host files (which fail: another filesystem). After --out, the host
    directory holds no link, no FIFO and no byte of a host file; links are listed as skipped;
    regular files come out byte-exact and without setuid bits."""
    secret_path, secret = secret_file
    out = tmp_path / "out"
    res = box("python3", "-c", probe("links.py"), str(secret_path), out=out, wall_time=10)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    assert all(outcome != "linked" for outcome in seen["hard"].values()), seen["hard"]

    host_contents = [Path("/etc/passwd").read_bytes(), secret.encode()]
    if Path("/etc/shadow").exists():
        host_contents.append(Path("/etc/shadow").read_bytes())
    python_size = Path("/usr/bin/python3").resolve().stat().st_size
    found = {}
    for root, dirs, files in os.walk(out):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            rel = str(p.relative_to(out))
            assert not stat.S_ISLNK(st.st_mode), f"{rel} came out as a link"
            if stat.S_ISDIR(st.st_mode):
                continue
            assert stat.S_ISREG(st.st_mode), f"{rel} came out as a special file"
            assert st.st_mode & 0o7000 == 0, f"{rel} came out with mode {oct(st.st_mode)}"
            data = p.read_bytes()
            assert st.st_size != python_size or b"ELF" not in data[:4], f"{rel} is the host's python"
            for content in host_contents:
                assert content not in data and (not data or data not in content), f"{rel} holds host content"
            found[rel] = hashlib.sha256(data).hexdigest()
    for rel, digest in seen["digests"].items():
        assert found.get(rel) == digest, f"{rel} did not come out byte-exact"
    skipped = {s["path"]: s["reason"] for s in res["files_skipped"]}
    for link in ("shadow_link", "passwd_link", "secret_link", "proc_root_secret_link", "root_dir_link",
                 "etc_dir_link", "usr_bin_link", "python_link", "sub/etc_link", "sub/chain_link", "fifo"):
        assert link in skipped, f"{link} neither skipped nor reported: {skipped}"
        assert link not in found
    for twin in ("a.txt", "b.txt"):  # hard links between the box's own files: skipped or exact
        assert twin in skipped or found.get(twin) == hashlib.sha256(b"linked twice\n").hexdigest()
    assert set(res["files_out"]) == set(found), (res["files_out"], found)


# -- 19. foreign syscall ABIs -----------------------------------------------------------------


@pytest.mark.parametrize("code", [
    # x32: getpid (39) with the x32 bit set.
    "import ctypes\nlibc = ctypes.CDLL(None)\nprint('before', flush=True)\n"
    "libc.syscall(ctypes.c_long(0x40000000 | 39))\nprint('after', flush=True)\n",
    # i386 int 0x80: mov eax, 20 (getpid); int 0x80; ret.
    "import ctypes, mmap\nm = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "m.write(bytes.fromhex('b814000000cd80c3'))\n"
    "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
    "print('before', flush=True)\nf()\nprint('after', flush=True)\n",
], ids=["x32", "int80"])
def test_foreign_syscall_abis_kill_the_process(code: str) -> None:
    """A syscall through another ABI (x32, or i386's int 0x80) is not covered by rules written for
    x86_64 numbers, so it must kill the process with SIGSYS, reported as a "syscall" violation."""
    res = py(code, wall_time=5)
    assert res["signal"] == signal.SIGSYS, res
    assert res["exit_code"] is None
    assert "syscall" in res["violations"]
    assert res["stdout"] == "before\n"


# -- 20. positive controls --------------------------------------------------------------------


def test_ordinary_program_runs_and_reports_exactly(tmp_path: Path) -> None:
    """A positive control, so that the denials above mean something: numpy, unicode output, files
    put in with --files, a file taken out with --out byte-exact, and an exit code of 3."""
    files = tmp_path / "files"
    files.mkdir()
    data = os.urandom(10_000)
    (files / "data.bin").write_bytes(data)
    (files / "input.txt").write_text("hello from the host\n")
    code = """
import hashlib, os, sys
import numpy as np
a = np.arange(6).reshape(2, 3)
b = np.arange(6).reshape(3, 2)
print((a @ b).tolist())
print("héllo wörld ✓ 日本語 🐍")
print(hashlib.sha256(open("data.bin", "rb").read()).hexdigest())
print(open("input.txt").read().strip())
print(os.getcwd(), os.environ["HOME"], os.getuid())
with open("result.bin", "wb") as fh:
    fh.write(bytes(range(256)) * 17)
sys.exit(3)
"""
    out = tmp_path / "out"
    res = box("python3", "-c", code, files=files, out=out, wall_time=20)
    expected = (f"[[10, 13], [28, 40]]\nhéllo wörld ✓ 日本語 🐍\n{hashlib.sha256(data).hexdigest()}\n"
                "hello from the host\n/box /box 1000\n")
    assert res["stdout"] == expected, res
    assert res["exit_code"] == 3 and res["signal"] is None
    assert res["violations"] == [] and not res["timed_out"] and not res["oom"]
    assert (out / "result.bin").read_bytes() == bytes(range(256)) * 17
    assert "result.bin" in res["files_out"]


def test_death_by_own_signal_is_reported() -> None:
    """A program that aborts itself: signal 6, no exit code, no violation."""
    res = py("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGABRT)\n",
             wall_time=5)
    assert res["signal"] == signal.SIGABRT and res["exit_code"] is None, res
    assert res["violations"] == []
    assert res["stdout"] == "before\n"


def test_traceback_of_a_raising_program_comes_back() -> None:
    """A program that raises: exit code 1, and stderr holds the program's traceback."""
    res = py("def f():\n    raise ValueError('farm-boom')\nf()\n", wall_time=5)
    assert res["exit_code"] == 1 and res["signal"] is None, res
    assert "Traceback (most recent call last)" in res["stderr"]
    assert "ValueError: farm-boom" in res["stderr"]
    assert 'line 2, in f' in res["stderr"]


# -- further probes ---------------------------------------------------------------------------


def test_a_box_cannot_reach_another_running_box() -> None:
    """Cross-tenant: box B holds a secret in its /box, /tmp and /dev/shm, in its argv and as the
    name of an abstract unix socket it listens on, and waits. Box A, run meanwhile, looks for it
    everywhere it could: its /proc, /proc/net/unix (abstract names of its network namespace), every
    abstract name found there, and the same paths. A must find nothing of B, and B's listener must
    get no connection."""
    secret = new_marker()
    b_code = """
import os, signal, socket, sys
secret = sys.argv[1]
for p in ("/box/secret", "/tmp/secret", "/dev/shm/secret"):
    with open(p, "w") as fh:
        fh.write(secret)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\\0" + secret)
srv.listen()
srv.setblocking(False)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
signal.sigwait({signal.SIGUSR1})
try:
    srv.accept()
    print("accepted a connection", flush=True)
except BlockingIOError:
    print("no connection", flush=True)
"""
    a_code = """
import errno, json, os, socket
out = {"pids": sorted(os.listdir("/proc"))}
out["cmdlines"] = [open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
                   for p in os.listdir("/proc") if p.isdigit()]
with open("/proc/net/unix") as fh:
    unix = fh.read()
out["unix"] = unix
for line in unix.splitlines()[1:]:
    path = line.split()[-1] if len(line.split()) > 7 else ""
    if path.startswith("@"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect("\\0" + path[1:])
                out[path] = "connected"
            except OSError as exc:
                out[path] = errno.errorcode.get(exc.errno)
for p in ("/box/secret", "/tmp/secret", "/dev/shm/secret"):
    try:
        out[p] = open(p).read()
    except OSError as exc:
        out[p] = errno.errorcode.get(exc.errno)
print(json.dumps(out))
"""
    with background_box("python3", "-X", "utf8", "-c", b_code, secret, wall_time=30) as b:
        found: list[int] = []

        def b_waits() -> bool:
            found[:] = pids_with(secret, {b.pid})
            with contextlib.suppress(OSError):
                return len(found) == 1 and Path(f"/proc/{found[0]}/syscall").read_text().split()[0] == "128"
            return False

        assert wait_until(b_waits, 20), "box B never got ready"
        a = py(a_code, wall_time=10)
        os.kill(found[0], signal.SIGUSR1)
        b_res = result_of(b, 30)
    assert a["exit_code"] == 0, a["stderr"]
    assert secret not in a["stdout"] + a["stderr"], "box A found box B's secret"
    seen = json.loads(a["stdout"])
    assert all(v != "connected" for k, v in seen.items() if k.startswith("@"))
    assert b_res["exit_code"] == 0 and b_res["stdout"] == "no connection\n", b_res


def test_kernel_and_host_interfaces_are_closed() -> None:
    """What else an attacker reads or pokes: /sys (cgroup files), /run (farm's slot locks), /root,
    /home, /var, /usr/local must be absent or empty; /proc/sys, sysrq, uid_map not writable; kcore
    and kmsg unreadable; /dev holds only harmless character devices and no node can be made;
    /proc/1/root and /proc/self/root are the box's own root; the box sees only its own processes."""
    seen = json.loads(py(probe("views.py"), wall_time=10)["stdout"])
    for key, outcome in seen.items():
        if key.startswith("listdir "):
            assert outcome in ("ENOENT", "EACCES", "EPERM", []), f"{key}: {outcome}"
        elif key.startswith("write "):
            assert outcome != "written", key
        elif key.startswith("read "):
            assert outcome != "read", key
    harmless = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)}  # null zero full random urandom tty ptmx
    for path, (kind, major, minor) in seen["devices"].items():
        assert kind == "char", f"block device {path} in the box"
        assert (major, minor) in harmless or path.startswith("/dev/pts/"), f"{path} is {major}:{minor}"
    assert seen["mknod"] in ("EPERM", "EACCES"), seen["mknod"]
    # pid 1 is farm's init, not dumpable: its root and cwd are out of the program's reach entirely.
    assert seen["/proc/1/root listing"] in (seen["root listing"], "EACCES")
    assert seen["/proc/self/root listing"] == seen["root listing"]
    assert "run" not in seen["root listing"] and "sys" not in seen["root listing"]
    assert seen["/proc/1/cwd"] in ("/box", "EACCES")
    assert len(seen["processes"]) <= 4


def test_init_memory_is_not_writable_by_the_program() -> None:
    """The box's pid 1 and its init (the program's parent, which holds the control socket on which
    the host learns how the program ended) run as the program's own uid. The program must not be
    able to open their memory for writing: with it, it can make the init say anything to the host
    (see the next test)."""
    code = """
import errno, json, os
out = {}
for pid in (1, os.getppid()):
    try:
        with open(f"/proc/{pid}/mem", "r+b"):
            out[pid] = "opened for writing"
    except OSError as exc:
        out[pid] = errno.errorcode.get(exc.errno)
print(json.dumps(out))
"""
    res = py(code, wall_time=5)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    opened = {pid: o for pid, o in seen.items() if o == "opened for writing"}
    assert opened == {}, f"the program can write the memory of box processes {sorted(opened)} (pid 1, init)"


def test_wall_time_holds_when_the_program_forges_the_init_report() -> None:
    """The program plants code in its init (via /proc/<ppid>/mem) that sends the host a forged
    {"event": "exit"} and then idles; the program itself sleeps forever. The host must still
    end the box at its 1 s wall bound (and report a timeout): a box must never outlive its bound
    because of what a process inside it said."""
    started = time.monotonic()
    with background_box("python3", "-c", probe("forge_init_report.py"), wall_time=1, cpu_time=100) as proc:
        res = result_of(proc, 10, why="A 1 s wall-time box ran on: the program forged its init's exit report, "
                                      "and the host stopped enforcing the wall-time bound.")
    elapsed = time.monotonic() - started
    assert res["timed_out"] is True, res
    assert "wall_time" in res["violations"]
    assert elapsed < 6


def test_no_process_outlives_the_wall_bound_when_pid1_is_stalled() -> None:
    """The program rewrites its pid 1 (bwrap's init, via /proc/1/mem) into a pause loop, leaves a
    child printing heartbeats, and exits 1.5 s into a 2 s wall bound. The init then reports a
    genuine exit, but pid 1 never ends and neither would the box. No process of the box may run
    past the wall bound (plus scheduling slack): the last heartbeat says how long the child ran."""
    started = time.monotonic()
    with background_box("python3", "-c", probe("outlive_via_pid1.py"), "1.5", wall_time=2, cpu_time=100) as proc:
        res = result_of(proc, 15, why="The box outlived its program: pid 1 was stalled.")
    elapsed = time.monotonic() - started
    beats = [float(line.split()[1]) for line in res["stdout"].splitlines() if line.startswith("beat ")]
    assert beats, res
    assert beats[-1] <= 2.0 + 0.3, (f"a process of the box ran {beats[-1]:.2f} s, past its 2 s wall bound "
                                    f"({'pid 1 stalled' if 'stalled' in res['stdout'] else res['stderr']})")
    assert elapsed < 8


@pytest.mark.parametrize("layout", ["deep", "long-names"])
def test_out_survives_hostile_directory_trees(tmp_path: Path, layout: str) -> None:
    """The box shapes its scratch for --out to choke on: 1,200 nested directories, or paths longer
    than the host's PATH_MAX (20 levels of 250-character names). farmctl must still exit 0 with a
    result (the contract: exit 0 whenever the box ran), with the deep file copied or skipped."""
    code = """
import os, sys
depth, name = (1200, "d") if sys.argv[1] == "deep" else (20, "n" * 250)
for _ in range(depth):
    os.mkdir(name)
    os.chdir(name)
open("deep.txt", "w").write("bottom")
"""
    out = tmp_path / "out"
    try:
        proc = farmctl(*sandbox_args("python3", "-c", code, layout, out=out, wall_time=20)[1:], check=False)
    finally:
        if out.exists():
            remove_tree(out)
    assert proc.returncode == 0, f"farmctl exited {proc.returncode}: {proc.stderr[-300:]!r}"
    res = json.loads(proc.stdout)
    assert res["exit_code"] == 0, res
    deep = [p for p in res["files_out"] if p.endswith("deep.txt")]
    skipped = [s["path"] for s in res["files_skipped"]]
    assert deep or skipped, res


def test_out_with_a_non_utf8_file_name_still_gives_valid_json(tmp_path: Path) -> None:
    """A file name that is not UTF-8 (b"caf\\xe9.txt") in the scratch directory, with --out: farmctl's
    output must still be one valid (UTF-8) JSON object, so a caller can read the result."""
    code = 'open(b"/box/caf\\xe9.txt", "wb").write(b"latin-1 name")\nopen("/box/ok.txt", "w").write("ok")\n'
    out = tmp_path / "out"
    proc = farmctl(*sandbox_args("python3", "-c", code, out=out, wall_time=10)[1:], check=False)
    assert proc.returncode == 0, proc.stderr[-600:]
    try:
        text = proc.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        pytest.fail(f"farmctl printed invalid UTF-8: {exc}: {proc.stdout[-200:]!r}")
    res = json.loads(text)
    assert "ok.txt" in res["files_out"]
    assert (out / "ok.txt").read_text() == "ok"


# -- issue 7: harvesting, host facts, shared inodes, whole-host calls, crashes ---------------------


def _farmctl_with_few_descriptors(args: list[str], nofile: int) -> subprocess.CompletedProcess[bytes]:
    """farmctl run with RLIMIT_NOFILE soft = hard = ``nofile`` (as a farmd that holds many boxes would
    have few descriptors to spare)."""
    return subprocess.run(["prlimit", f"--nofile={nofile}:{nofile}", "--", *args], capture_output=True,
                          timeout=180)


@pytest.mark.parametrize("layout", ["wide", "deep"])
def test_out_harvests_with_a_bounded_number_of_descriptors(tmp_path: Path, layout: str) -> None:
    """The box makes 4,000 sibling directories holding a file each (or a 60-deep chain with a file at
    every level), and farmctl harvests it with --out while allowed 128 descriptors in all. Every file
    must come out byte-exact and none may be skipped: a harvest that holds a descriptor per directory
    runs out of them, and in farmd that starves every other box's launch."""
    code = """
import os, sys
if sys.argv[1] == "wide":
    for i in range(4000):
        os.mkdir(f"d{i}")
        open(f"d{i}/f", "w").write(str(i))
else:
    for i in range(60):
        open("f", "w").write(str(i))
        os.mkdir("d")
        os.chdir("d")
"""
    out = tmp_path / "out"
    args = sandbox_args("python3", "-c", code, layout, out=out, policy="build", wall_time=60, cpu_time=60,
                        open_files=64)
    proc = _farmctl_with_few_descriptors(args, 128)
    assert proc.returncode == 0, f"farmctl exited {proc.returncode}: {proc.stderr[-600:]!r}"
    res = json.loads(proc.stdout)
    assert res["exit_code"] == 0, res["stderr"]
    assert res["files_skipped"] == [], res["files_skipped"][:5]
    if layout == "wide":
        expected = {f"d{i}/f": str(i) for i in range(4000)}
    else:
        expected = {"d/" * i + "f": str(i) for i in range(60)}
    assert len(res["files_out"]) == len(expected) and set(res["files_out"]) == set(expected)
    wrong = [rel for rel, content in expected.items() if (out / rel).read_text() != content]
    assert wrong == [], wrong[:5]


# What of the host a box's /proc must not show: what container runtimes mask (their list is the floor,
# kept here independently of farm's own list), the host's identity and its kernel's internals.
HOST_FACT_FILES = ("/proc/cmdline", "/proc/config.gz", "/proc/kallsyms", "/proc/modules", "/proc/kcore",
                   "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                   "/proc/sched_debug", "/proc/interrupts", "/proc/sysrq-trigger",
                   "/proc/sys/kernel/core_pattern")
HOST_FACT_DIRS = ("/proc/acpi", "/proc/asound", "/proc/scsi", "/proc/bus", "/sys/firmware")
READ_ONLY_PROC = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_host_facts_in_proc_are_masked() -> None:
    """The box reads what /proc shows of the host: its kernel command line, build config, symbols,
    modules, boot id, timers, interrupts, key lists, hardware directories. Each masked file reads as
    empty or not at all, never the host's content (compared with the host's own read); each masked
    directory lists as empty; the box's boot id is a well-formed id that is not the host's; /proc
    (with /proc/sys, bus, fs, irq, sysrq-trigger in it) is read-only, and nothing in it takes a write."""
    res = box("python3", "-c", probe("host_facts.py"), *HOST_FACT_FILES, *HOST_FACT_DIRS, *READ_ONLY_PROC, "/proc",
              BOOT_ID, wall_time=10)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    for path in HOST_FACT_FILES:
        outcome = seen[path]
        if "read" in outcome:
            assert outcome["read"] == "", f"the box read {len(outcome['read']) // 2} bytes of {path}"
        else:
            assert outcome["error"] in ("ENOENT", "EACCES", "EPERM"), (path, outcome)
        with contextlib.suppress(OSError):
            host = Path(path).read_bytes()[:4096]
            assert not host or host.hex() != outcome.get("read"), f"{path} shows the host's content"
    for path in HOST_FACT_DIRS:
        assert seen[path] in ({"list": []}, {"error": "ENOENT"}, {"error": "EACCES"}), (path, seen[path])
    boot_id = bytes.fromhex(seen[BOOT_ID]["read"]).decode().strip()
    assert str(uuid.UUID(boot_id)) == boot_id, boot_id
    assert boot_id != Path(BOOT_ID).read_text().strip(), "the box sees the host's boot id"
    for path in (*READ_ONLY_PROC, "/proc"):
        if Path(path).exists():
            assert seen[f"read-only {path}"] is True, f"{path} is on a writable mount"
    written = {k: v for k, v in seen.items() if k.startswith("write ") and v == "written"}
    assert written == {}, written


def test_file_watches_cannot_see_other_boxes() -> None:
    """Box A watches /usr/lib/python3.X (a read-only bind of a directory every box shares) with
    inotify, fanotify and dnotify; meanwhile box B reads files there. Before the fix A saw B's reads:
    a covert channel between attempts. Now no watch can be made, and nothing reaches A."""
    target = sorted(str(p) for p in Path("/usr/lib").glob("python3.*") if (p / "os.py").exists())[0]
    marker = new_marker()
    with background_box("python3", "-X", "utf8", "-c", probe("watch.py"), target, marker, wall_time=30) as a:
        found: list[int] = []

        def a_waits() -> bool:  # in rt_sigtimedwait (128): its watches, if any, are in place
            found[:] = pids_with(marker, {a.pid})
            with contextlib.suppress(OSError):
                return len(found) == 1 and Path(f"/proc/{found[0]}/syscall").read_text().split()[0] == "128"
            return False

        assert wait_until(a_waits, 20), "box A never got ready"
        b = box("python3", "-c", "import sys\nfor name in ('os.py', 'abc.py', 'types.py'):\n"
                "    open(sys.argv[1] + '/' + name, 'rb').read()\n", target, wall_time=10)
        assert b["exit_code"] == 0, b["stderr"]
        os.kill(found[0], signal.SIGUSR1)
        a_res = result_of(a, 30)
    assert a_res["exit_code"] == 0, a_res["stderr"]
    seen = json.loads(a_res["stdout"])
    assert {api: v for api, v in seen.items() if not isinstance(v, str)} == {}, (
        f"box A made a watch on a shared directory (and saw {seen})")
    assert seen["inotify"].startswith("ENOSYS from inotify_init1"), seen
    assert seen["fanotify"].startswith("EPERM from fanotify_init"), seen
    assert seen["dnotify"].startswith("EINVAL from fcntl"), seen


def _cachestat(path: Path) -> tuple[int, int]:
    """(pages of ``path`` in the host's page cache, of which dirty), by cachestat(2), as root on the host."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = os.open(path, os.O_RDONLY)
    try:
        rng = (ctypes.c_uint64 * 2)(0, 0)
        stat = (ctypes.c_uint64 * 5)()
        if libc.syscall(ctypes.c_long(451), fd, rng, stat, 0) != 0:
            pytest.fail(f"cachestat on the host failed: {os.strerror(ctypes.get_errno())}")
        return stat[0], stat[1]
    finally:
        os.close(fd)


def _fs_type(path: Path) -> str:
    """The type of the filesystem ``path`` is on, from this process's mount table."""
    best, fstype = "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point, kind = fields[4], fields[fields.index("-") + 1]
        if (str(path) + "/").startswith(mount_point.rstrip("/") + "/") and len(mount_point) >= len(best):
            best, fstype = mount_point, kind
    return fstype


@pytest.fixture
def disk_dir() -> Iterator[Path]:
    """A fresh directory on a disk-backed filesystem (/var/tmp), where written pages stay dirty until
    written back: on a tmpfs nothing is ever written back, and a check of sync would prove nothing."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="farm-escape-", dir="/var/tmp"))
    try:
        if _fs_type(d) in ("tmpfs", "ramfs", ""):
            pytest.fail(f"{d} is on {_fs_type(d) or 'an unknown filesystem'}: no disk to watch sync with")
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_host_wide_calls_do_not_reach_the_host(disk_dir: Path) -> None:
    """Calls that act on the whole host: sync and syncfs (flush every filesystem, or the host's root
    one), fsync/fdatasync/msync on a host file (a journal commit and a disk cache flush each), dropping a
    shared file's page cache (fadvise) and reading whether it is cached (RWF_NOWAIT, cachestat: with
    the former, a covert channel), and sockets whose protocol the kernel would look for by running
    modprobe on the host. Checked on the host: a dirty host file stays dirty, a cached shared file stays
    cached. In the box: the flushing calls succeed without reaching the kernel (0 even on a bad
    descriptor or a pipe), the cache probes fail, the protocol lookups fail, ordinary sockets work."""
    shared = Path(next(p for p in sorted(Path("/usr/lib").glob("python3.*/xdrlib.py"))))
    shared.read_bytes()
    dirty = disk_dir / "dirty.bin"
    with open(dirty, "wb") as fh:
        fh.write(os.urandom(1 << 20))
    cached_before, dirty_before = _cachestat(shared)[0], _cachestat(dirty)[1]
    assert cached_before > 0 and dirty_before > 0
    res = box("python3", "-c", probe("host_wide.py"), str(shared), wall_time=20)
    assert res["exit_code"] == 0, res["stderr"]
    assert _cachestat(dirty)[1] == dirty_before, "the box's sync wrote back a host file"
    assert _cachestat(shared)[0] == cached_before, "the box dropped a shared file from the host's page cache"
    seen = json.loads(res["stdout"])
    for name in ("sync", "syncfs_usr", "syncfs_bad_fd", "fsync_usr_file", "fdatasync_usr_file", "fsync_pipe",
                 "fdatasync_pipe", "msync_sync_usr_file", "msync_unmapped", "fadvise_dontneed_usr_file"):
        assert seen[name] == [0, None], (name, seen[name])
    assert seen["preadv2_nowait_usr_file"][1] == errno.errorcode[errno.EOPNOTSUPP], seen["preadv2_nowait_usr_file"]
    assert seen["cachestat_usr_file"][1] == "EPERM", seen["cachestat_usr_file"]
    lookups = {name: v for name, v in seen.items() if name.startswith("socket_")}
    assert len(lookups) == 11, lookups
    for name, (ret, err) in lookups.items():
        assert ret < 0 and err in ("EPROTONOSUPPORT", "ESOCKTNOSUPPORT"), (name, ret, err)
    assert set(seen["ordinary sockets"].values()) == {"made"}, seen["ordinary sockets"]


def test_a_box_program_starts_with_default_signals_whatever_farmd_ignores() -> None:
    """A farmd started as a shell's background job (SIGINT and SIGQUIT ignored) or under nohup (SIGHUP ignored)
    hands none of that to a box: an attempt's code meets the same signals however farmd was started."""
    names = ("SIGHUP", "SIGINT", "SIGQUIT")
    before = {name: signal.getsignal(getattr(signal, name)) for name in names}
    try:
        for name in names:  # what farmctl (and so its boxes) inherits from this process
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        res = box("python3", "-c", "import json, signal; print(json.dumps({n: signal.getsignal(getattr(signal, n)) == "
                  f"signal.SIG_IGN for n in {names!r}}}))")
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)
    assert json.loads(res["stdout"]) == dict.fromkeys(names, False), "none of them ignored in the box"


def test_crashes_never_dump_core(tmp_path: Path) -> None:
    """Box processes crash (SIGSEGV, abort, SIGQUIT; in the program's children and in an exec'd
    program) after trying to raise or lower RLIMIT_CORE. The limit is exactly 1 for every box process
    (the kernel starts no core_pattern pipe helper for a process whose limit is 1, and writes no core
    file under a page) and cannot be changed, though it can be read; no crash reports a core dump, and
    no core file is left in the box (checked on the harvested scratch directory too)."""
    out = tmp_path / "out"
    res = box("python3", "-c", probe("crash.py"), out=out, wall_time=20)
    assert res["exit_code"] == 0, res["stderr"]
    seen = json.loads(res["stdout"])
    for key in ("limit", "limit after", "child limit"):
        assert seen[key] == [1, 1], (key, seen[key])
    assert seen["exec'd limit"] == ["1", "1"], seen["exec'd limit"]
    # Python turns setrlimit's EPERM into this ValueError, lowering or raising alike.
    refused = ("EPERM", "ValueError: not allowed to raise maximum limit")
    for name in ("setrlimit 0", "setrlimit unlimited", "prlimit self 0", "prlimit own pid 0", "prlimit child 0"):
        assert seen[name] in refused, (name, seen[name])
    crashes = {name: v for name, v in seen.items() if " in /" in name or name == "exec'd abort"}
    assert len(crashes) == 7, crashes
    for name, (sig, dumped) in crashes.items():
        assert sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGQUIT) and not dumped, (name, sig, dumped)
    assert seen["core files"] == []
    assert not [p for p in out.rglob("*") if p.name.startswith("core")]


def test_the_leftover_check_counts_only_this_suites_boxes(tmp_path: Path) -> None:
    """The host is shared: a box another running farm holds is not this suite's leftover, so the check
    after every test passes beside it; a box whose owner is gone is counted (the check still catches)."""
    other = subprocess.Popen([str(FARMCTL), "sandbox", "run", "--wall-time", "30", "--", "sleep", "30"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Only that farmctl's box: other workers' tests start and end boxes meanwhile, and one whose owner has
        # just exited is, rightly, not another farm's.
        def _theirs() -> list[int]:
            return [p for p in box_processes() if box_name_owner(_box_of(p)) == other.pid]

        assert wait_until(lambda: bool(_theirs()), 20.0), "the other box never started"
        theirs = _theirs()
        assert all(others_box(_box_of(p)) for p in theirs), "a running farmctl's box is not ours"
        assert not [p for p in live_box_processes() if p in theirs], "counted as our leftover"
        gone = subprocess.Popen(["true"])
        gone.wait()
        assert not others_box(f"box-{gone.pid}-1") and not others_box(f"{gone.pid}-1"), \
            "a box whose owner is not running is counted"
    finally:
        other.terminate()
        other.wait(30)
