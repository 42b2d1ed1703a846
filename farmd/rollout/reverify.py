"""The coordinator's own word on what joined nodes report: their attempts verified again, and canary jobs run
again, on the coordinator's boxes.

A node runs untrusted code on its own machine and reports a verdict; farm believes no single participant, so the
coordinator checks. ``verify`` judges the attempt a stored record holds the way ``farmctl rescore`` does
(``verify_stored``: the task regenerated from its seed, the final answer judged, an action task's actions replayed
in a fresh episode), never reading the node's verdict. ``replicate`` runs a canary job (an agent whose attempt is a
function of the task alone: ``reference``, ``random``) end to end here, so the exact answer and verdict a node must
report are known. What a check means for the node is the scheduler's (``farmd.scheduler.checks``).
"""

from __future__ import annotations

import time
from typing import Any

from farmd.agents import make_agent
from farmd.envs import VerifyContext
from farmd.envs.catalog import EnvLookup
from farmd.errors import InfraFailure
from farmd.records import KNOWN_ANSWER_AGENT, Job, Score, Trajectory
from farmd.rollout.rescore import verify_stored
from farmd.rollout.runner import run_rollout

COORDINATOR = "coordinator"
"""The node name a replicated canary's record carries."""


class Rechecker:
    """Checks on ``ctx``'s boxes (the coordinator's: its workers', or the few it keeps for intake), environments
    looked up in ``envs`` (its catalog: contributed versions too)."""

    def __init__(self, ctx: VerifyContext, envs: EnvLookup) -> None:
        self._ctx = ctx
        self._envs = envs

    async def verify(self, trajectory: Trajectory) -> tuple[Score, dict[str, Any]]:
        """The coordinator's verdict on ``trajectory``'s attempt, as a score row, and the verdict's details (a
        kernel's say which rewards its timing cannot tell apart). ``InfraFailure`` when it cannot judge (the
        verifier errs on the task itself, a box will not start): then nothing is concluded."""
        env = self._envs(trajectory.env)
        verdict = await verify_stored(env, trajectory, self._ctx)
        if verdict.status != "ok":
            raise InfraFailure(f"the verifier could not judge: {'; '.join(verdict.reasons)[:300]}")
        return Score(verifier_version=verdict.verifier_version, reward=verdict.reward, passed=verdict.passed,
                     status=verdict.status, reasons=list(verdict.reasons), flags=list(verdict.flags),
                     scored_at=time.time()), dict(verdict.details)

    async def replicate(self, job: Job) -> Trajectory:
        """``job`` run here, start to end, by its agent (one of ``KNOWN_ANSWER_AGENT``): what a node that ran it
        honestly reports, up to timings."""
        if not KNOWN_ANSWER_AGENT.fullmatch(job.agent):
            raise ValueError(f"{job.agent!r} does not answer as a function of the task: it cannot be replicated")
        agent = make_agent(job.agent, envs=self._envs, ctx=self._ctx)
        return await run_rollout(job, self._envs(job.env), agent, self._ctx, COORDINATOR)
