"""A contributed environment's own code, run in boxes: its generator, its reference and its verifier.

Every call is one fresh box under the manifest's bounds (``[bounds]``: seconds for the call, memory),
holding the package's files, the in-box runner (``env_runner.py``) and one request. The box gets the
task's seed, derived on the host from the farm's key, the environment's name and version, and the task
(``task_seed``): the key itself never enters a box, and one environment's seeds say nothing about
another's. Hidden data is regenerated from that seed in the verifying box and never leaves a box.

``reference`` and ``verify`` take a ``canary_seed`` for intake's tier 2: the task shown is ``seed``'s, the
hidden data ``canary_seed``'s (from its own per-task seed), so the prompt's right answer is wrong there.

A call's outcome is read strictly: exactly one result line carrying the call's nonce, bounded before it
is parsed, parsed in a thread. Anything else (no line, two lines, a bound hit, an exception in the
environment's code, a verdict of the wrong shape) is a ``ContributedError``: the environment's fault,
reported with its evidence; never a task, never a pass.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmd import domain
from farmd.errors import FarmError
from farmd.intake.package import Package
from farmd.sandbox import BoxResult, Sandbox, SandboxPolicy
from farmd.text import bounded, clip, decode, valid_text
from farmd.verifier import VerifierKey

RUNNER_SOURCE = (Path(__file__).parent / "env_runner.py").read_bytes()
COMMAND = ["python3", "-I", "-S", "-B", "runner.py"]
MAX_RESULT_BYTES = 1 << 20
MAX_PROMPT_CHARS = 64 * 1024
MAX_FINAL_CHARS = 64 * 1024
MAX_REASONS = 16


class ContributedError(FarmError):
    """The contributed environment's code failed a call: ``evidence`` says how (what intake reports)."""

    def __init__(self, op: str, evidence: str) -> None:
        super().__init__(f"{op}: {evidence}", reason="CONTRIBUTED_ENV_FAILED")
        self.op = op
        self.evidence = evidence


@dataclass(frozen=True)
class ContributedTask:
    prompt: str
    public: dict[str, Any]


@dataclass(frozen=True)
class ContributedVerdict:
    reward: float
    passed: bool
    reasons: list[str]


@dataclass(frozen=True)
class Call:
    """What one call cost (intake's cost accounting reads these)."""

    op: str
    wall_s: float
    cpu_s: float


class BoxedEnvironment:
    """``package``'s environment, each call in a box of ``sandbox``; ``key`` is the farm's."""

    def __init__(self, package: Package, sandbox: Sandbox, key: VerifierKey) -> None:
        self.package = package
        self.manifest = package.manifest
        self.sandbox = sandbox
        self._key = key
        self._files = {f"env/{name}": data for name, data in package.files.items()} | {"runner.py": RUNNER_SOURCE}
        self.calls: list[Call] = []

    def variant(self, package: Package) -> BoxedEnvironment:
        """Another version of this environment (a mutant), run the same way."""
        return BoxedEnvironment(package, self.sandbox, self._key)

    def task_seed(self, seed: int, difficulty: int) -> int:
        """The seed a task's hidden data comes from: the farm's key, this environment and version, the task."""
        m = self.manifest
        return self._key.seed("contributed", m.env_name, m.version, seed, difficulty)

    def _policy(self, op: str) -> SandboxPolicy:
        bounds = self.manifest.bounds
        seconds = bounds["verify_s"] if op == "verify" else bounds["generate_s"]
        return SandboxPolicy(wall_time_s=seconds + 1.0, cpu_time_s=seconds, memory_mb=int(bounds["memory_mb"]),
                             output_kb=2048)

    async def _call(self, op: str, seed: int, difficulty: int, canary_seed: int | None = None,
                    **extra: Any) -> dict[str, Any]:
        nonce = secrets.token_hex(16)
        if canary_seed is not None:
            extra |= {"canary_seed": canary_seed, "canary_task_seed": self.task_seed(canary_seed, difficulty)}
        request = {"op": op, "nonce": nonce, "seed": seed, "difficulty": difficulty,
                   "task_seed": self.task_seed(seed, difficulty), "env": self.manifest.name,
                   "entry_file": self.manifest.entry_file,
                   "entry_class": self.manifest.entry_class, **extra}
        files = {**self._files, "request.json": json.dumps(request).encode()}
        result = await self.sandbox.run(COMMAND, self._policy(op), files=files)
        self.calls.append(Call(op, result.wall_s, result.cpu_s))
        return await asyncio.to_thread(_read_result, op, result, nonce)

    async def generate(self, seed: int, difficulty: int) -> ContributedTask:
        value = await self._call("generate", seed, difficulty)
        prompt, public = value.get("prompt"), value.get("public", {})
        if not isinstance(prompt, str) or not prompt.strip():
            raise ContributedError("generate", "the task has no prompt")
        if not isinstance(public, dict):
            raise ContributedError("generate", "'public' must be a dict")
        # Posed with every attempt and stored in every trajectory of the task: its numbers and nesting held to
        # the record's domain here, where they are the environment's fault (NaN, an integer past int64,
        # nesting no reader can decode), not discovered by every stream and export that meets them.
        problem = domain.tree_problem(public, "public")
        if problem is not None:
            raise ContributedError("generate", f"the task's {problem}")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ContributedError("generate", f"the prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS}")
        return ContributedTask(valid_text(prompt)[0], public)

    async def reference(self, seed: int, difficulty: int, *, canary_seed: int | None = None) -> str:
        final = (await self._call("reference", seed, difficulty, canary_seed)).get("final")
        if not isinstance(final, str):
            raise ContributedError("reference", "the reference's answer is not text")
        return final

    async def verify(self, seed: int, difficulty: int, final: str, *,
                     canary_seed: int | None = None) -> ContributedVerdict:
        text = bounded(final, MAX_FINAL_CHARS)
        value = await self._call("verify", seed, difficulty, canary_seed, final=text)
        reward, passed, reasons = value.get("reward"), value.get("passed"), value.get("reasons", [])
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward) \
                or not 0.0 <= reward <= 1.0:
            raise ContributedError("verify", f"reward must be a number from 0 to 1, not {str(reward)[:40]!r}")
        if not isinstance(passed, bool):
            raise ContributedError("verify", "passed must be true or false")
        if not isinstance(reasons, list):
            raise ContributedError("verify", "reasons must be a list of text")
        return ContributedVerdict(float(reward), passed,
                                  [bounded(str(r), 500) for r in reasons[:MAX_REASONS]])


def _read_result(op: str, result: BoxResult, nonce: str) -> dict[str, Any]:
    """The one result line of a call, strictly (see the module); raises ``ContributedError``."""
    if result.violations:
        raise ContributedError(op, f"it hit a bound of its box: {', '.join(result.violations)}")
    prefix = f"FARM {nonce} ".encode()
    lines = [line for line in result.stdout.split(b"\n") if line.startswith(prefix)]
    if len(lines) != 1:
        tail = clip(decode(result.stderr[-2000:])[0], 500)[0]
        raise ContributedError(op, f"{len(lines)} result lines where one was due (exit {result.exit_code}); {tail}")
    body = lines[0][len(prefix):]
    if len(body) > MAX_RESULT_BYTES:
        raise ContributedError(op, f"a result of {len(body)} bytes; at most {MAX_RESULT_BYTES}")
    try:
        record = json.loads(decode(body)[0])
    except ValueError:
        raise ContributedError(op, "a result that is not JSON") from None
    if not isinstance(record, dict):
        raise ContributedError(op, "a result that is not an object")
    if not record.get("ok"):
        raise ContributedError(op, bounded(str(record.get("error", "it failed")), 2000))
    value = record.get("value")
    if not isinstance(value, dict):
        raise ContributedError(op, "a result without a value")
    return value
