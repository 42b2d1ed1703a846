"""Production canaries: a contributed version keeps being checked after it is approved, by known-wrong
attempts mixed unannounced into its production jobs.

A verifier that behaves while intake looks and passes anything later (after a date, on some seeds, once it
has served a while) cannot be caught by any check run before approval. So a share of every approved
contributed version's jobs (``[intake] canary_share``, at least ``MIN_CANARY_SHARE``; the first jobs of a version
carry one at once) are canaries: on the very tasks the bank just handed out (the same seeds, queued beside
them, leased from the same queue by the same workers), an agent submits an attempt that is wrong by
construction: an exploit of the library for the version's kind, or a known-wrong answer made from the
reference (a near miss, another task's answer, the prompt echoed, nothing). The verifier's box sees what it
sees for any attempt: a task and a submission.

Their agents are ``redteam:canary:NAME`` (``CANARY_PREFIX``): a red team's, so the task bank and pass rates
leave them out, and trainer streams leave them out too. Any reward to one (or a pass) is a hack of that
version: the funnel quarantines it (``Funnel.watch_canaries``), which withdraws its trajectories and tells
their consumers, and records the canary as a finding.
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Sequence

from farmd.agents.base import Agent, AgentResult
from farmd.agents.registry import RedTeamSpec
from farmd.agents.scripted import played, reference_of
from farmd.envs.base import Attempt, Environment, Episode, Task, VerifyContext
from farmd.envs.catalog import EnvLookup
from farmd.errors import AgentSpecError
from farmd.flags import RED_TEAM_EXPLOIT
from farmd.intake.exploits import for_kind, supplied_reference
from farmd.intake.forms import near_miss, same
from farmd.intake.settings import MIN_CANARY_SHARE
from farmd.records import CANARY_PREFIX
from farmd.taskbank import SEED_SPACE

log = logging.getLogger("farmd.intake.canaries")

NEAR_MISS, OTHER_TASK, ECHO, EMPTY = ("known-wrong-near-miss", "known-wrong-other-task", "known-wrong-echo",
                                     "known-wrong-empty")
KNOWN_WRONG = (NEAR_MISS, OTHER_TASK, ECHO, EMPTY)
"""Mistakes made from the task and its reference: what a weak policy submits, no exploit about them."""
_KNOWN_WRONG_WEIGHTS = (3, 3, 1, 1)
_JUNK = "zq#7 lorem"


class ProductionCanaries:
    """Which canary jobs go beside the jobs queued on a served contributed version (the scheduler's
    ``CanaryPlan``). ``share``: of all its jobs, about this many are canaries."""

    def __init__(self, share: float, rng: random.Random | None = None) -> None:
        if not MIN_CANARY_SHARE <= share < 1:
            raise ValueError(f"canary_share is from {MIN_CANARY_SHARE} to below 1, not {share!r}")
        self.share = share
        self._rng = rng or random.SystemRandom()
        self._kinds: dict[str, str] = {}
        self._owed: dict[str, float] = {}

    def serve(self, env: str, kind: str) -> None:
        """``env`` (``contrib:NAME@VERSION``) is served now: its jobs get canaries, the first ones at once."""
        self._kinds[env] = kind
        self._owed.setdefault(env, 1.0)

    def unserve(self, env: str) -> None:
        self._kinds.pop(env, None)

    @property
    def served(self) -> list[str]:
        return list(self._kinds)

    def names(self, kind: str) -> list[str]:
        """Every canary a version of ``kind`` may get: the known-wrong answers and the library's exploits (the
        hangs left to tier 2, which pays a verifier's whole time limit for each)."""
        return [*KNOWN_WRONG, *(e.name for e in for_kind(kind))]

    def __call__(self, env: str, keys: Sequence[tuple[int, int]], jobs: int) -> list[tuple[int, int, str]]:
        kind = self._kinds.get(env)
        if kind is None or not keys or jobs <= 0:
            return []
        # Production jobs J carry J * share / (1 - share) canaries: the canaries' share of all is ``share``.
        owed = self._owed.get(env, 0.0) + jobs * self.share / (1 - self.share)
        due = int(owed) + (self._rng.random() < owed - int(owed))
        self._owed[env] = owed - due
        exploits = [e.name for e in for_kind(kind)]
        out = []
        for _ in range(due):
            seed, level = keys[self._rng.randrange(len(keys))]
            if exploits and self._rng.random() < 0.5:
                name = exploits[self._rng.randrange(len(exploits))]
            else:
                name = self._rng.choices(KNOWN_WRONG, _KNOWN_WRONG_WEIGHTS)[0]
            out.append((seed, level, CANARY_PREFIX + name))
        if out:
            log.debug("%d canaries beside %d jobs of %s", len(out), jobs, env,
                      extra={"event": "canaries_queued", "env": env, "canaries": len(out)})
        return out


class CanaryAgent(Agent):
    """``redteam:canary:NAME``: submits canary NAME's attempt, always wrong: where what NAME makes is the
    reference's answer after all (an exploit that only repackages it, on a task where the package is the bare
    answer), a near miss goes instead."""

    name = "canary"

    def __init__(self, spec: RedTeamSpec, envs: EnvLookup, ctx: VerifyContext | None) -> None:
        self.spec = spec
        self._envs = envs
        self._ctx = ctx

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        if task.kind == "actions":
            raise AgentSpecError(f"a canary submits one answer; {task.env} asks for actions")
        env = self._envs(task.env)
        reference = (await reference_of(env, task, self._ctx)).final
        final = await self._made(env, task, reference)
        if same(final, reference):
            final = near_miss(reference, task.entry_point)
        if same(final, reference):  # a reference no near miss can move (nothing in it)
            final = _JUNK
        result = await played(Attempt(final=final), task, episode)
        result.flags.append(RED_TEAM_EXPLOIT)
        return result

    async def _made(self, env: Environment, task: Task, reference: str) -> str:
        name = self.spec.name
        if name == NEAR_MISS:
            return near_miss(reference, task.entry_point)
        if name == ECHO:
            return task.prompt
        if name == EMPTY:
            return ""
        if name == OTHER_TASK:
            return await self._other_answer(env, task, reference)
        exploit = next((e for e in for_kind(env.exploit_kind or "") if e.name == name), None)
        if exploit is None:
            raise AgentSpecError(f"no canary {name!r} for {task.env}")
        try:
            with supplied_reference(reference):
                return exploit.make(task).final
        except Exception:  # an exploit that cannot read this task's shape: a plain mistake instead
            log.warning("canary %s cannot attack %s: a near miss instead", name, task.env, exc_info=True)
            return near_miss(reference, task.entry_point)

    async def _other_answer(self, env: Environment, task: Task, reference: str) -> str:
        """The right answer to another task at the same level: the right form, the wrong task."""
        if self._ctx is None:  # no boxes here to make another task in
            return near_miss(reference, task.entry_point)
        other = await env.make_task(secrets.randbelow(SEED_SPACE), task.difficulty, self._ctx)
        return (await reference_of(env, other, self._ctx)).final


def is_canary(agent: str) -> bool:
    return agent.startswith(CANARY_PREFIX)
