"""SandboxFusion's HTTP API (its server's ``/run_code``, as the ``sandbox-fusion`` 0.3.7 client calls it), served by
farmd (``farmd serve --sandbox-fusion HOST:PORT``).

The same path, request and response bodies and statuses as SandboxFusion, so its client, and the trainers that
call it (veRL's code rewards), switch by changing the endpoint. What stands behind it is farm's: each call runs in
a fresh farm box (no network, farm's memory, CPU, process, disk and output bounds, a scratch directory holding the
call's ``files``), never on the host as SandboxFusion's default isolation ("none") does.

How a call's outcome reads, as in SandboxFusion: ``status`` is ``Success`` when the program exited 0, ``Failed``
for anything the program did (a non-zero exit, a signal, a bound farm killed it for, a timeout), and
``SandboxError`` only when farm itself could not run it (the client retries those). ``run_result.status`` is
``TimeLimitExceeded`` past ``run_timeout`` (``return_code`` None), else ``Finished`` with the exit status, or minus
the signal that ended the program (9 when farm killed the box for a bound: memory, processes, disk, output), as
Python's subprocess (and so SandboxFusion) reports a signal. ``message`` says which bound, when one was hit.

What differs: ``python`` and ``bash`` only (any other language is refused with 422); neither compiles, as in
SandboxFusion, so ``compile_result`` is None and ``compile_timeout`` is checked but unused. ``run_timeout``
and ``memory_limit_MB`` set the box's bounds up to this module's ceilings (above: 422); ``memory_limit_MB``
0 or less (SandboxFusion's "no limit") is farm's default bound. ``files`` and ``fetch_files`` are paths
inside the scratch directory (absolute or ``..`` paths: 422); links the program made are never followed.

Credentials and roles as for the Atropos API: with credentials configured a call carries a ``trainer`` or
``operator`` token, as ``Authorization: Bearer TOKEN`` or as HTTP basic auth whose password is the token, which
is what the sandbox-fusion client sends for an endpoint ``http://NAME:TOKEN@HOST:PORT`` (it sends no headers of
its own). Bodies are bounded before they are read and parsed and written off the event loop; at most
``MAX_RUNNING`` boxes run at once, ``MAX_WAITING`` more calls wait their turn and further calls are refused
with 429 (the client retries).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from aiohttp import web

from farmd.api.auth import OPERATOR, TRAINER, credential_for
from farmd.api.budget import Budgets
from farmd.api.http_site import HttpSite, body_counted
from farmd.config import Credential
from farmd.errors import BodyInvalid, BudgetExhausted, ConfigError, FarmError, IsolationUnavailable
from farmd.sandbox import Sandbox
from farmd.sandbox import result as box
from farmd.sandbox.config import SandboxConfig
from farmd.sandbox.policy import DEFAULT_POLICY, SandboxPolicy

log = logging.getLogger("farmd.api.sandbox_fusion")

MAX_BODY_BYTES = 16 << 20
"""A request as sent: the code, stdin and the base64 of every file together."""
MAX_RUNNING = 4
"""Boxes running calls at once (this API's own, apart from the rollouts' and intake's)."""
MAX_WAITING = 12
"""Calls admitted beyond those running, waiting for a box (each holds its body, so they are few)."""
WARM_BOXES = 2
"""Boxes started ahead of demand: a call's box is ready when it arrives, not launched on its path."""
MAX_RUN_TIMEOUT_S = 60.0
MAX_COMPILE_TIMEOUT_S = 60.0
MAX_MEMORY_MB = 4096
MAX_FILES = 256
"""Entries of ``files``, and of ``fetch_files``."""
MAX_PATH_CHARS = 1024
MAX_FETCH_BYTES = 16 << 20
"""Fetched files' bytes in one reply (before base64); past it the rest are left out and ``message`` says so."""

LANGUAGES = ("python", "bash")
_PROGRAM = {"python": ("_sandbox_fusion_main.py", ("python3",)), "bash": ("_sandbox_fusion_main.sh", ("bash",))}
"""Where the code goes in the scratch directory, and what runs it (as SandboxFusion: ``python FILE``, ``bash FILE``)."""
_STDIN = "_sandbox_fusion_stdin"
_SUPERVISOR = r"""
import os, posix, sys
language, main, stdin = sys.argv[1:4]
KILL = 9  # signal.SIGKILL: importing signal would cost this box 4 ms
me = os.getpid()
real_exit = os._exit
def processes():
    seen = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    seen.add((entry, f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")))
            except OSError:
                seen.add((entry, False))  # ending as it was read
    return seen
def left_behind():
    if os.getpid() != me:
        return
    # Until two looks agree: a process that forks and ends between a look's listing and its reading would
    # hide its child from that look.
    last, left = processes(), 0
    for _ in range(50):
        now = processes()
        if now == last:
            left = sum(running for _, running in now)
            break
        last = now
    else:
        left = len(now)
    if left:
        os.write(2, f"farm: the program left {left} processes running when it ended; they were killed\n".encode())
        os.kill(me, KILL)
if language == "bash":
    # posix_spawn (vfork): no copy of this interpreter's pages, which a fork would make only to exec over them.
    pid = os.posix_spawn("/usr/bin/bash", ["bash", main], os.environ,
                         file_actions=[(os.POSIX_SPAWN_OPEN, 0, stdin, os.O_RDONLY, 0)] if stdin else [])
    _, status = os.waitpid(pid, 0)
    left_behind()
    if os.WIFSIGNALED(status):
        import signal
        if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(me, os.WTERMSIG(status))
        os.kill(me, KILL)  # a signal whose default is not to end a process (SIGCHLD)
    real_exit(os.waitstatus_to_exitcode(status))
def checked(real):
    def call(*args):
        left_behind()
        return real(*args)
    return call
for module in (os, posix):
    for name in ("_exit", "execv", "execve"):
        setattr(module, name, checked(getattr(module, name)))
if stdin:
    fd = os.open(stdin, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
path = os.path.abspath(main)
sys.argv = [main]
sys.path[0] = os.path.dirname(path)
module = type(sys)("__main__")
module.__dict__.update(__builtins__=__builtins__, __file__=path, __cached__=None)
sys.modules["__main__"] = module
code = 0
try:
    with open(main, "rb") as f:
        compiled = compile(f.read(), path, "exec", dont_inherit=True)
except SyntaxError as exc:
    sys.excepthook(type(exc), exc, None)
    code = 1
else:
    try:
        exec(compiled, module.__dict__)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code & 0xFF if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        exc.__traceback__ = exc.__traceback__.tb_next  # the code's traceback starts at its own frame
        sys.excepthook(type(exc), exc, exc.__traceback__)
threading = sys.modules.get("threading")
try:
    if threading is not None:
        threading._shutdown()
    import atexit
    atexit._run_exitfuncs()
except BaseException:
    pass
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        code = code or 120
left_behind()
real_exit(code)
"""
"""The box's program: runs the call's code (python in this already-started interpreter, as SandboxFusion's
``python FILE`` runs it; bash started beside it), stdin from the call's, and ends as the code ended, with its
exit status or its signal. Code that ends while processes it started still run (a fork bomb whose first
process exits 0, a job left in the background) ends killed (-9): those processes would die with the box
unseen, and the call is the caller's failure, never a pass. Python's ways out are each checked (the code's
end, ``sys.exit``, an exception, ``os._exit``, an exec); a process that ends itself through ctypes is not."""
_RESERVED = frozenset({_STDIN, *(name for name, _ in _PROGRAM.values())})
_FIELDS = frozenset({"compile_timeout", "run_timeout", "memory_limit_MB", "code", "stdin", "language", "files",
                     "fetch_files"})

_CALLERS = frozenset({OPERATOR, TRAINER})

_BOUND_NAMES = {box.MEMORY: "memory", box.PIDS: "processes", box.DISK: "scratch disk", box.TMP: "/tmp",
                box.SHM: "/dev/shm", box.OUTPUT: "output", box.SYSCALL: "system calls",
                box.INIT: "the box's own processes"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True, slots=True)
class RunCode:
    """One ``/run_code`` call, checked: every field within its bounds."""

    language: str
    code: bytes
    stdin: bytes | None
    run_timeout_s: float
    compile_timeout_s: float
    memory_mb: int
    """The box's memory bound (farm's default when the call asks for none)."""
    files: Mapping[str, bytes]
    fetch_files: tuple[str, ...]


class SandboxFusionServer:
    """``/run_code`` (and SandboxFusion's ``/v1/ping``) at ``listen``, each call in a box of its own Sandbox."""

    def __init__(self, sandbox: SandboxConfig, listen: str, credentials: Iterable[Credential],
                 budgets: Budgets | None = None) -> None:
        self._site = HttpSite(listen, "SandboxFusion's API", "--sandbox-fusion")
        self._credentials = tuple(credentials)
        self._budgets = budgets or Budgets(self._credentials)
        # A Sandbox of its own (slots are shared with the process's others through their lock files): its boxes
        # are bounded apart from the rollouts', and kept warm in the one shape every call uses.
        self._sandbox = Sandbox(dataclasses.replace(sandbox, warm_boxes=WARM_BOXES,
                                                    max_boxes=MAX_RUNNING + WARM_BOXES))
        self._running = asyncio.Semaphore(MAX_RUNNING)
        self._admitted = 0
        self.counts = {"success": 0, "failed": 0, "sandbox_error": 0}

    @property
    def address(self) -> str:
        return self._site.address

    async def start(self) -> None:
        try:
            await self._sandbox.start()
        except IsolationUnavailable as exc:
            raise ConfigError(f"--sandbox-fusion runs code in farm boxes, and this host cannot isolate one: {exc}") \
                from exc
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("POST", "/run_code", self._guarded(self._run_code))
        app.router.add_route("GET", "/v1/ping", self._guarded(self._ping))
        try:
            await self._site.start(app)
        except BaseException:
            await self._sandbox.close()
            raise

    async def stop(self) -> None:
        await self._site.stop()
        await self._sandbox.close()
        log.info("SandboxFusion API stopped: %(success)d calls succeeded, %(failed)d failed, %(sandbox_error)d "
                 "sandbox errors", self.counts, extra={"event": "sandbox_fusion_stopped", **self.counts})

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            token = _token(request.headers.get("Authorization"))
            if self._credentials:
                caller = credential_for(self._credentials, (("authorization", f"Bearer {token}"),) if token else ())
                if caller is None:
                    return _detail(401, "this farm needs a token: send Authorization: Bearer TOKEN, or use the "
                                        "endpoint http://NAME:TOKEN@HOST:PORT")
                if not caller.roles & _CALLERS:
                    return _detail(403, f"credential {caller.name!r} ({', '.join(sorted(caller.roles))}) may not call "
                                        f"{request.path}: it needs {' or '.join(sorted(_CALLERS))}")
            try:
                async with body_counted(self._budgets, token, request, MAX_BODY_BYTES):
                    return await handler(request)
            except BudgetExhausted as exc:
                return _detail(429, str(exc))
        return guarded

    async def _ping(self, request: web.Request) -> web.StreamResponse:
        return web.json_response("pong")

    async def _run_code(self, request: web.Request) -> web.StreamResponse:
        # Admitted before the body is read: the calls waiting for a box, each holding its body, are bounded.
        if self._admitted >= MAX_RUNNING + MAX_WAITING:
            return _detail(429, f"{MAX_RUNNING} calls are running and {MAX_WAITING} waiting: try again shortly")
        if (request.content_length or 0) > MAX_BODY_BYTES:  # refused on its declared size, nothing read
            return _detail(413, f"a request is at most {MAX_BODY_BYTES} bytes")
        self._admitted += 1
        try:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _detail(413, f"a request is at most {MAX_BODY_BYTES} bytes")
            try:
                call = await asyncio.to_thread(parse_run_code, body)
            except BodyInvalid as exc:
                return web.json_response({"detail": exc.detail()}, status=422)
            del body
            async with self._running:
                reply = await self._run(call)
        finally:
            self._admitted -= 1
        self.counts[{"Success": "success", "Failed": "failed"}.get(reply["status"], "sandbox_error")] += 1
        encoded = await asyncio.to_thread(lambda: json.dumps(reply).encode())
        return web.Response(body=encoded, content_type="application/json")

    async def _run(self, call: RunCode) -> dict[str, Any]:
        name, _ = _PROGRAM[call.language]
        files = {**call.files, name: call.code}
        if call.stdin is not None:
            files[_STDIN] = call.stdin
        argv = ["python3", "-c", _SUPERVISOR, call.language, name, _STDIN if call.stdin is not None else ""]
        policy = _policy(call)
        keep = await asyncio.to_thread(tempfile.mkdtemp, prefix="farm-sandbox-fusion-") if call.fetch_files else None
        try:
            try:
                result = await self._sandbox.run(argv, policy, files=files, keep=Path(keep) if keep else None)
            except (FarmError, OSError) as exc:
                # Nothing the call's code does raises here (its failures are results, its files were checked):
                # farm could not run it.
                log.warning("SandboxFusion call not run: %s", exc, extra={"event": "sandbox_fusion_error"})
                return {"status": "SandboxError", "message": f"farm could not run the code: {exc}",
                        "compile_result": None, "run_result": None, "executor_pod_name": None, "files": {}}
            fetched, left_out = ({}, []) if keep is None else await asyncio.to_thread(
                _fetch, Path(keep), call.fetch_files)
        finally:
            if keep is not None:
                await asyncio.to_thread(shutil.rmtree, keep, True)
        return _reply(result, policy, fetched, left_out)


def _policy(call: RunCode) -> SandboxPolicy:
    """Farm's default box with the call's time and memory: mounts as the warm boxes' (so one is ready)."""
    return DEFAULT_POLICY.with_overrides(wall_time_s=call.run_timeout_s, cpu_time_s=call.run_timeout_s,
                                         memory_mb=call.memory_mb)


def _reply(result: box.BoxResult, policy: SandboxPolicy, fetched: dict[str, str],
           left_out: list[str]) -> dict[str, Any]:
    timed_out = result.timed_out or box.WALL_TIME in result.violations or box.CPU_TIME in result.violations
    bounds = [_BOUND_NAMES[v] for v in result.violations if v in _BOUND_NAMES]
    return_code = None if timed_out else (
        result.exit_code if result.exit_code is not None else -(result.signal or 9))
    if bounds and return_code == 0:
        # The box was killed at a bound after the program exited 0 (a fork bomb's parent, whose children went
        # on): the call failed, and a 0 would read as a pass to whoever looks only at return_code.
        return_code = -9
    notes = []
    if bounds:
        notes.append(f"farm killed the program at its {bounds[0]} bound"
                     + (f" ({policy.memory_mb} MiB)" if bounds[0] == "memory" else
                        f" ({policy.output_kb} KiB per stream)" if bounds[0] == "output" else ""))
    if left_out:
        notes.append(f"fetched files past {MAX_FETCH_BYTES} bytes left out: {', '.join(left_out)[:500]}")
    run_result = {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": round(result.wall_s, 6),
        "return_code": return_code,
        "stdout": result.stdout.decode("utf-8", errors="replace"),
        "stderr": result.stderr.decode("utf-8", errors="replace"),
    }
    return {"status": "Success" if return_code == 0 else "Failed", "message": "; ".join(notes),
            "compile_result": None, "run_result": run_result, "executor_pod_name": None, "files": fetched}


def _fetch(kept: Path, wanted: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """The wanted files among those harvested (regular files only, as SandboxFusion's ``isfile``), base64'd;
    and those left out past ``MAX_FETCH_BYTES``. A path the program did not leave is absent, as there."""
    out: dict[str, str] = {}
    left_out: list[str] = []
    total = 0
    for rel in wanted:
        fd = _open_beneath(kept, rel)
        if fd is None:
            continue
        with open(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if total + size > MAX_FETCH_BYTES:
                left_out.append(rel)
                continue
            data = f.read(size + 1)[:size]
        total += len(data)
        out[rel] = base64.b64encode(data).decode("ascii")
    return out, left_out


def _open_beneath(root: Path, rel: str) -> int | None:
    """A descriptor of regular file ``rel`` under ``root``, every component opened without following a link."""
    parts = PurePosixPath(rel).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = child
        try:
            found = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(found).st_mode):
            os.close(found)
            return None
        return found
    finally:
        os.close(fd)


# -- the request -------------------------------------------------------------------------------------


def parse_run_code(body: bytes) -> RunCode:
    """Check a ``/run_code`` body (blocking: run it off the event loop); raises ``BodyInvalid`` saying where."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, an integer of too many digits, nesting
        raise BodyInvalid([], f"not a JSON object: {str(exc)[:200]}") from None
    if not isinstance(raw, dict):
        raise BodyInvalid([], "the body must be a JSON object")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        # SandboxFusion's model ignores them; naming them here catches a misspelt bound (memory_limit_mb).
        raise BodyInvalid([str(unknown[0])[:100]], f"unknown field; known: {', '.join(sorted(_FIELDS))}")
    language = raw.get("language")
    if language not in LANGUAGES:
        raise BodyInvalid(["language"], f"farm runs {' and '.join(LANGUAGES)}, not {str(language)[:50]!r}")
    code = _text(raw, "code", required=True)
    assert code is not None
    stdin = _text(raw, "stdin")
    run_timeout = _seconds(raw, "run_timeout", MAX_RUN_TIMEOUT_S)
    compile_timeout = _seconds(raw, "compile_timeout", MAX_COMPILE_TIMEOUT_S)
    memory = raw.get("memory_limit_MB", -1)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory > MAX_MEMORY_MB or memory < -(1 << 31):
        raise BodyInvalid(["memory_limit_MB"], f"an integer of megabytes up to {MAX_MEMORY_MB} "
                                            "(0 or less: farm's default bound)")
    files_raw = raw.get("files", {})
    if not isinstance(files_raw, dict) or len(files_raw) > MAX_FILES:
        raise BodyInvalid(["files"], f"an object of at most {MAX_FILES} paths to base64 content")
    files: dict[str, bytes] = {}
    for path, content in files_raw.items():
        _path(["files", path[:200]], path)
        if content is None:
            continue  # SandboxFusion writes only string contents
        if not isinstance(content, str):
            raise BodyInvalid(["files", path[:200]], "base64 content as a string")
        try:
            files[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise BodyInvalid(["files", path[:200]], "not valid base64") from None
    _fits(files)
    fetch_raw = raw.get("fetch_files", [])
    if not isinstance(fetch_raw, list) or len(fetch_raw) > MAX_FILES:
        raise BodyInvalid(["fetch_files"], f"a list of at most {MAX_FILES} paths")
    for i, path in enumerate(fetch_raw):
        _path(["fetch_files", i], path)
    return RunCode(language=language, code=code, stdin=stdin, run_timeout_s=run_timeout,
                   compile_timeout_s=compile_timeout,
                   memory_mb=memory if memory > 0 else DEFAULT_POLICY.memory_mb, files=files,
                   fetch_files=tuple(dict.fromkeys(fetch_raw)))


def _fits(files: Mapping[str, bytes]) -> None:
    """The files can all be written: none is another's directory, and with their directories they fit the scratch
    directory's inodes (what does not fit is the caller's mistake, told now, not a box that cannot start)."""
    dirs = {str(parent) for path in files for parent in PurePosixPath(path).parents if str(parent) != "."}
    clash = sorted(dirs & {str(PurePosixPath(p)) for p in files})
    if clash:
        raise BodyInvalid(["files", clash[0][:200]], "both a file and another file's directory")
    if len(dirs) + len(files) > DEFAULT_POLICY.disk_inodes // 2:
        raise BodyInvalid(["files"], f"at most {DEFAULT_POLICY.disk_inodes // 2} files and directories together")


def _text(raw: dict[str, Any], name: str, *, required: bool = False) -> bytes | None:
    value = raw.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise BodyInvalid([name], "a string" + ("" if required else " or null"))
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyInvalid([name], "not valid UTF-8 (a lone surrogate)") from None


def _seconds(raw: dict[str, Any], name: str, ceiling: float) -> float:
    value = raw.get(name, 10)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= ceiling:
        raise BodyInvalid([name], f"seconds, more than 0 and at most {ceiling:g}")
    return float(value)


def _path(loc: list[str | int], path: object) -> None:
    """A path inside the scratch directory: relative, no ``..``, no NUL, not one of this module's own names."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise BodyInvalid(loc, f"a non-empty path of at most {MAX_PATH_CHARS} characters")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or not parts or any(p in ("..", ".") for p in path.split("/") if p) \
            or path.endswith("/"):
        raise BodyInvalid(loc, "a relative path inside the scratch directory, without '..'")
    if parts[0] in _RESERVED:
        raise BodyInvalid(loc, f"{parts[0]!r} is where farm puts the code or stdin")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyInvalid(loc, "not valid UTF-8 (a lone surrogate)") from None


# -- replies -----------------------------------------------------------------------------------------


def _token(header: str | None) -> str | None:
    """The token a call carries: ``Bearer TOKEN``, or basic auth's password (an endpoint ``http://NAME:TOKEN@``)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        with contextlib.suppress(binascii.Error, ValueError, UnicodeDecodeError):
            password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
            return password or None
    return None


def _detail(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)
