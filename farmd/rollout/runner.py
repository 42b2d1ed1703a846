"""One rollout end to end: make the task, let the agent act (in boxes, through the environment),
verify, and write the trajectory record.

What is the attempt's fault is a result: a wrong answer, a crash of its code, a bound hit.
What is not is an ``InfraFailure``, which the scheduler retries and never scores: the
model endpoint failing, a box that cannot start, a verifier that could not judge
(``status == "error"``).
"""

from __future__ import annotations

import asyncio
import time

from farmd.agents import Agent
from farmd.agents.errors import AgentError, EndpointError
from farmd.envs import Environment, Episode, VerifyContext, verify_safely
from farmd.errors import FarmError
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
            verdict = await env.judge_episode(task, episode, result.attempt.final, ctx)
        else:
            verdict = await verify_safely(env, task, result.attempt, ctx)
    except FarmError as exc:  # a box that could not start, a sandbox that failed
        raise InfraFailure(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if episode is not None:
            await episode.close()
    if verdict.status == "error":
        raise InfraFailure(f"the verifier could not judge: {'; '.join(verdict.reasons)[:500]}")
    ended = time.monotonic()
    return Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version=task.env_version, seed=job.seed,
        difficulty=job.difficulty, agent=job.agent, policy_version=job.policy_version, reward=verdict.reward,
        passed=verdict.passed, status=verdict.status, reasons=verdict.reasons, flags=verdict.flags,
        verifier_version=verdict.verifier_version,
        steps=[{"action": s.action, "observation": s.observation, "exit_code": s.exit_code, "seconds": s.seconds}
               for s in result.steps],
        final=result.attempt.final, node=node, finished_at=time.time(),
        timings={"task_s": made - started, "agent_s": acted - made, "verify_s": ended - acted,
                 "total_s": ended - started},
        details={"verdict": verdict.details, "usage": result.usage, **({"agent_error": result.error}
                                                                       if result.error else {})},
    )
