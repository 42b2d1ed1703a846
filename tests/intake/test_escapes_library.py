"""The escape library: every escape scores 0, and the host finds nothing of it afterwards.

Each escape runs once, on one task, through the real environment (``verify_safely`` in a real
Sandbox: the judge's box for py-func and kernel, the episode's boxes for shell), each with a marker of its
own: its own nonce, its own canary and "farmd" listeners, so that whatever turns up on the host
names the escape that left it. What the box printed is not trusted: the host looks for files,
processes, mounts and cgroups carrying the nonce, asks the listeners whether anything connected,
and looks for the data directory's secrets in the verdict that would be stored.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import secrets
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from farmd.envs import VerifyContext, get, verify_safely
from farmd.envs.base import Task
from farmd.envs.kernel import ALLOWED_IMPORTS
from farmd.envs.shell import MAX_STEPS
from farmd.envs.shell.rules import MAX_COMMAND_BYTES
from farmd.intake.escapes import Escape, Marker, for_kind, leftover_name, wrong_answer
from farmd.sandbox import Sandbox
from farmd.sandbox.runtime import default_run_dir
from farmd.verifier import VerifierKey, judge
from farmd.verifier.secret import KEY_FILE

KEY = VerifierKey(b"escape-library-test-key" * 2)
NAMES = {"read-other-scratch", "read-data-dir", "reach-farmd", "signal-host", "leave-process", "leave-files",
         "leave-mount", "exhaust-bounds", "forge-verdict"}


# -- no box -------------------------------------------------------------------------------------


def test_every_kind_that_runs_code_gets_every_escape_and_answers_get_none() -> None:
    for kind in ("function", "kernel", "shell"):
        assert {e.name for e in for_kind(kind)} == NAMES, kind
        assert len(for_kind(kind)) == len(NAMES), f"{kind}: a name twice"
    assert for_kind("answer") == [] and for_kind("nonsense") == []


@pytest.mark.parametrize("env_name", ["py-func", "kernel", "shell"])
def test_every_payload_carries_the_nonce_and_is_wrong(env_name: str) -> None:
    """Source payloads define the entry point before they run anything, and a kernel's passes the kernel's
    source rules (else it would never run); shell ones fit an episode's rules. Every one carries the nonce
    and the marker's ports, and answers wrong."""
    env = get(env_name)
    task = env.generate(5, 1)
    marker = Marker(uuid.uuid4().hex, canary_port=4242, farm_port=4343, data_dir="/srv/farm-data")
    for escape in for_kind(env.exploit_kind):
        attempt = escape.make(task, marker)
        text = attempt.final + "\n".join(attempt.actions)
        assert marker.nonce in text and "4242" in text and "4343" in text, escape.name
        if task.kind == "actions":
            assert attempt.actions and len(attempt.actions) <= MAX_STEPS, escape.name
            assert all(len(a.encode()) <= MAX_COMMAND_BYTES and "\0" not in a for a in attempt.actions), escape.name
            assert attempt.final != env.reference(task).final, escape.name
            continue
        assert not attempt.actions
        body = ast.parse(attempt.final).body
        first_run = next(i for i, node in enumerate(body) if isinstance(node, ast.Expr))
        defined = [n.name for n in body[:first_run] if isinstance(n, ast.FunctionDef)]
        assert task.entry_point in defined, escape.name
        if env_name == "kernel":
            assert judge.source_problem(attempt.final, {"imports": sorted(ALLOWED_IMPORTS)}) is None, escape.name


def test_markers_are_checked_and_name_leftovers() -> None:
    marker = Marker("0123456789abcdef")
    assert leftover_name(marker, "proc") == "farm-redteam-0123456789abcdef-proc"
    assert wrong_answer(marker).startswith("farm-redteam-0123456789abcdef-")
    assert marker.ports == [7431]
    assert Marker("0123456789abcdef", canary_port=9, farm_port=7431).ports == [7431, 9]
    for bad in ({"nonce": "short"}, {"nonce": "0123456789ABCDEF"}, {"nonce": "0123456789abcdef", "canary_port": 70000},
                {"nonce": "0123456789abcdef", "data_dir": "relative/dir"}):
        with pytest.raises(ValueError):
            Marker(**bad)
    with pytest.raises(ValueError):
        leftover_name(marker, "../escape")


# -- through the farm's boxes -------------------------------------------------------------------


@dataclass
class Trap:
    """One escape's marker and what waits for it on the host: TCP listeners on the canary port
    (loopback) and on the "farmd" port (every address), and a unix socket in the data directory."""

    marker: Marker
    listeners: list[socket.socket] = field(default_factory=list)

    def connections(self) -> list[str]:
        got = []
        for s in self.listeners:
            try:
                conn, peer = s.accept()
            except BlockingIOError:
                continue
            conn.close()
            got.append(f"{s.getsockname()!r} accepted a connection from {peer!r}")
        return got


@contextlib.contextmanager
def traps(escapes: list[Escape], data_dir: Path) -> Iterator[list[Trap]]:
    made: list[Trap] = []
    try:
        for i, _ in enumerate(escapes):
            canary = _listen(socket.AF_INET, ("127.0.0.1", 0))
            farm = _listen(socket.AF_INET, ("0.0.0.0", 0))
            unix = _listen(socket.AF_UNIX, str(data_dir / f"farmd-{i}.sock"))
            marker = Marker(uuid.uuid4().hex, canary_port=canary.getsockname()[1], farm_port=farm.getsockname()[1],
                            data_dir=str(data_dir))
            made.append(Trap(marker, [canary, farm, unix]))
        yield made
    finally:
        for trap in made:
            for s in trap.listeners:
                s.close()


def _listen(family: socket.AddressFamily, addr: tuple[str, int] | str) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind(addr)
        s.listen(8)
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def data_dir_with_secrets(root: Path) -> tuple[Path, list[str]]:
    """A farm data directory as farmd keeps it: its verifier key (0600) and its run file."""
    data = root / "farm-data"
    data.mkdir(mode=0o700)
    key = secrets.token_bytes(32)
    (data / KEY_FILE).write_bytes(key)
    (data / KEY_FILE).chmod(0o600)
    token = f"farm-secret-{secrets.token_hex(16)}"
    (data / "farmd.json").write_text(json.dumps({"pid": 1, "addr": "127.0.0.1:7431", "token": token}))
    return data, [key.hex(), token, repr(key)[2:-1]]


def host_traces(nonces: list[str], data_dir: Path) -> dict[str, list[str]]:
    """Every host file name, process command line, mount and cgroup that carries each of ``nonces``: one pass
    over the host for all of them (the run directory's walk alone is ~1,400 directories a runtime)."""
    found: dict[str, list[str]] = {n: [] for n in nonces}

    def note(text: str, what: str) -> None:
        for nonce in nonces:
            if nonce in text:
                found[nonce].append(what)

    run_dir = default_run_dir()
    shallow = {Path("/"), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/root"), Path.home(), Path("/run"),
               Path(tempfile.gettempdir()), Path.cwd(), Path.cwd().parent, data_dir.parent.parent}
    deep = [data_dir.parent, run_dir, *Path(tempfile.gettempdir()).glob("farm-shell-*")]
    for root in shallow:
        with contextlib.suppress(OSError):
            for p in root.iterdir():
                note(p.name, f"file {p}")
    for root in deep:
        for dirpath, dirs, files in os.walk(root):
            for n in dirs + files:
                note(n, f"file {dirpath}/{n}")
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                note(cmdline.decode(errors="replace"), f"process {entry}: {cmdline[:200]!r}")
    for table in ("/proc/self/mountinfo", "/proc/1/mountinfo"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines():
                note(line, f"mount {line}")
    for dirpath, dirs, _ in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            note(d, f"cgroup {dirpath}/{d}")
    return found


def breaches(trap: Trap, traces: list[str], verdict_json: dict[str, object], leaked: list[str]) -> list[str]:
    """What of ``trap``'s escape reached the host: ``traces`` (its nonce's, from ``host_traces``), a connection to
    a listener, a secret in the verdict, or a verdict other than 0."""
    text = json.dumps(verdict_json)
    out = traces + trap.connections()
    out += [f"a secret of the data directory is in the verdict: {s[:12]}..." for s in leaked if s in text]
    if verdict_json["status"] != "ok" or verdict_json["reward"] != 0.0 or verdict_json["passed"]:
        out.append(f"not scored 0: {text[:600]}")
    return out


async def run_escapes(env_name: str, tmp_path: Path) -> dict[str, list[str]]:
    env = get(env_name)
    escapes = for_kind(env.exploit_kind)
    tasks: list[Task] = [env.generate(700 + i, 1) for i in range(len(escapes))]  # one task per escape
    data_dir, leaked = data_dir_with_secrets(tmp_path)
    found: dict[str, list[str]] = {}
    with traps(escapes, data_dir) as made:
        async with Sandbox() as sandbox:
            ctx = VerifyContext(sandbox=sandbox, key=KEY)
            verdicts = await asyncio.gather(*[verify_safely(env, task, e.make(task, trap.marker), ctx)
                                              for e, task, trap in zip(escapes, tasks, made, strict=True)])
            # Checked while the sandbox still runs, as a live farm's would be: nothing waits for its close.
            nonces = [trap.marker.nonce for trap in made]
            traces = host_traces(nonces, data_dir)
            for escape, verdict, trap in zip(escapes, verdicts, made, strict=True):
                found[escape.name] = breaches(trap, traces[trap.marker.nonce], verdict.to_json(), leaked)
        after = host_traces(nonces, data_dir)
        for escape, trap in zip(escapes, made, strict=True):
            found[escape.name] += [f"after the sandbox closed: {t}" for t in after[trap.marker.nonce]]
    return {name: problems for name, problems in found.items() if problems}


@pytest.mark.sandbox
def test_the_host_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The checks below, against leftovers made on purpose from the host: a check that cannot fail proves
    nothing. A file, a process, a mount and a cgroup named by the nonce; a connection to each listener;
    the key in a verdict."""
    from farmd.sandbox import cgroups
    from farmd.sandbox.scratch import mount_tmpfs, unmount

    data_dir, leaked = data_dir_with_secrets(tmp_path)
    escapes = for_kind("function")[:1]
    with traps(escapes, data_dir) as (trap,):
        marker = trap.marker
        (tmp_path / leftover_name(marker, "file")).write_text("left")
        point = tmp_path / leftover_name(marker, "mount")
        point.mkdir()
        cgroup = cgroups.detect().parents()[0] / leftover_name(marker, "cgroup")
        cgroup.mkdir()
        proc = subprocess.Popen(["bash", "-c", f"exec -a {leftover_name(marker, 'proc')} sleep 30"])
        try:
            mount_tmpfs(point, 1 << 20, 16, 0, 0)
            for s in trap.listeners:
                with socket.socket(s.family, socket.SOCK_STREAM) as c:
                    addr = s.getsockname()
                    c.connect(("127.0.0.1", addr[1]) if s.family == socket.AF_INET else addr)
            time.sleep(0.1)  # bash's exec
            verdict = {"status": "ok", "reward": 0.0, "passed": False, "details": {"log": leaked[0]}}
            # Looked for beside another escape's nonce, as the escapes are: each finds its own leftovers only.
            other = uuid.uuid4().hex
            traces = host_traces([other, marker.nonce], data_dir)
            found = breaches(trap, traces[marker.nonce], verdict, leaked)
        finally:
            proc.kill()
            proc.wait()
            unmount(point)
            cgroup.rmdir()
    assert traces[other] == [], traces[other]
    for what in ("file ", "process ", "mount ", "cgroup ", "a secret of the data directory"):
        assert any(line.startswith(what) for line in found), (what, found)
    assert sum("accepted a connection" in line for line in found) == len(trap.listeners), found


@pytest.mark.sandbox
async def test_function_escapes_are_held_by_the_judges_box(tmp_path: Path) -> None:
    assert await run_escapes("py-func", tmp_path) == {}


@pytest.mark.sandbox
async def test_kernel_escapes_are_held_by_the_judges_rules_and_box(tmp_path: Path) -> None:
    assert await run_escapes("kernel", tmp_path) == {}


@pytest.mark.sandbox
async def test_shell_escapes_are_held_by_the_episodes_boxes(tmp_path: Path) -> None:
    assert await run_escapes("shell", tmp_path) == {}
