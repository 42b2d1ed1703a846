"""The program that runs a contributed environment's own code, inside a box (never imported by farmd:
``farmd.intake.boxed`` ships its source into each box).

It reads ``request.json`` from its working directory and removes it, loads the environment's class from
its files, does one thing (``generate``, ``reference`` or ``verify``) and writes one result line,
``FARM <nonce> <json>``, as the last thing it does. What the environment's code prints goes to a buffer,
not to the result. The per-task seed it is given is all it knows of the farm's key: hidden data is
regenerated from it when a verdict is due, never stored, never shown to an attempt.

Two random sources: ``rng``, seeded from the environment's name, the seed and the level, chooses what
the task asks (anyone can regenerate it: a contributor writes example answers with it); ``hidden_rng``,
seeded from the per-task seed, chooses what the verifier checks and nobody outside may predict (hidden
test inputs).

A canary (intake's tier 2: a request with ``canary_seed``) is a task whose hidden checks contradict its
prompt: the prompt and public fields of ``seed``, everything else ``generate`` returned (``hidden`` and any
other key: none of it is shown) from ``canary_seed``, with that task's own ``hidden_rng``
(``canary_task_seed``). A verifier that judges by the hidden data fails the prompt's right answer there.

Two more of tier 2's requests: ``rng_salt`` seeds ``rng`` from another string (the same seed, other public
choices: a task whose prompt stays the same while its answer moves was answered by something the prompt does
not show), and ``trace`` keeps what the verifier's own child processes printed (``subprocess`` output, and
text buffers it read back) while it judged: what it parses, so that tier 2 can forge it. ``solve`` is
``generate`` and ``reference`` in one box.

A package in verifiers' form (``form = "verifiers"`` in its manifest) is loaded by ``vf_adapter.py`` (shipped
beside this file): its ``load_environment`` returns a verifiers environment that the adapter drives through the
same three methods.

The contributed class:

    class WordCount:
        def generate(self, seed, difficulty, rng, hidden_rng):
            return {"prompt": "...", "public": {...}, "hidden": {...}}
        def reference(self, task):                   # task: what generate returned, hidden included
            return "the answer"
        def verify(self, task, final):               # final: the attempt's text
            return {"reward": 1.0, "passed": True, "reasons": ["..."]}
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import sys
import traceback
from typing import Any

_MAX_REQUEST = 4 << 20
_MAX_RESULT = 1 << 20
_MAX_TRACES = 8
_MAX_TRACE_CHARS = 16 * 1024
_traces: list[str] = []


def _kept(text: object) -> None:
    if len(_traces) < _MAX_TRACES:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if isinstance(text, str) and text.strip():
            _traces.append(text[-_MAX_TRACE_CHARS:])


def _trace() -> None:
    """Keep what the verifier reads back from the programs it runs and the buffers it prints into."""
    import subprocess

    communicate = subprocess.Popen.communicate

    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = communicate(self, *args, **kwargs)
        _kept(out[0])
        return out

    subprocess.Popen.communicate = traced  # type: ignore[method-assign]

    class Buffer(io.StringIO):
        def getvalue(self) -> str:
            value = super().getvalue()
            _kept(value)
            return value

    io.StringIO = Buffer  # type: ignore[misc]


def _load(entry_file: str, entry_class: str) -> Any:
    spec = importlib.util.spec_from_file_location("contributed_env", os.path.join("env", entry_file))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {entry_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["contributed_env"] = module
    spec.loader.exec_module(module)
    return getattr(module, entry_class)()


def _generate(env: Any, request: dict[str, Any], seed: int, task_seed: int) -> dict[str, Any]:
    salt = request.get("rng_salt")
    rng = random.Random(f"{request['env']}:{seed}:{request['difficulty']}" + (f":{salt}" if salt else ""))
    task = env.generate(seed, request["difficulty"], rng, random.Random(task_seed))
    if not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
        raise TypeError("generate must return a dict with a 'prompt' string")
    return task


def _adapter() -> Any:
    module = sys.modules.get("farm_vf_adapter")
    if module is None:
        spec = importlib.util.spec_from_file_location("farm_vf_adapter", "vf_adapter.py")
        if spec is None or spec.loader is None:
            raise ImportError("cannot load the verifiers adapter")
        module = importlib.util.module_from_spec(spec)
        sys.modules["farm_vf_adapter"] = module
        spec.loader.exec_module(module)
    return module


def _load_verifiers(request: dict[str, Any]) -> Any:
    """A verifiers package (``form = "verifiers"``): its ``load_environment`` behind ``vf_adapter``'s three methods."""
    return _adapter().VerifiersEnvironment(request)


def _do(request: dict[str, Any]) -> dict[str, Any]:
    if request.get("trace"):
        _trace()
    if request.get("form") == "verifiers":
        env = _load_verifiers(request)
    else:
        env = _load(request["entry_file"], request["entry_class"])
    task = _generate(env, request, request["seed"], request["task_seed"])
    op = request["op"]
    if request.get("canary_seed") is not None and op != "generate":
        other = _generate(env, request, request["canary_seed"], request["canary_task_seed"])
        task = {**other, "prompt": task["prompt"], "public": task.get("public", {})}
    if op == "generate":
        return {"prompt": task["prompt"], "public": task.get("public", {})}
    if op in ("reference", "solve"):
        final = env.reference(task)
        if not isinstance(final, str):
            raise TypeError("reference must return the answer as a string")
        if op == "solve":
            return {"prompt": task["prompt"], "public": task.get("public", {}), "final": final}
        return {"final": final}
    verdict = env.verify(task, request["final"])
    if not isinstance(verdict, dict):
        raise TypeError("verify must return a dict with 'reward', 'passed' and 'reasons'")
    out = {"reward": verdict.get("reward"), "passed": verdict.get("passed"), "reasons": verdict.get("reasons", [])}
    if request.get("trace"):
        out["trace"] = list(_traces)
    return out


def _result(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "value": _do(request)}
    except BaseException as exc:  # whatever the environment's code raises is reported, not a crash
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                "trace": traceback.format_exc()[-4000:]}


def _line(nonce: str, result: dict[str, Any]) -> bytes:
    return ("FARM " + nonce + " " + json.dumps(result, default=str) + "\n").encode("utf-8", "replace")


def _session(ready: str, request: dict[str, Any], out: int) -> None:
    """A verifiers package's box for as many batches as intake's checks send it: verifiers imported once, a line
    under ``ready`` when it is, then one batch a line on stdin (``{"nonce", "batch", "item_s"}``), each run by
    ``_calls`` and ended by a line under its nonce. It ends at its stdin's end, or when no batch came for
    ``idle_s`` (its host went away without ending it)."""
    _undumpable()
    _adapter().prepare(request["site"])
    os.write(out, _line(ready, {"ok": True, "value": {}}))
    pending = b""
    while True:
        line, pending = _next_line(pending, float(request["idle_s"]))
        if line is None:
            return
        batch = json.loads(line)
        _calls(batch["batch"], float(batch["item_s"]), out)
        os.write(out, _line(batch["nonce"], {"ok": True, "value": {"calls": len(batch["batch"])}}))


def _next_line(pending: bytes, idle_s: float) -> tuple[bytes | None, bytes]:
    """The next line on stdin (at most ``_MAX_REQUEST`` bytes) and what was read past it; None at its end, past
    the bound, or after ``idle_s`` with nothing."""
    import select

    while b"\n" not in pending:
        if len(pending) > _MAX_REQUEST or not select.select([0], [], [], idle_s)[0]:
            return None, b""
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None, b""
        pending += chunk
    line, _, rest = pending.partition(b"\n")
    return line, rest


def _calls(items: list[dict[str, Any]], limit: float, out: int) -> None:
    """Each call in a child forked from this process, with fresh random state and its own deadline (``limit``
    seconds), so a call that hangs or crashes is that call's failure, and what one call's code does to its
    process is gone for the next. Each call's line carries that call's own nonce.

    The calls are one package's, and each must answer only for itself: a child holds every nonce of the batch
    (it is a copy of this process), so it must have no way to the host's channel. It writes its result to a
    pipe of its own, and this process, the only one holding the box's stdout, frames it (``_alone``). This
    process is not dumpable, nor are the children (inherited), so no process of the box can open another's
    descriptors or memory through /proc; and whatever a call leaves running is killed before the next starts
    (``_end_leftovers``)."""
    for item in items:
        nonce = item.pop("nonce")
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one call, its result down the pipe, gone
            _alone(write_end)
            random.seed()
            _adapter().reseed()
            data = json.dumps(_result(item), default=str).encode("utf-8", "replace")
            os.write(write_end, data[:_MAX_RESULT])
            os._exit(0)
        os.close(write_end)
        body = _collect(read_end, pid, limit)
        _end_leftovers()
        try:
            result = json.loads(body) if body else {"ok": False, "error": "the call ended without a result"}
        except ValueError:
            result = {"ok": False, "error": "the call's result is not JSON"}
        if result.get("ok") is None:
            result = {"ok": False, "error": f"the call took more than its {limit:g} seconds"}
        os.write(out, _line(nonce, result))


def _undumpable() -> None:
    """This process's descriptors and memory closed to every other process of the box (``PR_SET_DUMPABLE`` 0:
    /proc/PID/fd and /proc/PID/mem answer only to a ptrace-capable process, and the box has none)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed: calls cannot be kept apart")


_PR_SET_DUMPABLE = 4


def _alone(result_fd: int) -> None:
    """A call's child before any of the package's code runs: the box's stdout (the host's channel, where a line
    with another call's nonce would be taken as that call's result) and every other descriptor of this process
    closed; stdin and stdout are /dev/null. Only ``result_fd`` leads out, to this call's own pipe."""
    import resource

    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.closerange(3, result_fd)
    os.closerange(result_fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def _end_leftovers() -> None:
    """Every process of the box but its init and this one killed: what a call started (a daemon, a sleeper)
    never runs beside the next call. ``kill(-1)`` reaches the whole of the box's pid namespace; again, for
    any forked while the first went round. Only under the box's own init (pid 1 of a namespace of the box's
    own): anywhere else ``kill(-1)`` would reach every process of this uid."""
    import signal

    if os.getppid() != 1:
        raise OSError("the runner is not the child of its box's init: calls cannot be kept apart")
    for _ in range(3):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return


def _collect(fd: int, pid: int, limit: float) -> bytes:
    """What the child at ``pid`` writes to ``fd`` until it exits, or b'{}' (no verdict) if it is still at it
    after ``limit`` seconds: then it is killed. Its exit ends the call, not the pipe's end: a process it left
    behind may hold the pipe open (``_end_leftovers`` kills it next)."""
    import select
    import signal
    import time

    deadline = time.monotonic() + limit
    exited = os.pidfd_open(pid)
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    reading = True
    """Until the pipe's end, or more than a result's bound read: then only the exit is waited for."""
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([fd, exited] if reading else [exited], [], [], left)[0] if left > 0 else []
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return b"{}"
            while reading:  # all there is now: at the exit, everything the child wrote
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                size += len(chunk)
                chunks.append(chunk)
                reading = bool(chunk) and size <= _MAX_RESULT
            if exited in ready:
                break
    finally:
        os.close(fd)
        os.close(exited)
    os.waitpid(pid, 0)
    return b"".join(chunks)[:_MAX_RESULT + 1]


def main() -> None:
    with open("request.json", "rb") as fh:
        request = json.loads(fh.read(_MAX_REQUEST))
    os.unlink("request.json")
    nonce = request.pop("nonce")
    out = sys.stdout
    sys.stdout = sys.stderr = io.StringIO()  # the environment's prints are not the result
    out.flush()
    if request.get("session"):
        _session(nonce, request, out.fileno())
        return
    os.write(out.fileno(), _line(nonce, _result(request)))


if __name__ == "__main__":
    main()
