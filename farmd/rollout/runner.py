"""One rollout end to end: make the task, let the agent act (in boxes, through the environment),
verify, and write the trajectory record.

What is the attempt's fault is a result: a wrong answer, a crash of its code, a bound hit,
text that cannot be encoded, a verifier that fails on it but not on the task's reference
(``verify_safely``). What is not is an ``InfraFailure``, which is never scored and which the scheduler retries unless
it says trying again cannot help (an endpoint that refuses the request outright): the model
endpoint failing, a box that cannot start, a verifier that cannot judge the task at all
(``status == "error"``).

This is also where an attempt enters the farm's records, so it is the boundary for its text:
what the agent produced is judged as valid UTF-8 (``verify_safely``; flagged ``invalid_text`` if
anything was repaired, there or where a model's reply came in), and the trajectory is sealed to
the record's bounds before it is stored (``Trajectory.sealed``, which repairs what it keeps).
"""

from __future__ import annotations

import time
from dataclasses import fields

from farmd import domain
from farmd.agents import Agent
from farmd.agents.base import AgentResult
from farmd.envs import (
    Environment,
    Episode,
    EpisodeEnvironment,
    Task,
    VerifyContext,
    judge_episode_safely,
    kind_of,
    verify_safely,
)
from farmd.errors import AgentError, EndpointError, FarmError, InfraFailure, is_retried
from farmd.flags import INVALID_TEXT, TRUNCATED
from farmd.records import Job, PosedTask, SamplingParams, Step, Timings, Trajectory, Usage

__all__ = ["USAGE_FIELDS", "InfraFailure", "posed", "run_rollout"]


async def run_rollout(job: Job, env: Environment, agent: Agent, ctx: VerifyContext, node: str) -> Trajectory:
    started_wall = time.time()
    started = time.monotonic()
    try:
        task = await env.make_task(job.seed, job.difficulty, ctx)
    except FarmError as exc:  # tried again as its kind says: an unknown environment never makes the task
        raise InfraFailure(f"cannot make the task: {exc}", transient=is_retried(exc)) from exc
    made = time.monotonic()
    # How the agent acts is the environment's interface; the task's kind only tells the agent.
    if task.kind != kind_of(env):
        raise InfraFailure(f"{env.name} made a task of kind {task.kind!r} for an environment of kind {kind_of(env)!r}")
    played = env if isinstance(env, EpisodeEnvironment) else None
    episode: Episode | None = None
    try:
        if played is not None:
            episode = await played.episode(task, ctx)
        try:
            result = await agent.attempt(task, episode, job.policy_version, rollout_id=job.id)
        except EndpointError as exc:
            raise InfraFailure(f"the agent's endpoint failed: {exc}", transient=exc.transient) from exc
        except AgentError as exc:
            raise InfraFailure(f"the agent failed: {exc}", transient=is_retried(exc)) from exc
        acted = time.monotonic()
        if played is not None and episode is not None:
            verdict = await judge_episode_safely(played, task, episode, result.attempt.final, ctx)
        else:
            verdict = await verify_safely(env, task, result.attempt, ctx)
    except InfraFailure:
        raise  # it is a FarmError too: not to be wrapped again, which would hide its cause
    except FarmError as exc:  # a box that could not start (retried), a policy it was refused (not)
        raise InfraFailure(f"{type(exc).__name__}: {exc}", transient=is_retried(exc)) from exc
    finally:
        if episode is not None:
            await episode.close()
    if verdict.status == "error":
        raise InfraFailure(f"the verifier could not judge: {'; '.join(verdict.reasons)[:500]}")
    if result.usage.get("repaired_chars"):  # repaired where the model's reply came in, before anyone saw it
        verdict.flag(INVALID_TEXT)
    if result.usage.get("clipped_replies"):
        verdict.flag(TRUNCATED)
    for flag in result.flags:  # the agent's word about its own attempt (a red team's): never a score
        verdict.flag(flag)
    ended = time.monotonic()
    usage = result.usage
    made_record = Trajectory(
        id=job.id, group_id=job.group_id, env=job.env, env_version=task.env_version, seed=job.seed,
        difficulty=job.difficulty, agent=job.agent, reward=verdict.reward,
        # A model server's own word on its weights, when the agent read it back; else the version leased.
        policy_version=job.policy_version if result.policy_version is None else result.policy_version,
        passed=verdict.passed, status=verdict.status, reasons=verdict.reasons, flags=verdict.flags,
        verifier_version=verdict.verifier_version, steps=_steps(result, submission=episode is None),
        final=result.attempt.final, node=node, verdict_details=verdict.details, task=posed(task),
        messages=result.transcript, turns=result.turns, sampling=result.sampling or SamplingParams(),
        usage=Usage(**{k: int(usage[k]) for k in USAGE_FIELDS if isinstance(usage.get(k), int)}),
        agent_error=result.error or "", started_at=started_wall, finished_at=time.time(),
        timings=Timings(task=made - started, agent=acted - made, verify=ended - acted, total=ended - started),
    ).sealed()
    # Agents and verifiers check what they produce; a record still out of its domain is a bug of farm's own,
    # never the attempt's: not stored, retried. This is the check of the farm's own records: the store takes them
    # as checked (``Scheduler.complete``); a node's it checks itself.
    found = domain.problems(made_record, external=False)
    if found:
        raise InfraFailure(f"the rollout made a record out of its domain: {'; '.join(found[:3])}"[:1000])
    return made_record


USAGE_FIELDS = tuple(f.name for f in fields(Usage))


def posed(task: Task) -> PosedTask:
    """The task as the agent was given it: its public face only (a ``Task`` holds nothing hidden)."""
    return PosedTask(kind=task.kind, prompt=task.prompt, entry_point=task.entry_point or "",
                     answer_format=task.answer_format or "", examples=list(task.examples),
                     metadata=dict(task.metadata))


def _steps(result: AgentResult, *, submission: bool) -> list[Step]:
    # A submission task's one step is the submission itself, which the record keeps as ``final``:
    # the step says when and how long, never the text again (an attempt is stored once).
    return [Step(action="" if submission else s.action, observation=s.observation or "", exit_code=s.exit_code,
                 duration=s.seconds, violations=list(s.violations)) for s in result.steps]
