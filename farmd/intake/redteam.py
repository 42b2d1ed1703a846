"""Red-team agents: adversaries that run through a farm as ordinary rollouts (``farmctl redteam``).

``redteam:exploit:NAME`` submits the exploit library's attempt NAME for the task's kind, its oracle the
environment's own reference (so a contributed environment is attacked as a built-in is);
``redteam:escape:NAME`` submits escape NAME (``escapes.py``), which tries to get out of the box its code runs
in. Both are queued, leased, boxed, verified and stored like any rollout. Each raises a flag naming its
kind of attempt (``red_team_exploit`` / ``red_team_escape``; the agent spec names the technique), so its
trajectories can be found, kept as negative examples, and left out of the task bank's pass rates.

farmd hands ``make_red_team_agent`` to its workers (the agents' registry sits below the exploit library,
so it only parses the spec).
"""

from __future__ import annotations

from farmd.agents.base import Agent, AgentResult
from farmd.agents.registry import RedTeamSpec, parse_red_team_spec
from farmd.agents.scripted import played, reference_of
from farmd.envs.base import Attempt, Episode, Task, VerifyContext
from farmd.envs.catalog import EnvLookup
from farmd.envs.registry import get as get_builtin
from farmd.errors import AgentSpecError
from farmd.flags import RED_TEAM_ESCAPE, RED_TEAM_EXPLOIT
from farmd.intake.canaries import CanaryAgent
from farmd.intake.escapes import Marker
from farmd.intake.escapes import for_kind as escapes_for
from farmd.intake.exploits import for_kind, supplied_reference

NOT_AN_ATTACK = "not an attack here: the exploit's attempt is this task's right answer"


class RedTeamAgent(Agent):
    name = "redteam"

    def __init__(self, spec: RedTeamSpec, envs: EnvLookup, ctx: VerifyContext | None) -> None:
        self.spec = spec
        self._envs = envs
        self._ctx = ctx

    async def attempt(self, task: Task, episode: Episode | None, policy_version: int, *,
                      rollout_id: int = 0) -> AgentResult:
        env = self._envs(task.env)
        kind = env.exploit_kind
        spec = self.spec
        if spec.what == "exploit":
            exploit = next((e for e in for_kind(kind, slow=True) if e.name == spec.name), None)
            if exploit is None:
                raise AgentSpecError(f"no exploit {spec.name!r} for {kind or 'this'} kind of environment "
                                     f"({task.env})")
            reference = await reference_of(env, task, self._ctx)
            with supplied_reference(reference.final):
                attempt: Attempt = exploit.make(task)
            flag = RED_TEAM_EXPLOIT
            if task.kind != "actions" and attempt.final.strip() == reference.final.strip():
                # Where the answer is bare, "the right answer without its tags" is the right answer: verified
                # and stored all the same, and said to be no attack (``farmctl redteam`` counts it apart).
                result = await played(attempt, task, episode)
                result.flags.append(flag)
                result.error = NOT_AN_ATTACK
                return result
        else:
            escape = next((e for e in escapes_for(kind) if e.name == spec.name), None)
            if escape is None:
                raise AgentSpecError(f"no escape {spec.name!r} for {kind or 'this'} kind of environment "
                                     f"({task.env}): its attempts never run as code")
            attempt = escape.make(task, Marker(nonce=spec.nonce or "0" * 16, canary_port=spec.canary,
                                                       farm_port=spec.farm, data_dir=spec.data))
            flag = RED_TEAM_ESCAPE
        result = await played(attempt, task, episode)
        result.flags.append(flag)
        return result


def make_red_team_agent(spec: str, envs: EnvLookup | None, ctx: VerifyContext | None) -> Agent:
    parsed = parse_red_team_spec(spec)
    if parsed.what == "canary":  # intake's production canaries (``canaries.py``)
        return CanaryAgent(parsed, envs or get_builtin, ctx)
    return RedTeamAgent(parsed, envs or get_builtin, ctx)
