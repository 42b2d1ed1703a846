"""Red-team agents: adversaries that run through a farm as ordinary rollouts (``farmctl redteam``).

``redteam:exploit:NAME`` submits the exploit library's attempt NAME for the task's kind, its oracle the
environment's own reference (so a contributed environment is attacked as a built-in is);
``redteam:escape:NAME`` submits escape NAME (``escapes.py``), which tries to get out of the box its code runs
in. Both are queued, leased, boxed, verified and stored like any rollout. Each raises a flag naming its
kind of attempt (``red_team_exploit`` / ``red_team_escape``; the agent spec names the technique), so its
trajectories can be found, kept as negative examples, and left out of the task bank's pass rates.

farmd hands ``make_red_team_agent`` to its workers (the agents' registry sits below the exploit library,
so it only parses the spec).

``plan`` is what a red-team run attacks: every exploit of an environment's kind meets every family of its
tasks (``Environment.families``: a shell puzzle family, a kernel's operation, a function's argument type), each
on the same seeds every run (the family's first ones, at the lowest level it appears at), so that a run holds
or breaches by what the farm does, never by which task the draw gave it. An escape does not look at its task
(it tries the box, whatever it was asked), so each meets one family of each environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from farmd.agents.base import Agent, AgentResult
from farmd.agents.registry import RedTeamSpec, parse_red_team_spec
from farmd.agents.scripted import played, reference_of
from farmd.envs.base import Attempt, Environment, Episode, Task, VerifyContext
from farmd.envs.catalog import CONTRIBUTED_PREFIX, EnvLookup
from farmd.envs.registry import get as get_builtin
from farmd.errors import AgentSpecError
from farmd.flags import RED_TEAM_ESCAPE, RED_TEAM_EXPLOIT
from farmd.intake.canaries import CanaryAgent
from farmd.intake.escapes import Marker
from farmd.intake.escapes import for_kind as escapes_for
from farmd.intake.exploits import for_kind, supplied_reference

T = TypeVar("T")

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



# -- the plan of a red-team run -------------------------------------------------------------------------------

SEARCH_SEEDS = 512
"""Seeds looked at, per level, for a family's first tasks (every built-in family shows within the first few)."""


@dataclass(frozen=True)
class Family:
    """One family of an environment's tasks, and the tasks a red-team run attacks it on."""

    env: str
    name: str
    difficulty: int
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class Attack:
    """One run of a red-team pass: one attempt (``spec``, an agent) at one family's tasks."""

    env: str
    family: str
    difficulty: int
    seeds: tuple[int, ...]
    spec: str
    tried: str
    """``exploit NAME`` or ``escape NAME``: what the report calls it."""


def families_of(env: Environment, seeds: int) -> list[Family]:
    """Every family of ``env``, at the lowest level it appears at, with its first ``seeds`` seeds there (0, 1,
    2, ...): the same tasks every run. A family none of the first ``SEARCH_SEEDS`` seeds of any level makes is
    left out (the plan's test holds every built-in to having none)."""
    wanted = env.families()
    found: dict[str, Family] = {}
    for difficulty in range(1, env.max_difficulty + 1):
        picked: dict[str, list[int]] = {}
        for seed in range(SEARCH_SEEDS):
            if all(f in found or len(picked.get(f, ())) >= seeds for f in wanted):
                break
            family = env.family_of(seed, difficulty)
            if family not in found and len(picked.setdefault(family, [])) < seeds:
                picked[family].append(seed)
        found.update({f: Family(env.name, f, difficulty, tuple(chosen)) for f, chosen in picked.items()
                      if f in wanted and f not in found and chosen})
        if len(found) == len(wanted):
            break
    return [found[f] for f in wanted if f in found]


def contributed_family(env: str, seeds: int) -> Family:
    """A contributed environment's tasks, as one family: its kinds of task are its author's to know."""
    return Family(env, env, 1, tuple(range(seeds)))


def plan(kinds: Mapping[str, str], families: Mapping[str, Sequence[Family]], *, exploits: Sequence[str] = (),
         max_exploits: int | None = None, escapes: bool = True, marker: str = "") -> list[Attack]:
    """Every attack a red-team run makes, in a fixed order: for each environment (``kinds``: its exploit kind)
    every exploit of its kind (``exploits``: only those named; ``max_exploits``: that many, spread over the
    library) at each of its ``families``, and with ``escapes`` each escape of its kind at its first family."""
    attacks = []
    for env, kind in kinds.items():
        # A contributed verifier's calls are bounded in seconds: the hangs cost that there, a judge's whole
        # wall time elsewhere.
        library = for_kind(kind, slow=env.startswith(CONTRIBUTED_PREFIX))
        if exploits:
            library = [e for e in library if e.name in exploits]
        chosen = library if max_exploits is None else spread(library, max_exploits)
        for family in families[env]:
            attacks += [Attack(env, family.name, family.difficulty, family.seeds, f"redteam:exploit:{e.name}",
                               f"exploit {e.name}") for e in chosen]
        if escapes and families[env]:
            first = families[env][0]
            query = f"?{marker}" if marker else ""
            attacks += [Attack(env, first.name, first.difficulty, first.seeds, f"redteam:escape:{e.name}{query}",
                               f"escape {e.name}") for e in escapes_for(kind)]
    return attacks


def spread(items: Sequence[T], n: int) -> list[T]:
    """``n`` of ``items``, spread over the list (a library is grouped by family: the first few are alike)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]
