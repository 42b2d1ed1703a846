"""The box's init: runs inside every box, started before the program is known.

This file is not imported by farm. It is compiled once by the box's own Python
and handed to each box as a code object on a descriptor (``runtime.BOOTSTRAP``),
so it imports only the standard library and nothing of farm's. It forks at once; the child waits on the control socket for one request and
becomes the program, the init reports the child's exact wait status and rusage
(bwrap alone would fold a signal into an exit code of 128+N).

A Python program runs in the forked child of this already-started interpreter
instead of a fresh exec, which is what lets a box started ahead of demand reach
the program's first line in about a millisecond. Anything this emulation does
not cover exactly (unusual interpreter flags, PYTHON* variables that must act
at start-up) is exec'd as usual.

One message per SOCK_SEQPACKET datagram. In, from the host (trusted), marshal:
{"argv", "env", "cwd", "rlimits", "watch"}. Out, JSON written by hand (importing
json costs 8 ms of start-up through re and enum): {"event": "started", "pid"},
{"event": "full", "mount"} when a watched tmpfs fills up, {"event": "exit",
"status", "maxrss_kb", "full"}.
"""

import gc
import marshal
import os
import resource
import sys

# Types only for the checker: no ``typing`` (or ``__future__``) import runs in the box. mypy takes any
# name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from types import FrameType
    from typing import Any, NoReturn
else:
    import _signal as signal  # signal's Python wrapper would import enum: milliseconds of every start

_PYTHONS = {"python", "python3", "python3.11", "/usr/bin/python", "/usr/bin/python3", "/usr/bin/python3.11",
            "/bin/python3"}
_INPROC_FLAGS = set("uBEsSIqP")
_INPROC_ENV = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONSAFEPATH"}
_WATCH_INTERVAL_S = 0.05


def _json(value: "Any") -> str:
    if isinstance(value, bool) or value is None:
        return "true" if value else ("false" if value is False else "null")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(c if c.isalnum() or c in "/._-" else "?" for c in value) + '"'
    if isinstance(value, list):
        return "[" + ",".join(_json(v) for v in value) + "]"
    return "{" + ",".join(_json(k) + ":" + _json(v) for k, v in value.items()) + "}"


def _send(ctrl: int, message: "dict[str, Any]") -> None:
    try:
        os.write(ctrl, _json(message).encode())
    except OSError:
        pass


def _full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 4096 or st.f_favail == 0


def _python_plan(argv: list[str], env: dict[str, str]) -> "tuple[str, str, list[str], set[str]] | None":
    """How to run ``argv`` in-process, or None to exec it."""
    if not argv or argv[0] not in _PYTHONS:
        return None
    if any(k.startswith("PYTHON") and k not in _INPROC_ENV for k in env):
        return None
    flags: set[str] = set()
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "-m"):
            if i + 1 >= len(argv):
                return None
            return (arg[1], argv[i + 1], argv[i + 2:], flags)
        if arg == "-" or arg == "--":
            return None
        if arg.startswith("-"):
            letters = set(arg[1:])
            if not letters or not letters <= _INPROC_FLAGS:
                return None
            flags |= letters
            i += 1
            continue
        return ("s", arg, argv[i + 1:], flags)
    return None  # an interactive interpreter: exec it


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def _finish(code: int) -> "NoReturn":
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout and code == 0:
                code = 120
    os._exit(code)


def _run_python(plan: "tuple[str, str, list[str], set[str]]", env: dict[str, str]) -> "NoReturn":
    kind, target, rest, flags = plan
    isolated = bool(flags & set("IP")) or env.get("PYTHONSAFEPATH")
    ignore_env = bool(flags & set("IE"))
    if "u" in flags or (env.get("PYTHONUNBUFFERED") and not ignore_env):
        import io

        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True,
                                      encoding=sys.stdout.encoding, errors=sys.stdout.errors)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      encoding=sys.stderr.encoding, errors="backslashreplace")
    sys.dont_write_bytecode = True
    # The init runs on an execute-only copy of the interpreter; the program sees the usual one.
    sys.executable = sys._base_executable = "/usr/bin/python3"  # type: ignore[attr-defined]
    extra = [] if ignore_env else [p for p in env.get("PYTHONPATH", "").split(":") if p]
    base = [p for p in sys.path if p not in extra]
    if kind == "c":
        first = [] if isolated else [""]
        sys.argv = ["-c", *rest]
    elif kind == "m":
        first = [] if isolated else [os.getcwd()]
        sys.argv = ["-m", *rest]
    else:
        first = [] if isolated else [os.path.dirname(os.path.realpath(target))]
        sys.argv = [target, *rest]
    sys.path[:] = first + extra + base

    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        if kind == "m":
            import runpy

            runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]
        else:
            source: str | bytes  # a local's annotation is never evaluated
            if kind == "c":
                source, filename = target, "<string>"
            else:
                filename = os.path.abspath(target)  # as Python 3.9+ does for a script
                main.__dict__["__file__"] = filename
                main.__dict__["__cached__"] = None
                with open(target, "rb") as fh:
                    source = fh.read()
            compiled = compile(source, filename, "exec", dont_inherit=True)
            exec(compiled, main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        tb = exc.__traceback__
        if tb is not None:
            # Drop this function's frame: the program's traceback starts at its own code.
            exc.__traceback__ = tb = tb.tb_next
        try:
            sys.excepthook(type(exc), exc, tb)
        except BaseException:
            pass
    _finish(code)


_UNIGNORED = ("SIGHUP", "SIGINT", "SIGQUIT")
"""Signals a host ignores by how farmd was started (a background job of a shell without job control ignores
SIGINT and SIGQUIT; nohup, SIGHUP), which an exec would hand the box's program: it starts with them at
their defaults instead, the same whatever shell started farmd."""


def _child(request: "dict[str, Any]", ctrl: int) -> "NoReturn":
    os.close(ctrl)
    for name in _UNIGNORED:
        number = getattr(signal, name)
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, signal.SIG_DFL)
    for name, (soft, hard) in request.get("rlimits", {}).items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError, AttributeError) as exc:
            os.write(2, f"farm box: cannot set {name}: {exc}\n".encode())
            os._exit(125)
    env = request["env"]
    argv = request["argv"]
    try:
        os.chdir(request.get("cwd", "/"))
    except OSError as exc:
        os.write(2, f"farm box: cannot enter {request.get('cwd')}: {exc}\n".encode())
        os._exit(125)
    # The init was started with the box's environment, so usually there is nothing to do;
    # touching os.environ costs a fork child ~0.5 ms of copy-on-write faults.
    if dict(os.environ) != env:
        for name in [k for k in os.environ if k not in env]:
            del os.environ[name]
        for name, value in env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
    gc.unfreeze()
    plan = _python_plan(argv, env)
    if plan is not None and not (plan[0] == "s" and not os.path.isfile(plan[1])):
        _run_python(plan, env)
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        os.write(2, f"farm box: {argv[0]}: command not found\n".encode())
        os._exit(127)
    except OSError as exc:
        os.write(2, f"farm box: {argv[0]}: {exc.strerror}\n".encode())
        os._exit(126)


def _wait_for_program(ctrl: int, released: int) -> "NoReturn":
    """The pre-forked child: wait for the request, tell the host and the init, become the program."""
    try:
        message = os.read(ctrl, 1 << 24)
    except OSError:
        message = b""
    if not message:
        os._exit(0)  # the host gave this box up before using it
    request = marshal.loads(message)
    _send(ctrl, {"event": "started", "pid": os.getpid()})
    os.write(released, marshal.dumps(request.get("watch", [])))
    os.close(released)
    _child(request, ctrl)


def main() -> None:
    ctrl = int(sys.argv[2])
    os.closerange(3, ctrl)
    os.closerange(ctrl + 1, 1 << 16)
    # A core limit of exactly 1 keeps every crash in the box from the host's core-dump helper
    # and from writing a core file. Set here, before the program's process is forked, it is
    # every box process's; the seccomp filter lets no process but pid 1 (this one) change it.
    resource.prlimit(1, resource.RLIMIT_CORE, (1, 1))
    # Fork before the request arrives: the fork is then off the request's path, and the
    # program starts the moment its request is read.
    released_r, released_w = os.pipe()
    # The compiler's first use costs ~1 ms (its tables faulting in): pay it before the fork,
    # once, so the program does not.
    compile("pass", "<warm-up>", "exec", dont_inherit=True)
    # Everything alive now is shared with the child copy-on-write; keep the collector from
    # walking (and so copying) it. The child unfreezes before the program runs.
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(released_r)
            _wait_for_program(ctrl, released_w)
        finally:
            os._exit(125)
    os.close(released_w)
    message = os.read(released_r, 1 << 20)
    os.close(released_r)
    watch = marshal.loads(message) if message else []
    reported = set()

    def check_mounts(signum: int, frame: "FrameType | None") -> None:
        for path in watch:
            if path not in reported and _full(path):
                reported.add(path)
                _send(ctrl, {"event": "full", "mount": path})

    # wait4 blocks; the timer's handler runs between its retries (PEP 475). Timers are
    # not inherited across fork, so the program never sees this one.
    if watch:
        signal.signal(signal.SIGALRM, check_mounts)
        signal.setitimer(signal.ITIMER_REAL, _WATCH_INTERVAL_S, _WATCH_INTERVAL_S)
    _, status, usage = os.wait4(pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    full = [p for p in watch if _full(p)]
    _send(ctrl, {"event": "exit", "status": status, "maxrss_kb": usage.ru_maxrss, "full": full})
    os._exit(0)


main()
