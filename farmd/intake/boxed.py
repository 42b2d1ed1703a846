"""A contributed environment's own code, run in boxes: its generator, its reference and its verifier.

Every call is one fresh box under the manifest's bounds (``[bounds]``: seconds for the call, memory),
holding the package's files, the in-box runner (``env_runner.py``) and one request. The box gets the
task's seed, derived on the host from the farm's key, the environment's name and version, and the task
(``task_seed``): the key itself never enters a box, and one environment's seeds say nothing about
another's. Hidden data is regenerated from that seed in the verifying box and never leaves a box.

``reference`` and ``verify`` take a ``canary_seed`` for intake's tier 2: the task shown is ``seed``'s, the
hidden data ``canary_seed``'s (from its own per-task seed), so the prompt's right answer is wrong there.
Every call takes a ``Variant`` too, for tier 2's questions about what decides an answer: another per-task
seed (the same task, other hidden choices) or another public ``rng`` stream (the same seed, other public
choices); and ``verify`` can ``trace`` what the verifier's own children printed (``env_runner``).

What a box costs is counted on the host (``calls``: its wall time and its cgroup's CPU time, never what the
manifest declares). With a budget of box seconds (``budget_s``), a call past it is refused, and with a budget
per verdict (``verdict_cpu_s``, ``verdict_wall_s``) verdicts that typically cost more end the checks
(``CheckBudgetSpent`` both): one submission's checks hold the farm's boxes for a bounded time, and a version
whose verdicts cost more than the farm pays is refused after its first few.

A call's outcome is read strictly: exactly one result line carrying the call's nonce, bounded before it
is parsed, parsed in a thread. Anything else (no line, two lines, a bound hit, an exception in the
environment's code, a verdict of the wrong shape) is a ``ContributedError``: the environment's fault,
reported with its evidence; never a task, never a pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import secrets
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmd import domain
from farmd.errors import CheckBudgetSpent, ContributedError
from farmd.intake.package import Package
from farmd.sandbox import BoxResult, BoxSession, Sandbox, SandboxPolicy
from farmd.sandbox.command import BOX_SITE
from farmd.sandbox.result import OUTPUT, WALL_TIME
from farmd.text import bounded, clip, decode, valid_text
from farmd.verifier import VerifierKey

RUNNER_SOURCE = (Path(__file__).parent / "env_runner.py").read_bytes()
VF_ADAPTER_SOURCE = (Path(__file__).parent / "vf_adapter.py").read_bytes()
"""Shipped beside the runner into a verifiers package's boxes (``form = "verifiers"``)."""
COMMAND = ["python3", "-I", "-S", "-B", "runner.py"]
MAX_RESULT_BYTES = 1 << 20
MAX_PROMPT_CHARS = 64 * 1024
MAX_FINAL_CHARS = 64 * 1024
MAX_REASONS = 16
MAX_TRACES = 8
MAX_TRACE_CHARS = 16 * 1024
VERDICTS_JUDGED = 4
"""Verdicts seen before their cost can end a submission's checks: one slow box is noise, a quarter is not."""
BATCH_MAX = 32
"""Calls of a verifiers package run together in one box (intake's checks): importing verifiers is the costly
part of its box (about 3 CPU seconds; a call is about a quarter of one), paid once for them all. Tier 2 of the
sums example: 83 CPU seconds in 15 boxes at 16 calls a box, 65 in 10 at 32."""
BATCH_BOXES = 2
"""Boxes of one verifiers package at once: its calls run one after another in a box, so one box at a time leaves
every other core idle while the next batch waits for its answers."""
BATCH_WAIT_S = 0.05
"""How long a call waits for others to share its box."""
IMPORT_CPU_S = 30.0
IMPORT_WALL_S = 120.0
"""What a verifiers package's box may take before its first call starts (importing verifiers: about 4 CPU
seconds, and on a loaded host ten times that in wall time): farm's cost, not the package's, so bounded apart
from the manifest's bounds."""
SESSION_IDLE_S = 5.0
"""How long a verifiers package's box waits for its next batch before it is closed. Its box lives from batch to
batch (``Sandbox.session``): the checks ask in stages, a few calls each, and a box per stage paid the import for
each. Tiers 1 and 2 of the sums example: 15 boxes, 66 CPU seconds, before."""
BATCH_OUTPUT_BYTES = MAX_RESULT_BYTES * 2
"""What one batch may write (its calls' result lines): more ends its box."""


@dataclass(frozen=True)
class ContributedTask:
    prompt: str
    public: dict[str, Any]


@dataclass(frozen=True)
class ContributedVerdict:
    reward: float
    passed: bool
    reasons: list[str]
    cpu_s: float = 0.0
    """What its box cost: CPU seconds as the box's cgroup counted them, and wall seconds."""
    wall_s: float = 0.0
    trace: tuple[str, ...] = ()
    """With ``trace``: what the verifier read back from the programs it ran while judging."""


@dataclass(frozen=True)
class Variant:
    """A task as it would be with other random choices (tier 2's questions): ``hidden``, another per-task seed
    (what ``hidden_rng`` draws); ``rng_salt``, another stream for the public ``rng``."""

    hidden: int | None = None
    rng_salt: str | None = None


@dataclass(frozen=True)
class Call:
    """What one call cost (intake's cost accounting reads these)."""

    op: str
    wall_s: float
    cpu_s: float
    seed: int = 0
    difficulty: int = 0


class BoxedEnvironment:
    """``package``'s environment, each call in a box of ``sandbox``; ``key`` is the farm's."""

    def __init__(self, package: Package, sandbox: Sandbox, key: VerifierKey, *, budget_s: float | None = None,
                 verdict_cpu_s: float | None = None, verdict_wall_s: float | None = None,
                 batch: bool | None = None, keep_calls: int | None = None) -> None:
        self.package = package
        self.manifest = package.manifest
        self.sandbox = sandbox
        self.key = key
        self._files = {f"env/{name}": data for name, data in package.files.items()} | {"runner.py": RUNNER_SOURCE}
        self._form: dict[str, Any] = {}
        verifiers = package.manifest.form == "verifiers"
        if verifiers:
            self._files["vf_adapter.py"] = VF_ADAPTER_SOURCE
            self._form = {"form": "verifiers", "site": BOX_SITE, "env_args": package.manifest.env_args}
        self.batch = verifiers if batch is None else batch and verifiers
        """Whether calls share boxes (``BATCH_MAX`` a batch, batch after batch in a box that lives while they come:
        ``SESSION_IDLE_S``), each in a child process of its own forked after verifiers is imported: intake's
        checks of a verifiers package, whose attempts are the farm's own, and a served version's tasks and
        references, made from seeds alone. A rollout's verdict (``ContributedEnvironment``) has a fresh box to
        itself: an attempt never shares a process tree with another attempt."""
        self.parallel = BATCH_MAX * BATCH_BOXES if self.batch else 3
        """Calls worth having in flight at once (tier 1 asks this many together)."""
        self._queued: list[tuple[str, dict[str, Any], asyncio.Future[tuple[BoxResult, int]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._boxes: set[asyncio.Task[Any]] = set()
        """Batches running, and boxes closing (held: the loop keeps only weak references to tasks)."""
        self._idle: list[_Session] = []
        """Boxes between batches, newest last."""
        self._box_slots = asyncio.Semaphore(BATCH_BOXES)
        self.calls: list[Call] = []
        self.keep_calls = keep_calls
        """How many of the newest calls ``calls`` keeps; None: every one (intake's checks count them all)."""
        self.budget_s = budget_s
        """Box seconds (wall) this environment's calls may take in all; None: no bound."""
        self.verdict_cpu_s = verdict_cpu_s
        self.verdict_wall_s = verdict_wall_s
        """What a verdict may typically cost (``verdict_cost``); None: not judged."""

    def variant(self, package: Package) -> BoxedEnvironment:
        """Another version of this environment (a mutant), run the same way (its calls count here too)."""
        other = BoxedEnvironment(package, self.sandbox, self.key, budget_s=self.budget_s,
                                 verdict_cpu_s=self.verdict_cpu_s, verdict_wall_s=self.verdict_wall_s,
                                 batch=self.batch)
        other.calls = self.calls
        return other

    @property
    def spent_s(self) -> float:
        return sum(c.wall_s for c in self.calls)

    def task_seed(self, seed: int, difficulty: int) -> int:
        """The seed a task's hidden data comes from: the farm's key, this environment and version, the task."""
        m = self.manifest
        return self.key.seed("contributed", m.env_name, m.version, seed, difficulty)

    def _policy(self, op: str) -> SandboxPolicy:
        bounds = self.manifest.bounds
        seconds = bounds["verify_s"] if op == "verify" else bounds["generate_s"]
        return SandboxPolicy(wall_time_s=seconds + 1.0, cpu_time_s=seconds, memory_mb=int(bounds["memory_mb"]),
                             output_kb=2048)

    async def _call(self, op: str, seed: int, difficulty: int, canary_seed: int | None = None,
                    variant: Variant | None = None, **extra: Any) -> tuple[dict[str, Any], Call]:
        if self.budget_s is not None and self.spent_s >= self.budget_s:
            raise CheckBudgetSpent(f"its checks took {self.spent_s:.0f} box seconds (wall, over {len(self.calls)} "
                                   f"boxes) and the farm gives one submission's checks {self.budget_s:.0f}")
        nonce = secrets.token_hex(16)
        if canary_seed is not None:
            extra |= {"canary_seed": canary_seed, "canary_task_seed": self.task_seed(canary_seed, difficulty)}
        task_seed = self.task_seed(seed, difficulty)
        if variant is not None:
            # Another per-task seed is a number like any other: the box cannot tell it from the task's own.
            if variant.hidden is not None:
                task_seed = self.key.seed("contributed", self.manifest.env_name, self.manifest.version, seed,
                                           difficulty, "variant", variant.hidden)
            if variant.rng_salt is not None:
                extra["rng_salt"] = variant.rng_salt
        request = {"op": op, "nonce": nonce, "seed": seed, "difficulty": difficulty,
                   "task_seed": task_seed, "env": self.manifest.name,
                   "entry_file": self.manifest.entry_file,
                   "entry_class": self.manifest.entry_class, **self._form, **extra}
        if self._form:
            result, shared = await self._batched(op, request)
        else:
            files = {**self._files, "request.json": json.dumps(request).encode()}
            result, shared = await self.sandbox.run(COMMAND, self._policy(op), files=files), 1
        call = Call(op, result.wall_s / shared, result.cpu_s / shared, seed, difficulty)
        self._count(call)
        if op == "verify" and self.verdict_cpu_s is not None and self.verdict_wall_s is not None:
            costly = verdict_cost(self.calls, self.verdict_cpu_s, self.verdict_wall_s, at_least=VERDICTS_JUDGED)
            if costly is not None:
                raise CheckBudgetSpent(costly)
        return await asyncio.to_thread(_read_result, op, result, nonce), call

    async def _batched(self, op: str, request: dict[str, Any]) -> tuple[BoxResult, int]:
        """The box ``request`` ran in, and how many calls shared it: with ``batch``, those queued within
        ``BATCH_WAIT_S``; else it alone."""
        if not self.batch:
            return await self._box([(op, request)]), 1
        done: asyncio.Future[tuple[BoxResult, int]] = asyncio.get_running_loop().create_future()
        self._queued.append((op, request, done))
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())
        return await done

    async def _flush(self) -> None:
        try:
            while self._queued:
                if len(self._queued) < BATCH_MAX:
                    await asyncio.sleep(BATCH_WAIT_S)
                batch, self._queued = self._queued[:BATCH_MAX], self._queued[BATCH_MAX:]
                batch = [b for b in batch if not b[2].done()]  # callers gone (cancelled) are not run
                if batch:
                    box = asyncio.ensure_future(self._run_batch(batch))
                    self._boxes.add(box)
                    box.add_done_callback(self._boxes.discard)
        finally:
            self._flusher = None

    async def _run_batch(self, batch: list[tuple[str, dict[str, Any], asyncio.Future[tuple[BoxResult, int]]]]
                         ) -> None:
        try:
            result = await self._box([(op, request) for op, request, _ in batch])
        except BaseException as exc:
            for _, _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for _, _, done in batch:
            if not done.done():
                done.set_result((result, len(batch)))

    async def _box(self, calls: list[tuple[str, dict[str, Any]]]) -> BoxResult:
        """A verifiers package's ``calls`` run in one of its boxes (``BATCH_BOXES`` at most), verifiers imported
        there once for every batch it takes, each call in a child of its own with the manifest's bound for it
        (``env_runner``). The result's stdout holds the calls' lines; its costs are the batch's alone (the box's
        import is a call of its own, ``"import"``)."""
        async with self._box_slots:
            box = self._idle.pop() if self._idle else None
            if box is not None:
                box.wanted()
            if box is None or box.session.ended:
                opened = await self._open()
                if isinstance(opened, BoxResult):  # the import failed: no call ran
                    return opened
                box = opened
            result = await self._run_in(box, calls)
            if not box.session.ended:
                box.waiting = asyncio.get_running_loop().call_later(SESSION_IDLE_S, self._let_go, box)
                self._idle.append(box)
            return result

    async def aclose(self) -> None:
        """Close this environment's boxes between batches (those in a batch close when it ends and none follows)."""
        idle, self._idle = self._idle, []
        for box in idle:
            box.wanted()
        await asyncio.gather(*(box.session.close() for box in idle), return_exceptions=True)

    def _let_go(self, box: _Session) -> None:
        if box in self._idle:
            self._idle.remove(box)
            task = asyncio.ensure_future(box.session.close())
            self._boxes.add(task)
            task.add_done_callback(self._boxes.discard)

    async def _open(self) -> _Session | BoxResult:
        """A box of this package with verifiers imported, its import recorded as a call (``"import"``); or, when
        the import did not finish, that box's result."""
        ready = secrets.token_hex(16)
        request = {"nonce": ready, "session": True, "site": BOX_SITE, "idle_s": 4 * SESSION_IDLE_S}
        policy = SandboxPolicy(wall_time_s=IMPORT_WALL_S, cpu_time_s=IMPORT_CPU_S,
                               memory_mb=int(self.manifest.bounds["memory_mb"]), output_kb=2048)
        files = {**self._files, "request.json": json.dumps(request).encode()}
        session = await self.sandbox.session(COMMAND, policy, files=files)
        out, done = await _answer(session, ready, IMPORT_WALL_S)
        if not done:  # what the box cost is its first batch's
            return await _ended(session, out, 0.0, session.started_at)
        self._count(Call("import", time.monotonic() - session.started_at, session.cpu_s()))
        return _Session(session)

    def _count(self, call: Call) -> None:
        self.calls.append(call)
        if self.keep_calls is not None and len(self.calls) > self.keep_calls:
            del self.calls[:-self.keep_calls]

    async def _run_in(self, box: _Session, calls: list[tuple[str, dict[str, Any]]]) -> BoxResult:
        """One batch in ``box``: its result, with the costs of this batch alone. A box that does not end a batch
        within the calls' bounds is ended (its calls have no answer)."""
        item_s = max(self._policy(op).cpu_time_s for op, _ in calls)
        seconds = item_s * len(calls) + 1.0
        session = box.session
        session.allow(seconds, seconds)
        nonce = secrets.token_hex(16)
        cpu_s, started = session.cpu_s(), time.monotonic()
        line = json.dumps({"nonce": nonce, "batch": [r for _, r in calls], "item_s": item_s}).encode() + b"\n"
        out, done = (await _answer(session, nonce, seconds + 1.0)) if await session.send(line) else (b"", False)
        if not done:
            return await _ended(session, out, cpu_s, started)
        return BoxResult(exit_code=0, signal=None, timed_out=False, oom=False, output_truncated=False, stdout=out,
                         stderr=b"", wall_s=time.monotonic() - started, cpu_s=session.cpu_s() - cpu_s,
                         max_rss_mb=0.0)

    async def generate(self, seed: int, difficulty: int, *, variant: Variant | None = None) -> ContributedTask:
        value, _ = await self._call("generate", seed, difficulty, variant=variant)
        return _task("generate", value)

    async def reference(self, seed: int, difficulty: int, *, canary_seed: int | None = None,
                        variant: Variant | None = None) -> str:
        value, _ = await self._call("reference", seed, difficulty, canary_seed, variant)
        return _final("reference", value)

    async def solve(self, seed: int, difficulty: int, *, variant: Variant | None = None
                    ) -> tuple[ContributedTask, str]:
        """The task and the reference's answer to it, in one box."""
        value, _ = await self._call("solve", seed, difficulty, variant=variant)
        return _task("solve", value), _final("solve", value)

    async def verify(self, seed: int, difficulty: int, final: str, *, canary_seed: int | None = None,
                     variant: Variant | None = None, trace: bool = False) -> ContributedVerdict:
        text = bounded(final, MAX_FINAL_CHARS)
        extra: dict[str, Any] = {"final": text} | ({"trace": True} if trace else {})
        value, call = await self._call("verify", seed, difficulty, canary_seed, variant, **extra)
        reward, passed, reasons = value.get("reward"), value.get("passed"), value.get("reasons", [])
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward) \
                or not 0.0 <= reward <= 1.0:
            raise ContributedError("verify", f"reward must be a number from 0 to 1, not {str(reward)[:40]!r}")
        if not isinstance(passed, bool):
            raise ContributedError("verify", "passed must be true or false")
        if not isinstance(reasons, list):
            raise ContributedError("verify", "reasons must be a list of text")
        traced = value.get("trace", [])
        kept = tuple(valid_text(t)[0] for t in traced[:MAX_TRACES] if isinstance(t, str)) \
            if trace and isinstance(traced, list) else ()
        return ContributedVerdict(float(reward), passed, [bounded(str(r), 500) for r in reasons[:MAX_REASONS]],
                                  call.cpu_s, call.wall_s, tuple(bounded(t, MAX_TRACE_CHARS) for t in kept))


@dataclass(eq=False)
class _Session:
    """A verifiers package's box that takes batch after batch, and its timer while it waits for the next."""

    session: BoxSession
    waiting: asyncio.TimerHandle | None = None

    def wanted(self) -> None:
        """Taken for a batch: it no longer waits to be closed."""
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None


async def _answer(session: BoxSession, nonce: str, timeout_s: float) -> tuple[bytes, bool]:
    """What the box writes until its line under ``nonce`` (True), or until it ends, writes more than a batch may,
    or ``timeout_s`` passes (False)."""
    prefix = f"FARM {nonce} ".encode()
    out = b""
    deadline = time.monotonic() + timeout_s
    while len(out) <= BATCH_OUTPUT_BYTES:
        out += session.take()
        if out.startswith(prefix) or b"\n" + prefix in out:
            return out, True
        left = deadline - time.monotonic()
        if left <= 0 or session.ended:
            break
        await session.output(left)
    return out, False


async def _ended(session: BoxSession, out: bytes, cpu_s: float, started: float) -> BoxResult:
    """The result of a box ended in the middle of a batch (``out``: what the batch wrote), costs from
    ``cpu_s`` and ``started``; what it was ended for among its violations."""
    late = not session.ended
    too_much = len(out) > BATCH_OUTPUT_BYTES
    session.kill()
    result = await session.close()
    violations = [*result.violations, *([OUTPUT] if too_much else []),
                  *([WALL_TIME] if late and not too_much else [])]
    return dataclasses.replace(result, stdout=out + result.stdout, cpu_s=max(0.0, result.cpu_s - cpu_s),
                               wall_s=time.monotonic() - started, violations=list(dict.fromkeys(violations)))


def verdict_cost(calls: Sequence[Call], cpu_budget_s: float, wall_budget_s: float, *, at_least: int = 2
                 ) -> str | None:
    """Why verdicts typically cost more than the farm's budget, or None: the upper quartile of the verify
    boxes' CPU seconds (their cgroup's count) or wall seconds above it, over at least ``at_least`` verdicts."""
    verifies = [c for c in calls if c.op == "verify"]
    if len(verifies) < max(1, at_least):
        return None
    cpu = _upper_quartile([c.cpu_s for c in verifies])
    wall = _upper_quartile([c.wall_s for c in verifies])
    if cpu <= cpu_budget_s and wall <= wall_budget_s:
        return None
    what = f"{cpu:.2f} CPU seconds" if cpu > cpu_budget_s else f"{wall:.2f} seconds of wall time"
    return (f"a quarter of its {len(verifies)} verdicts cost more than {what} each (the farm's budget is "
            f"{cpu_budget_s:g} CPU and {wall_budget_s:g} wall seconds a verdict, measured in its boxes whatever its "
            f"manifest declares; the median was {statistics.median(c.cpu_s for c in verifies):.2f} CPU "
            "seconds)")


def _upper_quartile(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.75 * len(ordered)) - 1)]


def _task(op: str, value: dict[str, Any]) -> ContributedTask:
    prompt, public = value.get("prompt"), value.get("public", {})
    if not isinstance(prompt, str) or not prompt.strip():
        raise ContributedError(op, "the task has no prompt")
    if not isinstance(public, dict):
        raise ContributedError(op, "'public' must be a dict")
    # Posed with every attempt and stored in every trajectory of the task: its numbers and nesting held to the
    # record's domain here, where they are the environment's fault (NaN, an integer past int64, nesting no reader
    # can decode), not discovered by every stream and export that meets them.
    problem = domain.tree_problem(public, "public")
    if problem is not None:
        raise ContributedError(op, f"the task's {problem}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ContributedError(op, f"the prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS}")
    return ContributedTask(valid_text(prompt)[0], public)


def _final(op: str, value: dict[str, Any]) -> str:
    final = value.get("final")
    if not isinstance(final, str):
        raise ContributedError(op, "the reference's answer is not text")
    return final


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
