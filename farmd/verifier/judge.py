"""The judge: runs hidden tests against a submission, inside a box. Standard library only.

Started as ``python3 -I -S -B /box/.judge/judge.py`` in a fresh box that holds only
the submission (``/box/submission.py``) and this judge's spec. The judge is two
processes:

- the **recorder** (this process) forks the runner first, then reads the spec (test
  inputs, a nonce, for kernels the reference's source) and deletes it, so no runner's
  memory ever held it; it feeds the runner one test at a time, timing each call from
  the outside. It alone writes the box's stdout: nonce-tagged JSON records, one per
  line. It is not dumpable (a fork of the box's init), so no process of the box can
  read its memory (the nonce, the inputs still to come) or rewrite it.
- the **runner** (the child) has its stdout and stderr sent to a log file and every
  other descriptor closed, imports the submission and answers each request with the
  result serialized to canonical JSON under exact builtin type checks (a list
  subclass or an object with a lying ``__eq__`` is refused, not compared). It never
  sees an expected output: those never enter a box, and the verdict is computed on
  the host.

The runner runs the attempt's code, so everything it says is only a claimed value
per test id. Claims are checked by the recorder for form (the id asked, once; every
field of the reply of the type and size a runner sends, since the submission can
write any frame it likes into the runner's pipe) and by the host for truth. An exit,
a signal, a hang, a missing, duplicate or garbled answer is a failure of that test.

Before any runner exists, a child of the recorder compiles the submission (and, with
``rules`` in the head, checks its source against them): whatever compiling does, a
RecursionError, a MemoryError, the box's memory bound, is reported as the
submission's failure, and a refused source never runs. With ``rules``, each runner
also installs an audit hook before any of the code runs (``_confine``): what a
kernel never needs (files, processes, threads, ctypes, frames, new modules...) is
refused and fails every test from then on.

With a reference (kernels), two runners are alive together. The reference's answers
the untimed tests alone, before the submission's has loaded anything; then the timed
tests are rounds, both runners answering the same fresh input one after the other,
in alternating order, each call preceded by an echo: arrays of the same size, the
previous test's, in and out (only the reference's echo is recorded: it measures what
a call costs besides the function). Each call is timed from here twice: wall time,
and the CPU time the runner spent on it (its process CPU clock, which time spent
preempted does not move). All three processes share one CPU. A reference that stops
answering once the submission is loaded was stopped by it; the host reads it so.
The final record counts the CPU time of this process and the reaped runners, for
the host to hold against the box's own count.

Modes: ``call`` (JSON arguments in, canonical JSON value out) and ``array`` (raw
numpy arrays in and out, for kernels; the runner imports numpy).
"""

import json
import os
import resource
import select
import signal
import struct
import sys
import time

# Types only for the checker: no ``typing`` (or ``__future__``) import runs in the box. mypy takes any
# name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn

    Record = dict[str, Any]

SPEC_DIR = "/box/.judge"
SUBMISSION = "/box/submission.py"
AGENT_LOG = "/tmp/.judge-agent.log"
_MAX_FRAME = 64 * 1024 * 1024
_MAX_DEPTH = 64
_MAX_ITEMS = 1_000_000
_LOG_TAIL = 2048


# -- canonical values (shared with the host: farmd.verifier.canon imports these) -----------------

class NotCanonical(Exception):
    pass


_NONE_TYPE = type(None)


def canon(value: "Any", _type: "Any" = type, _int: "Any" = int, _bool: "Any" = bool, _str: "Any" = str,
          _float: "Any" = float, _list: "Any" = list, _tuple: "Any" = tuple, _none: "Any" = _NONE_TYPE,
          _repr: "Callable[[float], str]" = float.__repr__) -> "Any":
    """A JSON-ready copy of ``value`` built only from exact builtin types, or NotCanonical.

    float and tuple are tagged (``{"f": repr}``, ``{"t": [...]}``) so that NaN, inf
    and the list/tuple distinction survive JSON. The builtins are bound when the
    judge loads, before the submission can patch them.
    """
    budget = [_MAX_ITEMS]

    def walk(v: "Any", depth: int) -> "Any":
        budget[0] -= 1
        if budget[0] < 0:
            raise NotCanonical("the value is too large")
        if depth > _MAX_DEPTH:
            raise NotCanonical("the value is nested too deeply")
        t = _type(v)
        if t is _bool or t is _none or t is _str:
            return v
        if t is _int:
            return v
        if t is _float:
            return {"f": _repr(v)}
        if t is _list:
            return [walk(x, depth + 1) for x in v]
        if t is _tuple:
            return {"t": [walk(x, depth + 1) for x in v]}
        raise NotCanonical(f"values of type {t.__module__}.{t.__qualname__} are not accepted "
                           "(only bool, int, float, str, list, tuple, None)")

    return walk(value, 0)


# -- framing ----------------------------------------------------------------------------------

def _write_frame(fd: int, header: "Record", body: "bytes | memoryview" = b"") -> None:
    # The body goes from where it lies straight into the pipe (no joined copy): each copy would be
    # timed as part of the call, for arrays of a MiB.
    head = json.dumps(header).encode()
    parts = [memoryview(struct.pack(">II", len(head), len(body)) + head), memoryview(body)]
    while parts:
        n = os.writev(fd, parts)
        while parts and n >= len(parts[0]):
            n -= len(parts[0])
            parts.pop(0)
        if parts:
            parts[0] = parts[0][n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytearray:
    buf = bytearray(n)  # read in place: no chunks to join, one copy fewer inside a timed call
    view = memoryview(buf)
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        got = os.readv(fd, [view])
        if not got:
            raise EOFError
        view = view[got:]
    return buf


def _read_frame(fd: int, deadline: float | None = None) -> "tuple[Any, bytes | bytearray]":
    head_len, body_len = struct.unpack(">II", _read_exact(fd, 8, deadline))
    if head_len > _MAX_FRAME or body_len > _MAX_FRAME:
        raise ValueError("frame too large")
    try:
        header = json.loads(_read_exact(fd, head_len, deadline))
    except (RecursionError, MemoryError):  # a forged header nested too deeply is garbled, not a crash
        raise ValueError("frame garbled") from None
    body = _read_exact(fd, body_len, deadline) if body_len else b""
    return header, body


# -- the runner (child): runs the submission ----------------------------------------------------

def _runner(head: "Record", req_r: int, resp_w: int) -> "NoReturn":
    """The child. It waits for "go" (with the reference's source, for a reference runner),
    then loads the code and answers requests until its pipe closes."""
    mode = head["mode"]
    try:
        go, _ = _read_frame(req_r)
    except (EOFError, OSError, ValueError):
        os._exit(0)
    source = go.get("source")
    log = os.open(AGENT_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    keep = sorted({0, 1, 2, req_r, resp_w})
    for lo, hi in zip(keep, [*keep[1:], 1 << 16], strict=True):
        os.closerange(lo + 1, hi)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    np: Any = sys.modules.get("numpy")  # array mode: imported by the recorder before any fork
    ndarray = np.ndarray if np is not None else None
    frombuffer: Any = np.frombuffer if np is not None else None
    dumps = json.dumps
    import _thread

    threads = _thread._count  # bound before the code runs: threads it started, alive
    broken: list[str] = []  # the first rule the code broke, if it broke one; it fails every test from then on
    rules = head.get("rules")
    confine = (lambda: _confine(rules, broken)) if rules else None

    def rule_broken() -> str | None:
        if not broken and rules and threads():
            broken.append("starts a thread: kernels run on the caller's thread only")
        return f"{RULE_BROKEN}: {broken[0]}" if broken else None

    try:
        fn = _load_submission(head["entry_point"], source, confine)
    except _Unparseable as exc:
        _import_failed(req_r, resp_w, f"does not compile: {exc}")
    except BaseException as exc:  # SystemExit at import is an answer too: a failure
        _import_failed(req_r, resp_w, rule_broken() or _describe(exc))
    if why := rule_broken():
        _import_failed(req_r, resp_w, why)
    while True:
        try:
            header, body = _read_frame(req_r)
        except (EOFError, OSError, ValueError):
            os._exit(0)
        test_id = header["id"]
        try:
            if mode == "call":
                args = header["args"]
                before = dumps(canon(args))
                result = fn(*args)
                value = dumps(canon(result))
                if dumps(canon(args)) != before:
                    broken.append(MODIFIED_ARGUMENT)
                    raise _RuleBroken
                _write_frame(resp_w, {"id": test_id, "ok": True, "value": value})
            else:
                arrays = []
                spans = []
                offset = 0
                for dtype, shape in header["arrays"]:
                    count = 1
                    for d in shape:
                        count *= d
                    arr = frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape).copy()
                    spans.append((dtype, list(shape), offset, offset + arr.nbytes))
                    offset += arr.nbytes
                    arrays.append(arr)
                # An echo (timed on the reference's runner; the submission's gets one too, untimed,
                # for symmetry) measures what a call costs besides the function itself: decoding
                # the inputs, encoding an output of the same size.
                out = np.empty(header["echo"][1], dtype=header["echo"][0]) if "echo" in header else fn(*arrays)
                if rule_broken():
                    raise _RuleBroken
                if type(out) is not ndarray:
                    raise NotCanonical(f"returned {type(out).__module__}.{type(out).__qualname__}, "
                                       "not a numpy.ndarray")
                # Every call, echoes too, compares its inputs with the bytes sent: the same cost on
                # the reference's side as on the submission's, and an echo takes it off both.
                for arr, (dtype, shape, start, end) in zip(arrays, spans, strict=True):
                    sent = body if start == 0 and end == len(body) else body[start:end]
                    if arr.dtype.str != dtype or list(arr.shape) != shape or arr.tobytes() != sent:
                        broken.append(MODIFIED_ARGUMENT)
                        raise _RuleBroken
                data = memoryview(out).cast("B") if out.size and out.flags.c_contiguous else out.tobytes(order="C")
                _write_frame(resp_w, {"id": test_id, "ok": True, "dtype": out.dtype.str,
                                      "shape": list(out.shape)}, data)
        except BaseException as exc:  # every way of not answering is a failed test
            if isinstance(exc, SystemExit):
                os._exit(0)  # an exit mid-test: the recorder sees the pipe close
            _write_frame(resp_w, {"id": test_id, "ok": False, "error": rule_broken() or _describe(exc)})


def _import_failed(req_r: int, resp_w: int, error: str) -> "NoReturn":
    """Say why the code could not be loaded, then wait for the recorder to hang up: a runner gone
    before the first request is written would leave the recorder an error on its write instead of
    this answer."""
    try:
        _write_frame(resp_w, {"import_error": error})
        while True:
            _read_frame(req_r)
    except BaseException:
        pass
    os._exit(0)


class _Unparseable(Exception):
    pass


class _RuleBroken(Exception):
    pass


def _load_submission(entry_point: str, source: "str | bytes | None" = None,
                     confine: "Callable[[], None] | None" = None) -> "Callable[..., Any]":
    """The function ``entry_point`` of the submission (or of the reference's ``source``). The code is
    compiled first, then ``confine`` (if any) sets the rules, and only then does any of it run."""
    if source is None:
        with open(SUBMISSION, "rb") as fh:
            source = fh.read()
        name, filename = "submission", SUBMISSION
    else:
        name, filename = "reference", "<reference>"
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except Exception as exc:  # SyntaxError, and RecursionError or MemoryError on a long or deep expression
        raise _Unparseable(_describe(exc)) from None
    module = type(sys)(name)
    module.__file__ = filename
    sys.modules[name] = module
    if confine is not None:
        confine()
    exec(code, module.__dict__)
    fn: Callable[..., Any] | None = getattr(module, entry_point, None)
    if not callable(fn):
        raise AttributeError(f"the submission defines no function {entry_point!r}")
    return fn


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    except BaseException:  # a hostile __str__
        return "an exception that cannot be described"


# -- rules of confined code (kernels): checked in the source, then enforced while it runs --------

RULE_BROKEN = "RuleBroken"
"""How a runner's error (or import error) begins when the code broke a rule of its task."""
MODIFIED_ARGUMENT = "the function modified its argument, which its task forbids"
"""Every task of a judge's says so: the rule broken by a call whose arguments differ after it."""

_DYNAMIC_NAMES = frozenset({
    "__import__", "exec", "eval", "compile", "open", "globals", "locals", "vars", "breakpoint", "getattr",
    "setattr", "delattr", "dir", "input", "help", "memoryview", "exit", "quit",
})
# Modules that numpy's own modules hold as attributes (np.lib.format.os, ...): the way from numpy
# to the interpreter and the system without an import statement. A kernel computes; it needs none.
_SYSTEM_ATTRS = frozenset({
    "os", "sys", "posix", "subprocess", "ctypes", "threading", "multiprocessing", "concurrent", "asyncio",
    "builtins", "importlib", "gc", "inspect", "signal", "socket", "mmap", "resource", "pickle", "marshal",
    "io", "shutil", "tempfile", "pathlib", "time", "types", "weakref", "atexit", "faulthandler", "fcntl",
    "pty", "platform", "sysconfig", "site", "runpy", "code", "codeop", "pdb", "traceback", "linecache",
    "tracemalloc", "zipimport", "pkgutil", "modules", "f2py",
})
_PUBLIC_DUNDERS = frozenset({"__name__", "__init__"})


def _name_problem(name: str) -> str | None:
    """Why confined code may not use ``name`` as an attribute or an imported name, or None."""
    if name.startswith("__") and name.endswith("__"):
        if name in _PUBLIC_DUNDERS:
            return None
        return f"uses {name}: kernels may not reach into the interpreter's internals"
    if name in _SYSTEM_ATTRS:
        return f"reaches for {name}: kernels may use numpy and math, not the interpreter or the system"
    if name.startswith("_"):
        return f"uses the private name {name}: kernels may use numpy's public API only"
    return None


def rule_problem(tree: "ast.AST", imports: "frozenset[str]") -> str | None:
    """Why a parsed source breaks the rules of confined code, or None: imports beyond ``imports``,
    dynamic code and computed attributes, the interpreter's internals, modules reached through other
    modules' attributes. The first line of the rules, with the clearest message; what it cannot see
    (a name computed at run time) the audit hook of ``_confine`` refuses when it happens."""
    import ast

    for node in ast.walk(tree):  # iterative: no depth of the tree can make it fail
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] if node.level == 0 else ["(relative import)"]
        for name in modules:
            if name.split(".")[0] not in imports:
                if "reference" in name.lower():
                    return f"imports {name}: calling the reference gets nothing"
                return f"imports {name}: only {' and '.join(sorted(imports))} may be imported"
            for part in name.split(".")[1:]:
                why = _name_problem(part)
                if why is not None:
                    return why
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                why = _name_problem(alias.name)
                if why is not None:
                    return why
        if isinstance(node, ast.Name):
            if node.id in _DYNAMIC_NAMES:
                return f"uses {node.id}, which kernels may not"
            if node.id.startswith("__") and node.id.endswith("__") and node.id not in _PUBLIC_DUNDERS:
                return f"uses {node.id}: kernels may not reach into the interpreter's internals"
        elif isinstance(node, ast.Attribute):
            why = _name_problem(node.attr)
            if why is not None:
                return why
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            if value.startswith("__") and value.endswith("__") and value not in _PUBLIC_DUNDERS:
                return f"uses {value}: kernels may not reach into the interpreter's internals"
    return None


# Audit events plain numpy computing raises (measured: every kernel reference, and numpy loading a
# submodule such as numpy.fft or numpy.ma on first use): running code, never reaching outside.
_QUIET_EVENTS = frozenset({"exec", "compile", "marshal.loads", "builtins.id", "object.__delattr__"})
# numpy's dispatch decorator reads these of every function of a submodule it loads lazily.
_READABLE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})


def audit_refusal(event: str, args: "tuple[Any, ...]", imports: "frozenset[str]", readable: "Iterable[str]",
                  _isinstance: "Any" = isinstance, _str: "Any" = str, _bytes: "Any" = bytes, _int: "Any" = int,
                  _len: "Any" = len, _normpath: "Any" = os.path.normpath,
                  _fsdecode: "Any" = os.fsdecode) -> str | None:
    """Why confined code must not do what raised audit ``event`` (with ``args``), or None when it may.

    An allow-list: what plain numpy raises passes, everything else (files, processes, signals, sockets,
    ctypes, frames, the garbage collector's heap, new modules, more audit hooks...) is refused.
    ``readable``: paths it may open read-only (numpy's own files for its lazy submodules, the
    submission's source for a warning's line); a name ending in "/" stands for what lies under it.
    """
    if event in _QUIET_EVENTS:
        return None
    if event == "object.__getattr__":
        name: Any = args[1] if _len(args) > 1 else None
        return None if name in _READABLE_ATTRS else f"reads {_str(name)[:40]}: kernels may not inspect frames"
    if event == "object.__setattr__":
        name = args[1] if _len(args) > 1 else None
        return None if name != "__code__" else "replaces a function's code: kernels may not"
    if event == "import":
        name = args[0] if args else None
        if _isinstance(name, _str) and name.partition(".")[0] in imports:
            return None
        return f"imports {_str(name)[:80]} at run time: only {' and '.join(sorted(imports))} may be imported"
    if event in ("open", "os.listdir", "os.scandir"):
        path = args[0] if args else None
        if _isinstance(path, _bytes):
            path = _fsdecode(path)
        writes = False
        if event == "open":
            mode: Any = args[1] if _len(args) > 1 else None
            flags = args[2] if _len(args) > 2 else 0
            writes = (_isinstance(mode, _str) and any(c in mode for c in "wax+")) \
                or not _isinstance(flags, _int) or (flags & 0o3) != 0 or (flags & 0o1000) != 0  # O_CREAT
        if _isinstance(path, _str) and not writes:
            path = _normpath(path)
            for allowed in readable:
                if path == allowed or (allowed.endswith("/") and path.startswith(allowed)):
                    return None
        return f"opens {_str(path)[:80]}: kernels may not open files"
    if event.startswith("ctypes."):
        return f"calls into C through ctypes ({event}): kernels may not"
    return f"does what raises the audit event {event}: kernels may not"


def _confine(rules: "Record", broken: list[str]) -> None:
    """Set the rules for the rest of this process's life: an audit hook (which nothing can remove)
    refuses what ``audit_refusal`` refuses, and notes the first refusal in ``broken``: the test
    fails even if the code catches the error."""
    imports = frozenset(rules.get("imports", ()))
    paths = [SUBMISSION]
    np = sys.modules.get("numpy")
    np_file = getattr(np, "__file__", None) if np is not None else None
    if np_file:
        paths.append(os.path.dirname(os.path.normpath(np_file)) + "/")
    readable = tuple(paths)
    refusal = audit_refusal

    def refuse(why: str) -> "NoReturn":
        if not broken:
            broken.append(why)
        raise PermissionError(f"{RULE_BROKEN}: {why}")

    def hook(event: str, args: "tuple[Any, ...]") -> None:
        why = refusal(event, args, imports, readable)
        if why is not None:
            refuse(why)

    def no_threads(*args: "Any", **kwargs: "Any") -> "NoReturn":
        refuse("starts a thread: kernels run on the caller's thread only")

    # Python 3.11 raises no audit event for a new thread: the only ways to one (threading is not
    # loaded, and loading it is refused) go through _thread, whose entry points refuse from now on.
    # A thread that got past them anyway is counted after every call (see _runner).
    import _thread

    _thread.start_new_thread = _thread.start_new = no_threads
    # Warnings stay on: one shown for the submission's line opens its source, which is readable.
    sys.addaudithook(hook)


# -- the submission's source, checked before any of it runs ------------------------------------

_CHECK_S = 20.0


def source_problem(source: "str | bytes", rules: "Record | None" = None) -> "Record | None":
    """Why ``source`` (bytes or text) must not run at all, as a record for the host, or None.

    ``{"kind": "unparseable", "error": ...}``: it cannot be compiled, whichever way compiling fails
    (a SyntaxError, a RecursionError on a long expression, a MemoryError on a deep one);
    ``{"kind": "refused", "why": ...}``: it breaks ``rules["imports"]`` and the rest of
    ``rule_problem`` (when ``rules`` asks for the static check, as it does unless ``"static"`` is
    false). Runs nothing of the source.
    """
    try:
        if rules and rules.get("static", True):
            import ast

            tree: Any = compile(source, SUBMISSION, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            why = rule_problem(tree, frozenset(rules.get("imports", ())))
            if why is not None:
                return {"kind": "refused", "why": why}
            compile(tree, SUBMISSION, "exec", dont_inherit=True)
        else:
            compile(source, SUBMISSION, "exec", dont_inherit=True)
    except Exception as exc:
        return {"kind": "unparseable", "error": _describe(exc)}
    return None


def _check_submission(head: "Record") -> "Record | None":
    """``source_problem`` of the submission, worked out in a child of the recorder (which holds no
    secret yet), so that whatever compiling does to its process (the box's memory bound included) is
    the submission's failure, reported as such."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            problem: Record | None
            try:
                with open(SUBMISSION, "rb") as fh:
                    source = fh.read()
            except OSError as exc:
                problem = {"kind": "unparseable", "error": f"the submission cannot be read: {_describe(exc)}"}
            else:
                problem = source_problem(source, head.get("rules"))
            os.write(w, json.dumps(problem).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + _CHECK_S
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if not timed_out:
        try:
            problem = json.loads(b"".join(chunks))
            return problem
        except ValueError:
            pass
    if timed_out:
        why = f"compiling it took longer than {_CHECK_S:g} s"
    elif os.WIFSIGNALED(status):
        why = f"compiling it was killed by signal {os.WTERMSIG(status)} (a bound of the box, such as its memory)"
    else:
        why = "compiling it failed"
    return {"kind": "unparseable", "error": why}


def _refuse(problem: "Record") -> None:
    """The recorder's whole report for a submission that must not run: ``problem``, then done."""
    with open(f"{SPEC_DIR}/secret.json") as fh:
        nonce = json.load(fh)["nonce"]
    for name in os.listdir(SPEC_DIR):
        os.unlink(f"{SPEC_DIR}/{name}")
    os.rmdir(SPEC_DIR)
    out = os.fdopen(1, "w", buffering=1)
    for record in (problem, {"kind": "done", "status": 0, "tests": 0, "log": ""}):
        out.write(f"FARM {nonce} {json.dumps(record)}\n")
    out.flush()


# -- the recorder (parent): feeds, times, records -----------------------------------------------

def _recorder() -> None:
    # What a runner may know (mode, entry point) is read before any fork; the rest
    # (nonce, test inputs, the reference's source) only after both runners exist, so
    # no runner's memory ever holds a copy of it, and then the files are deleted.
    with open(f"{SPEC_DIR}/head.json") as fh:
        head = json.load(fh)
    if head["mode"] == "array":
        # Imported once, before any fork: both runners share it, and neither pays for it
        # inside a timed call. One BLAS thread: a call's CPU time is then its own work, on
        # one core, for the reference and the submission alike (and a pool of BLAS threads
        # would not survive the fork anyway).
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
        sys.path.insert(0, "/opt/farm/site")
        import numpy  # noqa: F401
        _steady_heap()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    problem = _check_submission(head)  # before any runner exists: a refused source never runs
    if problem is not None:
        _refuse(problem)
        return
    ref_runner = _start_runner(head) if head.get("reference") else None
    runner = _start_runner(head)
    if ref_runner is not None:
        _share_a_cpu(ref_runner[0], runner[0])
    with open(f"{SPEC_DIR}/secret.json") as fh:
        secret = json.load(fh)
    blobs: dict[str, bytes] = {}
    for name in os.listdir(SPEC_DIR):
        if name.endswith(".bin"):
            with open(f"{SPEC_DIR}/{name}", "rb") as blob:
                blobs[name] = blob.read()
        os.unlink(f"{SPEC_DIR}/{name}")
    os.rmdir(SPEC_DIR)
    nonce = secret["nonce"]
    tests = secret["tests"]
    per_call = float(head.get("per_call_s", 5.0))
    out = os.fdopen(1, "w", buffering=1)

    def emit(record: "Record") -> None:
        out.write(f"FARM {nonce} {json.dumps(record)}\n")

    mode = head["mode"]
    sub = _Runner(*runner, emit)
    ref = None
    # Until the first timed test the reference runs alone: the submission's runner has not
    # loaded anything yet, so nothing of it can slow the reference down, read it or stop it,
    # and whatever goes wrong with the reference there is the farm's, not the attempt's.
    alone = next((i for i, t in enumerate(tests) if t.get("timed")), len(tests))
    if ref_runner is not None:
        ref = _Runner(*ref_runner, lambda r: emit({**r, "kind": "ref_" + r["kind"]}))
        _write_frame(ref.req_w, {"go": True, "source": secret["reference_source"]})
        _feed(mode, per_call, ref, [c for i in range(alone) for c in _with_echo(tests, i)], blobs)
    _write_frame(sub.req_w, {"go": True})
    _feed(mode, per_call, sub, tests[:alone], blobs)
    # The timed tests are rounds: the reference and the submission answer the same fresh input
    # one right after the other, the reference first in even rounds and second in odd ones
    # (ABBA), so that whatever drifts (a neighbour's load, the caches) falls on both alike
    # within a round, and going first (measured here: up to 100 us dearer) on each alike over
    # the rounds. Each runner sees each input once: nothing to cache. The reference now runs
    # beside a loaded submission: if it stops answering here, that is the submission's doing,
    # and the host reads it so.
    for k in range(len(tests) - alone):
        # The submission's runner gets the echo too, unrecorded (its time is the submission's to
        # bend): each side's call then follows the same steps. Without it, measured here, the
        # submission's call came cold after the reference's pair and read 10 to 20% slower.
        if ref is not None and sub.lost is not None and ref.lost is None:
            ref.lost = "not run: the submission had stopped"
        theirs = [(sub, t, t["id"] < 0) for t in _with_echo(tests, alone + k)]
        steps = [(ref, t, False) for t in _with_echo(tests, alone + k)] if ref is not None else []
        steps = [*steps, *theirs] if k % 2 == 0 else [*theirs, *steps]
        for who, t, quiet in steps:
            _call(mode, per_call, who, t, blobs, quiet)
    for r in (ref, sub):
        if r is not None:
            os.close(r.req_w)
    # Whatever the submission left running (a background writer, a daemon) ends now,
    # before the recorder's last word: kill(-1) reaches every process of the box but
    # this one and its init.
    time.sleep(0.01)
    runner_cpu = _cpu_ns(sub.clock)
    os.kill(-1, signal.SIGKILL)
    if ref is not None:
        os.waitpid(ref.pid, 0)
    # The runner's own clock is read again once it is a zombie, not only before it was killed: whatever it
    # still ran after that read (its exit, late work on a loaded machine) is its own CPU time, which the
    # reaped count below has; read before the kill, it showed as work of processes the submission started
    # (2 ms for a reference, once, under load). A zombie's clock is final and holds none of its reaped
    # children's time, so the difference is theirs alone (measured equal to the reaped count to the us).
    os.waitid(os.P_PID, sub.pid, os.WEXITED | os.WNOWAIT)
    runner_cpu = _cpu_ns(sub.clock) or runner_cpu
    before = _cpu_spent(resource.RUSAGE_CHILDREN)
    _, status = os.waitpid(sub.pid, 0)
    # What the box spent, as this process counts it: itself and the runners it reaped (a runner's
    # count includes the children it reaped), and the submission's runner alone, by its CPU clock.
    # The host holds them against the box's own count (its cgroup's): work done where no runner's
    # CPU clock saw it (a helper process, left behind or reaped) shows as the difference.
    cpu = {"all": _cpu_spent(resource.RUSAGE_SELF) + _cpu_spent(resource.RUSAGE_CHILDREN),
           "runner_tree": _cpu_spent(resource.RUSAGE_CHILDREN) - before}
    if runner_cpu is not None:
        cpu["runner"] = runner_cpu / 1e9
    emit({"kind": "done", "status": status, "tests": len(tests), "log": _log_tail(), "cpu_s": cpu})
    out.flush()


def _share_a_cpu(*pids: int) -> None:
    """Keep this process and ``pids`` on the CPU this process runs on. The two runners are timed
    against each other, and what slows one of them for a whole run, pairing rounds cannot cancel:
    without this, the same kernel read 1.9x slower in one runner than in the other, all run long
    and by both clocks, in 2 runs of 60 here (a VM's vCPUs are not equally fast at every moment).
    The calls take turns anyway, so one CPU costs no time, and the arrays stay in its caches."""
    try:
        with open("/proc/self/stat") as fh:
            cpu = int(fh.read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU last run on
        for pid in (0, *pids):
            os.sched_setaffinity(pid, {cpu})
    except (OSError, ValueError, IndexError):
        pass  # not pinned: timed all the same, only less evenly


def _cpu_spent(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _steady_heap() -> None:
    """Keep freed memory in the heap instead of handing it back to the kernel: arrays of a few MiB
    are otherwise mmap'd and unmapped around every call, and the page faults of a fresh mapping,
    counted in the call's time or not depending on the allocator's state, are noise."""
    try:
        import ctypes  # numpy imports it anyway

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: arrays up to 32 MiB come from the heap
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: and what they free stays there
    except (ImportError, OSError, AttributeError):
        pass


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    try:
        # Arrays of hundreds of KiB would otherwise cross a 64 KiB pipe in many hops, and the
        # hops would be timed as the function's.
        import fcntl

        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
    return r, w


def _start_runner(head: "Record") -> tuple[int, int, int]:
    req_r, req_w = _pipe()
    resp_r, resp_w = _pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(req_w)
            os.close(resp_r)
            _runner(head, req_r, resp_w)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    return pid, req_w, resp_r


class _Runner:
    """A runner as the recorder drives it: its pipes, its CPU clock, why it no longer answers."""

    def __init__(self, pid: int, req_w: int, resp_r: int, emit: "Callable[[Record], None]") -> None:
        self.pid = pid
        self.req_w = req_w
        self.resp_r = resp_r
        self.emit = emit
        # The runner's CPU clock (CPUCLOCK_SCHED of the whole process, as clock_getcpuclockid(3)
        # makes it): the time the runner itself ran, all its threads, nanoseconds, blind to the
        # time it sat preempted on a shared machine. Any process of the same box may read it.
        self.clock = ((~pid) << 3) | 2
        self.calls = 0
        self.lost: str | None = None


def _with_echo(tests: "list[Record]", i: int) -> "list[Record]":
    """The calls for ``tests[i]``: the test, after an echo if it asks for one. An echo measures what
    a call costs besides the function (moving arrays through the pipes, checking them): arrays of the
    same size go in and out, but not the test's own inputs. They are the previous test's, which both
    runners have answered already: an echo tells a runner nothing it could work ahead on, unmeasured
    (the submission's echo is not timed)."""
    test = tests[i]
    if not test.get("echo"):
        return [test]
    before = tests[i - 1] if i > 0 and tests[i - 1].get("arrays") == test.get("arrays") else None
    # With no input of this size answered before, the echo's inputs are zeros.
    return [{**test, "id": -1 - test["id"], "echo_blob": before["blob"] if before is not None else None}, test]


def _feed(mode: str, per_call: float, runner: _Runner, tests: "list[Record]", blobs: dict[str, bytes]) -> None:
    for test in tests:
        _call(mode, per_call, runner, test, blobs)


def _cpu_ns(clock: int) -> int | None:
    try:
        return time.clock_gettime_ns(clock)
    except OSError:
        return None


def _call(mode: str, per_call: float, runner: _Runner, test: "Record", blobs: dict[str, bytes],
          quiet: bool = False) -> None:
    """Send one test to the runner, time its answer from here, and record it (or why there is none).
    A ``quiet`` call records nothing: if it finds the runner gone, its next call says so."""
    emit = (lambda record: None) if quiet else runner.emit
    if runner.lost is not None:
        emit({"kind": "lost", "id": test["id"], "why": runner.lost})
        return
    first = runner.calls == 0
    runner.calls += 1
    header = {"id": test["id"]}
    body = b""
    if mode == "call":
        header["args"] = test["args"]
    else:
        header["arrays"] = test["arrays"]
        body = blobs[test["blob"]]
        if test["id"] < 0:
            header["echo"] = test["echo"]
            body = blobs[test["echo_blob"]] if test.get("echo_blob") else bytes(len(body))
    cpu_started = _cpu_ns(runner.clock)
    started = time.perf_counter()
    try:
        _write_frame(runner.req_w, header, body)
        reply, data = _read_frame(runner.resp_r, time.monotonic() + per_call)
    except TimeoutError:
        runner.lost = "timeout"
        emit({"kind": "lost", "id": test["id"], "why": runner.lost})
        os.kill(runner.pid, signal.SIGKILL)
        return
    except (EOFError, OSError, ValueError) as exc:
        runner.lost = "exited" if isinstance(exc, (EOFError, OSError)) else "garbled"
        emit({"kind": "lost", "id": test["id"], "why": runner.lost})
        return
    seconds = time.perf_counter() - started
    cpu_ended = _cpu_ns(runner.clock)
    reply = _checked_reply(mode, reply, data)
    if reply is None:
        runner.lost = "garbled"
        emit({"kind": "lost", "id": test["id"], "why": runner.lost})
        return
    if first and "import_error" in reply:
        emit({"kind": "import_error", "error": str(reply["import_error"])[:400]})
        runner.lost = "import failed"
        return
    if reply.get("id") != test["id"]:
        emit({"kind": "lost", "id": test["id"], "why": "answered a different test"})
        runner.lost = "out of step"
        return
    record = {"kind": "result", "id": test["id"], "ok": reply.get("ok") is True, "seconds": seconds}
    if cpu_started is not None and cpu_ended is not None:
        record["cpu_seconds"] = (cpu_ended - cpu_started) / 1e9
    if record["ok"]:
        if mode == "call":
            record["value"] = str(reply.get("value"))[:1_000_000]
        else:
            import base64

            record["dtype"] = str(reply.get("dtype"))
            record["shape"] = reply.get("shape")
            if test["id"] < 0:
                data = b""  # an echo: only its time matters
            elif "sample" in test:
                # Only the elements the host chose (the runner never learns which) come out:
                # big outputs, checked where it matters, without megabytes on stdout.
                data = _sample(data, record["dtype"], test["sample"])
                record["sampled"] = True
            record["data"] = base64.b64encode(data).decode()
    else:
        record["error"] = str(reply.get("error"))[:400]
    emit(record)


_MAX_VALUE_CHARS = 1_000_000
_MAX_ERROR_CHARS = 400
_MAX_NDIM = 8
_MAX_DTYPE_CHARS = 8


def _checked_reply(mode: str, reply: "Any", data: "bytes | bytearray") -> "Record | None":
    """A runner's reply with every field checked for type and size before any is used, or None
    when it is garbled. The response pipe is open in the submission's own process, so a reply may
    be a forged frame: anything but the fields a runner sends, in the types and sizes it sends them,
    is refused here, never copied into a record for the host to parse."""
    if type(reply) is not dict:
        return None
    if "import_error" in reply:
        error = reply["import_error"]
        return {"import_error": error[:_MAX_ERROR_CHARS]} if type(error) is str else None
    test_id = reply.get("id")
    if type(test_id) is not int:
        return None
    if reply.get("ok") is not True:
        error = reply.get("error")
        return {"id": test_id, "ok": False, "error": error[:_MAX_ERROR_CHARS]} if type(error) is str else None
    if mode == "call":
        value = reply.get("value")
        if type(value) is not str:
            return None
        if len(value) > _MAX_VALUE_CHARS:
            return {"id": test_id, "ok": False,
                    "error": f"the value is longer than {_MAX_VALUE_CHARS} characters as JSON"}
        return {"id": test_id, "ok": True, "value": value}
    dtype = reply.get("dtype")
    shape = reply.get("shape")
    if type(dtype) is not str or len(dtype) > _MAX_DTYPE_CHARS or type(shape) is not list \
            or len(shape) > _MAX_NDIM:
        return None
    count = 1
    for d in shape:
        if type(d) is not int or not 0 <= d < 1 << 40:
            return None
        count *= d
    try:
        import numpy

        kind = numpy.dtype(dtype)
    except Exception:  # TypeError, ValueError, and whatever numpy makes of a string it does not know
        return None
    if kind.str != dtype or kind.kind not in "biufc" or count * kind.itemsize != len(data):
        return None
    return {"id": test_id, "ok": True, "dtype": dtype, "shape": shape}


def _sample(data: "bytes | bytearray", dtype: str, indices: "list[int]") -> bytes:
    import numpy as np

    try:
        flat = np.frombuffer(data, dtype=dtype)
        return flat[np.asarray(indices, dtype=np.int64)].tobytes()
    except (ValueError, TypeError, IndexError):
        return b""


def _log_tail() -> str:
    try:
        with open(AGENT_LOG, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - _LOG_TAIL))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


if __name__ == "__main__":
    _recorder()
