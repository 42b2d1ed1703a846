"""Re-scoring: stored trajectories verified again by their environment's current verifier.

A score is (trajectory, verifier version) → reward: a new verifier adds rows, nothing is
overwritten, and a trajectory this verifier version already scored is counted, not redone. A
verifier error is counted as an error, never stored as a score (``verify_safely``).

The store comes in as ``Scores`` (as the scheduler does for the worker, as ``Leases``): rollout
sits below the store in the module table, so it names the calls it needs instead of importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from farmd.envs import Attempt, Environment, VerifyContext, get, verify_safely
from farmd.envs.catalog import EnvLookup
from farmd.errors import FailedPrecondition
from farmd.flags import UNREADABLE
from farmd.records import Trajectory
from farmd.verifier import Verdict

PAGE = 200
"""Trajectories read per query: a page's bodies in memory at a time, not an environment's."""

ScoreRow = tuple[int, str, float, bool, str, list[str], list[str]]
"""(trajectory id, verifier version, reward, passed, status, reasons, flags), as the store adds them."""


class Scores(Protocol):
    async def scored_versions(self, env: str) -> dict[int, set[str]]: ...
    async def trajectories(self, *, after_seq: int = 0, limit: int = 100, env: str | None = None
                           ) -> list[Trajectory]: ...
    async def add_scores(self, rows: list[ScoreRow]) -> int: ...


@dataclass(frozen=True)
class Rescored:
    scored: int
    """Newly scored by this verifier version (a row added each)."""
    already: int
    """Scored by this verifier version before: left as they were."""
    errors: int
    """The verifier failed on them: no score stored, so a later rescore tries them again."""
    verifier_version: str


async def verify_stored(env: Environment, t: Trajectory, ctx: VerifyContext) -> Verdict:
    """``env``'s verdict, now, on the attempt ``t`` records (its final answer, and for an action task its actions
    replayed in a fresh episode): what rescoring and the coordinator's checks of nodes' verdicts both ask."""
    # Hidden test data is never stored: it is regenerated from (seed, difficulty).
    task = await env.make_task(t.seed, t.difficulty, ctx)
    attempt = Attempt(final=t.final, actions=[s.action for s in t.steps] if task.kind == "actions" else [])
    return await verify_safely(env, task, attempt, ctx)


async def rescore(scores: Scores, ctx: VerifyContext | None, env_name: str, limit: int | None = None, *,
                  envs: EnvLookup = get) -> Rescored:
    """Verify ``env_name``'s stored trajectories with its current verifier, in stream order, until
    ``limit`` have been counted (None: all of them), and add their scores. ``envs`` resolves the name
    (the node's catalog, for environments added at run time; default: the built-ins).

    ``ctx`` None is a node that runs no boxes: it cannot verify, and says where to rescore instead.
    """
    if ctx is None:
        raise FailedPrecondition("this node runs no boxes (--workers 0), so it cannot verify: "
                                 "rescore on a worker node", reason="NO_WORKERS")
    env = envs(env_name)
    done = await scores.scored_versions(env.name)
    scored = already = errors = 0
    rows: list[ScoreRow] = []
    after = 0
    while limit is None or scored + already + errors < limit:
        page = await scores.trajectories(after_seq=after, limit=PAGE, env=env.name)
        if not page:
            break
        after = page[-1].seq
        for t in page:
            if env.verifier_version in done.get(t.id, set()):
                already += 1
                continue
            if UNREADABLE in t.flags:  # a stored record the store could not read: nothing to verify again
                errors += 1
                continue
            verdict = await verify_stored(env, t, ctx)
            if verdict.status == "error":
                errors += 1
                continue
            rows.append((t.id, verdict.verifier_version, verdict.reward, verdict.passed, str(verdict.status),
                         verdict.reasons, verdict.flags))
            scored += 1
    await scores.add_scores(rows)
    return Rescored(scored=scored, already=already, errors=errors, verifier_version=env.verifier_version)
