"""Completions a trainer sampled itself, judged as farm judges its own rollouts (the Verify API).

The trainer names a task by its identity (environment, seed, difficulty) and sends the model's reply. The task
is made again here (its hidden tests from the seed and the farm's key, on the farm: nothing hidden is sent or
taken from the caller), the reply read as farm's chat agents read one (a code task's fenced code), and judged by
``verify_safely``: the judge's box, the task's rules, text repaired and flagged. Whatever the reply causes is
its verdict (0, flagged); a verifier that cannot judge is an ``InfraFailure`` for the whole call, never a 0.

Each judged completion becomes a trajectory record of agent ``verify:NAME``, sealed and checked as a rollout's
is; the caller stores them as finished groups (one per task reference in a call).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from farmd import domain
from farmd.agents.chat import SUBMISSION_SYSTEM, extract_code, task_text
from farmd.envs import Attempt, Environment, Task, VerifyContext, kind_of, verify_safely
from farmd.envs.catalog import EnvLookup
from farmd.errors import BadRequest, FarmError, InfraFailure, TaskError
from farmd.records import NODE_NAME, ChatMessage, Timings, Trajectory
from farmd.rollout.runner import posed

log = logging.getLogger("farmd.rollout.verify")

AGENT_PREFIX = "verify:"
"""Agents whose trajectories are completions a caller sent to be judged: ``verify:NAME``. Apart from farm's own
agent specs, so no caller can store attempts as ``reference``'s, a ``torch:`` policy's or a red team's."""
MAX_ITEMS = 256
"""Completions one call judges at most."""
MAX_COMPLETION_CHARS = 256 * 1024
"""The longest completion taken: as long as a stored message may be (a model's reply past any submission a
built-in verifier reads; an environment's own bound, under this, is its verdict's to hold: 0 and flagged)."""
MAX_SAMPLED = 1024
"""Tasks one SampleTasks call draws at most."""
MAX_SEED = (1 << 63) - 1
MAX_ENV_CHARS = 200
"""An environment's name, as a reference gives it, at most (the longest a farm serves is far shorter)."""
_INLINE_CHARS = 4096
"""Replies up to this long have their code taken out on the event loop; longer ones in a thread."""


@dataclass(frozen=True, slots=True)
class TaskRef:
    """A task by its identity: the farm makes the same task, and its hidden tests, from these again."""

    env: str
    seed: int
    difficulty: int


@dataclass(frozen=True, slots=True)
class Posed:
    """A task as a model is shown it: ``system`` then ``prompt`` (farm's chat agents send the same)."""

    ref: TaskRef
    task: Task
    system: str
    prompt: str


@dataclass(frozen=True, slots=True)
class Judged:
    """One item's outcome: its trajectory record (not stored yet), or why the farm could not make its task."""

    ref: TaskRef
    record: Trajectory | None
    error: FarmError | None


def agent_name(name: str) -> str:
    """The stored agent for a caller's ``name`` (``verify:NAME``); BadRequest for a malformed one."""
    if not NODE_NAME.fullmatch(name):
        raise BadRequest(f"a verify agent's name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
                         f"digit, not {name[:100]!r}")
    return AGENT_PREFIX + name


class Judges:
    """Judges completions by task reference, at most ``max_at_once`` at a time (each may hold a judge's box)."""

    def __init__(self, ctx: VerifyContext | None, envs: EnvLookup, node: str, max_at_once: int) -> None:
        self._ctx = ctx
        self._envs = envs
        self._node = node
        self._slots = asyncio.Semaphore(max(1, max_at_once))

    def environment(self, ref: TaskRef) -> Environment:
        """The environment that makes ``ref``'s task; BadRequest (or TaskError) when the farm cannot make it."""
        if not 0 < len(ref.env) <= MAX_ENV_CHARS:
            raise BadRequest(f"an environment's name is 1-{MAX_ENV_CHARS} characters, got {len(ref.env)}")
        env = self._envs(ref.env)  # TaskError (INVALID_ARGUMENT) naming the known ones
        if not 0 <= ref.seed <= MAX_SEED:
            raise BadRequest(f"a seed is below 2**63, got {ref.seed}")
        if not 1 <= ref.difficulty <= env.max_difficulty:
            raise BadRequest(f"{ref.env}: difficulty must be 1..{env.max_difficulty}, got {ref.difficulty}")
        if kind_of(env) != "submission":
            raise BadRequest(f"{ref.env} is played in actions through an episode: Verify judges one completion of a "
                             "submission task")
        return env

    def _context(self) -> VerifyContext:
        if self._ctx is None:
            raise InfraFailure("this farmd has no boxes to judge in (its host cannot isolate them)", transient=False)
        return self._ctx

    async def pose(self, ref: TaskRef) -> Posed:
        """``ref``'s task as a model is shown it (its public face only)."""
        env = self.environment(ref)
        async with self._slots:  # a contributed environment makes its tasks in boxes: as many at once as judges
            task = await self._make(env, ref)
        return Posed(ref=ref, task=task, system=SUBMISSION_SYSTEM, prompt=task_text(task))

    async def _make(self, env: Environment, ref: TaskRef) -> Task:
        try:
            return await env.make_task(ref.seed, ref.difficulty, self._context())
        except TaskError:
            raise
        except FarmError as exc:  # the farm failed to make a task it names: its failure, retried by the caller
            raise InfraFailure(f"cannot make the task {ref.env}/{ref.seed}@{ref.difficulty}: {exc}") from exc

    async def judge(self, agent: str, items: Sequence[tuple[TaskRef, str]]) -> list[Judged]:
        """Each (reference, completion) judged, in order: a record for each task the farm can make, the error for
        each it cannot. ``InfraFailure`` when any judging failed for a reason not the completion's: nothing of
        the call is kept then, and the caller tries it again."""
        refs = list(dict.fromkeys(ref for ref, _ in items))
        made: dict[TaskRef, Task | FarmError] = {}

        async def make(ref: TaskRef) -> None:
            try:
                env = self.environment(ref)
                made[ref] = await self._make(env, ref)
            except (BadRequest, TaskError) as exc:
                made[ref] = exc

        out: list[Judged | None] = [None] * len(items)

        async def one(i: int, ref: TaskRef, completion: str, task: Task) -> None:
            out[i] = Judged(ref, await self._judge_one(agent, ref, task, completion), None)

        try:
            async with asyncio.TaskGroup() as tg:
                for ref in refs:
                    tg.create_task(make(ref))
            async with asyncio.TaskGroup() as tg:  # the first infrastructure failure cancels the rest
                for i, (ref, completion) in enumerate(items):
                    task = made[ref]
                    if isinstance(task, FarmError):
                        out[i] = Judged(ref, None, task)
                    else:
                        tg.create_task(one(i, ref, completion, task))
        except* InfraFailure as group:
            raise group.exceptions[0] from None
        return [j for j in out if j is not None]

    async def _judge_one(self, agent: str, ref: TaskRef, task: Task, completion: str) -> Trajectory:
        env = self._envs(ref.env)
        ctx = self._context()
        async with self._slots:
            started_wall, started = time.time(), time.monotonic()
            if task.entry_point:  # the code of a reply to a code task, as farm's chat agents take it
                final = (extract_code(completion, task.entry_point) if len(completion) <= _INLINE_CHARS
                         else await asyncio.to_thread(extract_code, completion, task.entry_point))
            else:
                final = completion
            verdict = await verify_safely(env, task, Attempt(final=final), ctx)
            ended = time.monotonic()
        if verdict.status == "error":  # the judge could not judge: no attempt can be blamed, and no 0 is given
            log.warning("the verifier of %s could not judge a completion: %s", ref.env, "; ".join(verdict.reasons)[:500],
                        extra={"event": "verify_error", "env": ref.env, "seed": ref.seed, "agent": agent})
            raise InfraFailure(f"the verifier could not judge {ref.env}/{ref.seed}@{ref.difficulty}: "
                               f"{'; '.join(verdict.reasons)[:500]}")
        record = Trajectory(
            id=0, group_id=0, env=ref.env, env_version=task.env_version, seed=ref.seed, difficulty=ref.difficulty,
            agent=agent, policy_version=0, reward=verdict.reward, passed=verdict.passed, status=verdict.status,
            reasons=verdict.reasons, flags=verdict.flags, verifier_version=verdict.verifier_version, final=final,
            node=self._node, verdict_details=verdict.details, task=posed(task),
            messages=[ChatMessage(role="system", content=SUBMISSION_SYSTEM),
                      ChatMessage(role="user", content=task_text(task)),
                      ChatMessage(role="assistant", content=completion)],
            started_at=started_wall, finished_at=time.time(),
            timings=Timings(verify=ended - started, total=ended - started)).sealed()
        found = domain.problems(record, external=False)
        if found:  # the verdict and the reply are checked already: a record out of its domain is farm's own bug
            raise InfraFailure(f"a judged completion made a record out of its domain: {'; '.join(found[:3])}"[:1000])
        return record
