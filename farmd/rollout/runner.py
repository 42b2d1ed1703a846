"""One rollout end to end: make the task, let the agent act (in boxes, through the environment),
verify, and write the trajectory record.

What is the attempt's fault is a result: a wrong answer, a crash of its code, a bound hit,
text that cannot be encoded, a verifier that fails on it but not on the task's reference
(``verify_safely``). What is not is an ``InfraFailure``, which the scheduler retries and never
scores: the model endpoint failing, a box that cannot start, a verifier that cannot judge the
task at all (``status == "error"``).

This is also where an attempt enters the farm's records, so it is the boundary for its text:
what the agent produced is judged as valid UTF-8 (``verify_safely``; flagged ``invalid_text`` if
anything was repaired, there or where a model's reply came in), and the trajectory is sealed to
the record's bounds before it is stored (``Trajectory.sealed``, which repairs what it keeps).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from farmd.agents import Agent
from farmd.agents.base import AgentResult
from farmd.agents.errors import AgentError, EndpointError
from farmd.envs import Environment, Episode, VerifyContext, judge_episode_safely, verify_safely
from farmd.errors import FarmError
from farmd.flags import INVALID_TEXT, TRUNCATED
from farmd.records import Job, Trajectory


class InfraFailure(Exception):
    """The rollout could not be produced honestly; retry it, never score it."""


async def run_rollout(job: Job, env: Environment, agent: Agent, ctx: VerifyContext, node: str) -> Trajectory:
    started = time.monotonic()
    try:
        # reasoning-gym can take a second to make a puzzle: off the event loop.
        task = await asyncio.to_thread(env.generate, job.seed, job.difficulty)
    except FarmError as exc:
        raise InfraFailure(f"cannot make the task: {exc}") from exc
    made = time.monotonic()
    episode: Episode | None = None
    try:
        if task.kind == "actions":
            episode = await env.episode(task, ctx)
        try:
            result = await agent.attempt(task, episode, job.policy_version)
        except EndpointError as exc:
            raise InfraFailure(f"the agent's endpoint failed: {exc}") from exc
        except AgentError as exc:
            raise InfraFailure(f"the agent failed: {exc}") from exc
        acted = time.monotonic()
        if episode is not None:
            verdict = await judge_episode_safely(env, task, episode, result.attempt.final, ctx)
        else:
            verdict = await verify_safely(env, task, result.attempt, ctx)
    except FarmError as exc:  # a box that could not start, a sandbox that failed
        raise InfraFailure(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if episode is not None:
            await episode.close()
    if verdict.status == "error":
        raise InfraFailure(f"the verifier could not judge: {'; '.join(verdict.reasons)[:500]}")
    if result.usage.get("repaired_chars"):  # repaired where the model's reply came in, before anyone saw it
        verdict.flag(INVALID_TEXT)
    if result.usage.get("clipped_replies"):
        verdict.flag(TRUNCATED)
    ended = time.monotonic()
    return Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version=task.env_version, seed=job.seed,
        difficulty=job.difficulty, agent=job.agent, policy_version=job.policy_version, reward=verdict.reward,
        passed=verdict.passed, status=verdict.status, reasons=verdict.reasons, flags=verdict.flags,
        verifier_version=verdict.verifier_version, steps=_steps(result, submission=episode is None),
        final=result.attempt.final, node=node, finished_at=time.time(),
        timings={"task_s": made - started, "agent_s": acted - made, "verify_s": ended - acted,
                 "total_s": ended - started},
        details={"verdict": verdict.details, "usage": result.usage, **({"agent_error": result.error}
                                                                       if result.error else {})},
    ).sealed()


def _steps(result: AgentResult, *, submission: bool) -> list[dict[str, Any]]:
    # A submission task's one step is the submission itself, which the record keeps as ``final``:
    # the step says when and how long, never the text again (an attempt is stored once).
    return [{"action": None if submission else s.action, "observation": s.observation, "exit_code": s.exit_code,
             "seconds": s.seconds} for s in result.steps]
