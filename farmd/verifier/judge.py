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
per test id. Claims are checked by the recorder for form (the id asked, once) and
by the host for truth. An exit, a signal, a hang, a missing or duplicate answer is
a failure of that test.

Modes: ``call`` (JSON arguments in, canonical JSON value out) and ``array`` (raw
numpy arrays in and out, for kernels; the runner imports numpy).
"""

import json
import os
import select
import signal
import struct
import sys
import time

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


def canon(value, _type=type, _int=int, _bool=bool, _str=str, _float=float, _list=list, _tuple=tuple,
          _none=_NONE_TYPE, _repr=float.__repr__):
    """A JSON-ready copy of ``value`` built only from exact builtin types, or NotCanonical.

    float and tuple are tagged (``{"f": repr}``, ``{"t": [...]}``) so that NaN, inf
    and the list/tuple distinction survive JSON. The builtins are bound when the
    judge loads, before the submission can patch them.
    """
    budget = [_MAX_ITEMS]

    def walk(v, depth):
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

def _write_frame(fd, header, body=b""):
    head = json.dumps(header).encode()
    data = struct.pack(">II", len(head), len(body)) + head + body
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd, n, deadline):
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd, deadline=None):
    head_len, body_len = struct.unpack(">II", _read_exact(fd, 8, deadline))
    if head_len > _MAX_FRAME or body_len > _MAX_FRAME:
        raise ValueError("frame too large")
    header = json.loads(_read_exact(fd, head_len, deadline))
    body = _read_exact(fd, body_len, deadline) if body_len else b""
    return header, body


# -- the runner (child): runs the submission ----------------------------------------------------

def _runner(head, req_r, resp_w):
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
    np = sys.modules.get("numpy")  # array mode: imported by the recorder before any fork
    ndarray = np.ndarray if np is not None else None
    frombuffer = np.frombuffer if np is not None else None
    dumps = json.dumps
    try:
        fn = _load_submission(head["entry_point"], source)
    except BaseException as exc:  # SystemExit at import is an answer too: a failure
        _write_frame(resp_w, {"import_error": _describe(exc)})
        os._exit(0)
    while True:
        try:
            header, body = _read_frame(req_r)
        except (EOFError, OSError):
            os._exit(0)
        test_id = header["id"]
        try:
            if mode == "call":
                args = header["args"]
                before = dumps(canon(args))
                result = fn(*args)
                value = dumps(canon(result))
                if dumps(canon(args)) != before:
                    raise NotCanonical("the function modified its argument")
                _write_frame(resp_w, {"id": test_id, "ok": True, "value": value})
            else:
                arrays = []
                offset = 0
                for dtype, shape in header["arrays"]:
                    count = 1
                    for d in shape:
                        count *= d
                    arr = frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape).copy()
                    offset += arr.nbytes
                    arrays.append(arr)
                # An echo (the reference's runner only) measures what a call costs besides the
                # function itself: decoding the inputs, encoding an output of the same size.
                out = np.zeros(header["echo"][1], dtype=header["echo"][0]) if "echo" in header else fn(*arrays)
                if type(out) is not ndarray:
                    raise NotCanonical(f"returned {type(out).__module__}.{type(out).__qualname__}, "
                                       "not a numpy.ndarray")
                data = out.tobytes(order="C")
                _write_frame(resp_w, {"id": test_id, "ok": True, "dtype": out.dtype.str,
                                      "shape": list(out.shape)}, data)
        except BaseException as exc:  # every way of not answering is a failed test
            if isinstance(exc, SystemExit):
                os._exit(0)  # an exit mid-test: the recorder sees the pipe close
            _write_frame(resp_w, {"id": test_id, "ok": False, "error": _describe(exc)})


def _load_submission(entry_point, source=None):
    if source is not None:
        module = type(sys)("reference")
        exec(compile(source, "<reference>", "exec"), module.__dict__)
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location("submission", SUBMISSION)
        if spec is None or spec.loader is None:
            raise ImportError("cannot load the submission")
        module = importlib.util.module_from_spec(spec)
        sys.modules["submission"] = module
        spec.loader.exec_module(module)
    fn = getattr(module, entry_point, None)
    if not callable(fn):
        raise AttributeError(f"the submission defines no function {entry_point!r}")
    return fn


def _describe(exc):
    try:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    except BaseException:  # a hostile __str__
        return "an exception that cannot be described"


# -- the recorder (parent): feeds, times, records -----------------------------------------------

def _recorder():
    # What a runner may know (mode, entry point) is read before any fork; the rest
    # (nonce, test inputs, the reference's source) only after both runners exist, so
    # no runner's memory ever holds a copy of it, and then the files are deleted.
    with open(f"{SPEC_DIR}/head.json") as fh:
        head = json.load(fh)
    if head["mode"] == "array":
        # Imported once, before any fork: both runners share it, and neither pays for it
        # inside a timed call.
        sys.path.insert(0, "/opt/farm/site")
        import numpy  # noqa: F401
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    ref_runner = _start_runner(head) if head.get("reference") else None
    runner = _start_runner(head)
    with open(f"{SPEC_DIR}/secret.json") as fh:
        secret = json.load(fh)
    blobs = {}
    for name in os.listdir(SPEC_DIR):
        if name.endswith(".bin"):
            with open(f"{SPEC_DIR}/{name}", "rb") as fh:
                blobs[name] = fh.read()
        os.unlink(f"{SPEC_DIR}/{name}")
    os.rmdir(SPEC_DIR)
    nonce = secret["nonce"]
    tests = secret["tests"]
    per_call = float(head.get("per_call_s", 5.0))
    out = os.fdopen(1, "w", buffering=1)

    def emit(record):
        out.write(f"FARM {nonce} {json.dumps(record)}\n")

    if ref_runner is not None:
        # The reference runs first, alone: the submission's runner has not loaded anything
        # yet, so nothing of it can slow the reference down, read it or stop it.
        pid, req_w, resp_r = ref_runner
        _write_frame(req_w, {"go": True, "source": secret["reference_source"]})
        # The reference answers the same tests in the same order as the submission will (so
        # both are equally warm when the timed ones come), and before each timed test an echo
        # of the same size measures what a call costs besides the function.
        calls = []
        for t in tests:
            if t.get("echo"):
                calls.append({**t, "id": -1 - t["id"]})
            calls.append(t)
        _feed(head["mode"], per_call, calls, blobs, pid, req_w, resp_r,
              lambda r: emit({**r, "kind": "ref_" + r["kind"]}))
        os.close(req_w)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    pid, req_w, resp_r = runner
    _write_frame(req_w, {"go": True})
    _feed(head["mode"], per_call, tests, blobs, pid, req_w, resp_r, emit)
    os.close(req_w)
    # Whatever the submission left running (a background writer, a daemon) ends now,
    # before the recorder's last word: kill(-1) reaches every process of the box but
    # this one and its init.
    time.sleep(0.01)
    os.kill(-1, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    emit({"kind": "done", "status": status, "tests": len(tests), "log": _log_tail()})
    out.flush()


def _pipe():
    r, w = os.pipe()
    try:
        # Arrays of hundreds of KiB would otherwise cross a 64 KiB pipe in many hops, and the
        # hops would be timed as the function's.
        import fcntl

        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
    return r, w


def _start_runner(head):
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


def _feed(mode, per_call, tests, blobs, pid, req_w, resp_r, emit):
    """Send each test to the runner, time its answer from here, and record it (or why there is none)."""
    lost = None
    for i, test in enumerate(tests):
        if lost is not None:
            emit({"kind": "lost", "id": test["id"], "why": lost})
            continue
        header = {"id": test["id"]}
        body = b""
        if mode == "call":
            header["args"] = test["args"]
        else:
            header["arrays"] = test["arrays"]
            body = blobs[test["blob"]]
            if test["id"] < 0:
                header["echo"] = test["echo"]
        started = time.perf_counter()
        try:
            _write_frame(req_w, header, body)
            reply, data = _read_frame(resp_r, time.monotonic() + per_call)
        except TimeoutError:
            lost = "timeout"
            emit({"kind": "lost", "id": test["id"], "why": lost})
            os.kill(pid, signal.SIGKILL)
            continue
        except (EOFError, OSError, ValueError) as exc:
            lost = "exited" if isinstance(exc, (EOFError, OSError)) else "garbled"
            emit({"kind": "lost", "id": test["id"], "why": lost})
            continue
        seconds = time.perf_counter() - started
        if i == 0 and "import_error" in reply:
            emit({"kind": "import_error", "error": str(reply["import_error"])[:400]})
            lost = "import failed"
            continue
        if reply.get("id") != test["id"]:
            emit({"kind": "lost", "id": test["id"], "why": "answered a different test"})
            lost = "out of step"
            continue
        record = {"kind": "result", "id": test["id"], "ok": reply.get("ok") is True, "seconds": seconds}
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


def _sample(data, dtype, indices):
    import numpy as np

    try:
        flat = np.frombuffer(data, dtype=dtype)
        return flat[np.asarray(indices, dtype=np.int64)].tobytes()
    except (ValueError, TypeError, IndexError):
        return b""


def _log_tail():
    try:
        with open(AGENT_LOG, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - _LOG_TAIL))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


if __name__ == "__main__":
    _recorder()
