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


def _do(request: dict[str, Any]) -> dict[str, Any]:
    if request.get("trace"):
        _trace()
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


def main() -> None:
    with open("request.json", "rb") as fh:
        request = json.loads(fh.read(_MAX_REQUEST))
    os.unlink("request.json")
    nonce = request.pop("nonce")
    out = sys.stdout
    sys.stdout = sys.stderr = io.StringIO()  # the environment's prints are not the result
    try:
        result: dict[str, Any] = {"ok": True, "value": _do(request)}
    except BaseException as exc:  # whatever the environment's code raises is reported, not a crash
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                  "trace": traceback.format_exc()[-4000:]}
    line = "FARM " + nonce + " " + json.dumps(result, default=str) + "\n"
    out.flush()
    os.write(out.fileno(), line.encode("utf-8", "replace"))


if __name__ == "__main__":
    main()
