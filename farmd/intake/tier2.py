"""Tier 2 of intake for a contributed environment: its verifier attacked, every attempt judged for real by
the submitted verifier in its own boxes (``BoxedEnvironment.verify``).

The attacks:

- the exploit library for the manifest's kind (``exploits.for_kind``), made for each task asked with the
  environment's own reference as the right answer (computed in its box first: ``supplied_reference``);
- impossible-task canaries: the prompt of ``seed`` with the hidden data of another seed (see
  ``env_runner``). The answer right for the prompt, and the exploits made from it, are wrong there by
  construction; a pair whose two references agree is no canary and is skipped;
- the probes of ``probes``, over the tasks asked and a ``sample`` of more: forged output learned from the
  verifier's own reference runs, the answer leaked in the public task under a transform, constant answers,
  answers the prompt does not decide;
- an LLM attacker (``attacker``), when one is configured: shown the source and one task, its proposals
  are run on that task.

Any reward (or a pass) for any of these attempts is a false positive: a blocking finding with the attempt
as evidence, one per exploit (or per canary attack, or per attacker proposal) naming every task it won
on. An attempt the environment's own reference would write (equal after trimming) is the right answer,
not an attack, and is not sent. A verifier that crashes on an attempt has not passed it: a note (a
rollout would score 0 and be flagged), not a rejection. An attacker that cannot run is infrastructure:
a note, never a pass and never a rejection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from farmd.envs.base import Task
from farmd.errors import AttackerError, ContributedError
from farmd.intake import probes
from farmd.intake.attacker import Attacker
from farmd.intake.boxed import BoxedEnvironment, ContributedTask, Variant
from farmd.intake.checks import Finding
from farmd.intake.exploits import Exploit, for_kind, supplied_reference
from farmd.intake.probes import CONSTANT, FORGED, LEAK, PROBES, Known, Try
from farmd.text import clip
from farmd.verifier.answer import extract_single_answer

log = logging.getLogger("farmd.intake.tier2")

EXPLOIT, CANARY, ATTACKER = "tier2_exploit", "tier2_canary", "tier2_attacker"
CANARY_STRIDE = 1_000_003
"""A canary's hidden data comes from ``seed + n * CANARY_STRIDE``: far from any seed a caller asks for."""
CANARY_TRIES = 3
"""Other seeds tried for one canary before giving up on it (their references all agreed with the prompt's)."""
PROMPT_ANSWER = "the prompt's answer"
EVIDENCE_CHARS = 500


@dataclass(frozen=True)
class Tier2Report:
    findings: list[Finding]
    """Blocking findings (a rewarded attack) and notes (``blocking=False``: a crash, an attacker down)."""
    tried: int
    """Attempts judged by the verifier."""
    rewarded: int
    """Of those, the ones it gave reward or a pass: each a false positive."""
    attacker_tokens: int
    """What the LLM attacker cost, in tokens (0 without one)."""

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


@dataclass(frozen=True)
class _Attempt:
    check: str
    source: str
    """The exploit's name, ``PROMPT_ANSWER`` or the attacker's proposal number."""
    seed: int
    level: int
    final: str
    canary_seed: int | None = None
    why: str = ""


@dataclass
class _Outcome:
    attempt: _Attempt
    reward: float = 0.0
    passed: bool = False
    error: str | None = None

    @property
    def rewarded(self) -> bool:
        return self.error is None and (self.passed or self.reward > 0)


@dataclass
class _Run:
    """What tier 2 has found so far."""

    outcomes: list[_Outcome] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)
    tokens: int = 0


def _task(env: BoxedEnvironment, seed: int, level: int, task: ContributedTask) -> Task:
    """``task`` as the exploit library's ``Task``: its prompt, and the public fields it knows by name."""
    m = env.manifest
    public = task.public
    entry = public.get("entry_point")
    raw = public.get("examples")
    # special-case-examples and several-answers read examples as {"input": ..., "output": ...}.
    examples = [e for e in raw if isinstance(e, dict) and "input" in e and "output" in e] \
        if isinstance(raw, list) else []
    return Task(env=m.env_name, env_version=m.version, seed=seed, difficulty=level, prompt=task.prompt,
                examples=examples, entry_point=entry if isinstance(entry, str) and entry.isidentifier() else None,
                metadata=dict(public))


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def _core(reference: str) -> str:
    """The answer inside a reference's final text (its block's content, or the text itself)."""
    inside, _ = extract_single_answer(reference)
    return (inside or reference).strip()


def _exploit_attempts(exploits: Sequence[Exploit], check: str, task: Task, answer: str,
                      canary_seed: int | None = None) -> list[_Attempt]:
    """Each exploit's attempt at ``task`` whose right answer is ``answer``; one per distinct text."""
    made: dict[str, _Attempt] = {}
    with supplied_reference(answer):
        for exploit in exploits:
            try:
                final = exploit.make(task).final
            except Exception:  # a library exploit that cannot read this task's shape is not the env's fault
                log.warning("exploit %s cannot attack %s: skipped", exploit.name, task.env, exc_info=True)
                continue
            if not _same(final, answer) and final not in made:
                made[final] = _Attempt(check, exploit.name, task.seed, task.difficulty, final, canary_seed)
    return list(made.values())


async def _judge(env: BoxedEnvironment, attempts: Sequence[_Attempt], parallel: int) -> list[_Outcome]:
    limit = asyncio.Semaphore(parallel)

    async def one(attempt: _Attempt) -> _Outcome:
        async with limit:
            try:
                verdict = await env.verify(attempt.seed, attempt.level, attempt.final,
                                           canary_seed=attempt.canary_seed)
            except ContributedError as exc:
                return _Outcome(attempt, error=exc.evidence)
        return _Outcome(attempt, verdict.reward, verdict.passed)

    async with asyncio.TaskGroup() as group:
        running = [group.create_task(one(a)) for a in attempts]
    return [r.result() for r in running]


async def _canary(env: BoxedEnvironment, seed: int, level: int, answer: str,
                  draw: Callable[[int], int] | None = None) -> tuple[int, str] | None:
    """A canary seed for ``(seed, level)`` and the mixed task's reference, where that differs from ``answer``."""
    for n in range(1, CANARY_TRIES + 1):
        canary_seed = draw(level) if draw is not None else seed + n * CANARY_STRIDE
        try:
            mixed = await env.reference(seed, level, canary_seed=canary_seed)
        except ContributedError:
            continue  # a reference that cannot answer a contradictory task says nothing of the verifier
        if not _same(mixed, answer):
            return canary_seed, mixed
    return None


def _canary_attempts(exploits: Sequence[Exploit], task: Task, answer: str, canary_seed: int,
                     mixed: str) -> list[_Attempt]:
    """The prompt's answer, and the exploits made from it, minus any that hold the canary's own answer:
    those could be right there, and the untouched task has judged them already."""
    core = _core(mixed)
    attempts = [_Attempt(CANARY, PROMPT_ANSWER, task.seed, task.difficulty, answer, canary_seed)]
    attempts += [a for a in _exploit_attempts(exploits, CANARY, task, answer, canary_seed)
                 if not (core and core in a.final)]
    return [a for a in attempts if not _same(a.final, mixed)]


def _squash(text: str) -> str:
    return "".join(text.split())


async def _attack(env: BoxedEnvironment, attacker: Attacker, budget: int, seed: int, level: int,
                  task: ContributedTask, answer: str, run: _Run) -> list[_Attempt]:
    """The attacker's proposals for one task, minus the right answer; a note when it could not run."""
    try:
        attack = await attacker.propose(env.package, task, budget)
    except AttackerError as exc:
        run.tokens += exc.tokens
        run.notes.append(Finding(ATTACKER, f"the LLM attacker could not run: {exc}",
                                 "nothing for the contributor: the attacker's endpoint is farm's to fix; run tier 2 "
                                 "again once it answers", blocking=False))
        return []
    run.tokens += attack.tokens
    # A model that solved the task, spacing aside, proposed the right answer, not an attack.
    return [_Attempt(ATTACKER, f"proposal {n}", seed, level, p.final, why=p.why)
            for n, p in enumerate(attack.proposals, 1) if _squash(p.final) != _squash(answer)]


def _shown(text: str) -> str:
    return json.dumps(clip(text, EVIDENCE_CHARS)[0])


def _where(outcomes: Sequence[_Outcome]) -> str:
    first = outcomes[0].attempt
    where = f"(seed {first.seed}, level {first.level})"
    if first.canary_seed is not None:
        where += f" given the hidden data of seed {first.canary_seed}"
    more = [(o.attempt.seed, o.attempt.level) for o in outcomes[1:]]
    return where + (f", and on {len(more)} more: {more[:8]}" if more else "")


def _finding(source: str, outcomes: list[_Outcome], describe: dict[str, str]) -> Finding:
    """One blocking finding for the rewarded outcomes of one attack."""
    first = outcomes[0]
    a = first.attempt
    won = f"earned reward {first.reward:g} (passed: {str(first.passed).lower()}) on task {_where(outcomes)}"
    if a.check == EXPLOIT:
        return Finding(EXPLOIT, f"exploit {source!r} ({describe.get(source, '')}) {won}; it submitted "
                       f"{_shown(a.final)}",
                       "judge the whole submission against what 'hidden' expects, exactly, and score every other "
                       "form of it (packaged, hedged, gamed) 0")
    if a.check == CANARY:
        what = "the answer right for the prompt as shown" if source == PROMPT_ANSWER else f"exploit {source!r}"
        return Finding(CANARY, f"on an impossible task (a prompt whose hidden data contradicts it), {what} {won}; "
                       f"it submitted {_shown(a.final)}",
                       "judge by the task's 'hidden' data only: never recompute the expected answer from the prompt, "
                       "and never pass an attempt the hidden data does not support")
    if a.check == FORGED:
        return Finding(FORGED, f"a forged attempt ({source}: what the verifier read from its own reference runs, "
                       f"without solving the task) {won}; it submitted {_shown(a.final)}",
                       "judge values the verifier computes from the submission itself, never text the submission "
                       "prints or writes: it can print anything")
    if a.check == LEAK:
        return Finding(LEAK, f"the answer read off the public task ({source}; {a.why}) {won}; it submitted "
                       f"{_shown(a.final)}",
                       "keep the expected answer, in any form, in 'hidden'; and judge the answer exactly, not "
                       "up to case, spacing or order")
    if a.check == CONSTANT:
        return Finding(CONSTANT, f"{source}, though the task's answer is another, {won}; it submitted "
                       f"{_shown(a.final)}",
                       "compare the submission with this task's expected answer from 'hidden', exactly")
    return Finding(ATTACKER, f"the LLM attacker's {source} {won}; it submitted {_shown(a.final)} (its reasoning: "
                   f"{_shown(a.why)})",
                   "close the flaw the proposal exploits: only a correct answer may earn reward")


def _report(run: _Run, describe: dict[str, str]) -> Tier2Report:
    rewarded: dict[tuple[str, str], list[_Outcome]] = {}
    crashed: dict[str, list[_Outcome]] = {}
    for outcome in run.outcomes:
        if outcome.rewarded:
            rewarded.setdefault((outcome.attempt.check, outcome.attempt.source), []).append(outcome)
        # A verifier may fairly trip over a canary, whose parts disagree: no real task does.
        elif outcome.error is not None and outcome.attempt.check != CANARY:
            crashed.setdefault(outcome.attempt.check, []).append(outcome)
    findings = [_finding(source, outcomes, describe) for (_, source), outcomes in rewarded.items()]
    for check, outcomes in crashed.items():
        # One note per attack: a verifier that trips over malformed text trips over most of the library.
        a = outcomes[0].attempt
        sources = list(dict.fromkeys(o.attempt.source for o in outcomes))
        findings.append(Finding(check, f"verify failed on {len(outcomes)} attempts ({', '.join(sources[:12])}"
                                f"{', ...' if len(sources) > 12 else ''}); the first, {a.source} at task "
                                f"(seed {a.seed}, level {a.level}), submitted {_shown(a.final)} and got: "
                                f"{outcomes[0].error}",
                                "make `verify` judge any text, failing what is wrong (a crash scores a rollout 0 "
                                "and flags it)", blocking=False))
    return Tier2Report(findings + run.notes, tried=len(run.outcomes),
                       rewarded=sum(o.rewarded for o in run.outcomes), attacker_tokens=run.tokens)


async def run_tier2(env: BoxedEnvironment, keys: Sequence[tuple[int, int]], *, attacker: Attacker | None = None,
                    attack_budget: int = 8, canaries: int = 2, parallel: int = 2,
                    exploits: Sequence[Exploit] | None = None, sample: Sequence[tuple[int, int]] = (),
                    probes_asked: Collection[str] = PROBES, draw: Callable[[int], int] | None = None) -> Tier2Report:
    """Attack ``env``'s verifier on the tasks ``keys`` ((seed, level) pairs): the exploit library on each,
    ``canaries`` impossible tasks (spread over ``keys``), the ``probes_asked`` (``probes.PROBES``) over ``keys``
    and ``sample`` (more tasks, solved to see how answers spread), and ``attacker`` with ``attack_budget``
    proposals on the first. ``parallel`` boxes at a time; ``exploits``: the library to run (None: every exploit
    of the manifest's kind); ``draw``: a level's fresh seed as production draws it (the canaries' hidden data).
    What the boxes cost is in ``env.calls``."""
    run = _Run()
    known: dict[tuple[int, int], tuple[ContributedTask, str]] = {}
    attempts: list[_Attempt] = []
    if env.batch:  # calls share boxes (a verifiers package): more in flight fill them
        parallel = max(parallel, env.parallel)
    limit = asyncio.Semaphore(max(1, parallel))
    wanted = list(dict.fromkeys(keys))
    extra = [k for k in dict.fromkeys(sample) if k not in set(wanted)] if probes_asked else []
    solved = await asyncio.gather(*[_solve(env, k, limit) for k in wanted + extra])
    for (seed, level), made in zip(wanted, solved, strict=False):
        if isinstance(made, ContributedError):
            run.notes.append(Finding(EXPLOIT, f"task (seed {seed}, level {level}) could not be attacked: {made}",
                                     "make `generate` and `reference` work on every task (tier 1 says how)",
                                     blocking=False))
            continue
        known[(seed, level)] = made
    # A contributed call is bounded in seconds (``[bounds]``): the hangs cost that, so they run here.
    exploits = _library(env.manifest.kind, [answer for _, answer in known.values()]) if exploits is None \
        else list(exploits)
    describe = {e.name: e.description for e in exploits}
    for (seed, level), (task, answer) in known.items():
        attempts += _exploit_attempts(exploits, EXPLOIT, _task(env, seed, level, task), answer)
    sampled = {k: made for k, made in zip(extra, solved[len(wanted):], strict=True)
               if not isinstance(made, ContributedError)}
    ordered = list(known)
    spread = min(max(canaries, 0), len(ordered))
    picked = [ordered[i * len(ordered) // spread] for i in range(spread)]
    made_canaries = 0
    # Together: each canary's tries follow one another, but the tasks' do not wait on each other (and share
    # boxes where calls do).
    canaried = await asyncio.gather(*[_canary(env, seed, level, known[(seed, level)][1], draw)
                                      for seed, level in picked])
    for (seed, level), found in zip(picked, canaried, strict=True):
        task, answer = known[(seed, level)]
        if found is not None:
            made_canaries += 1
            attempts += _canary_attempts(exploits, _task(env, seed, level, task), answer, *found)
    if picked and not made_canaries:
        run.notes.append(Finding(CANARY, f"no canary could be made on {picked}: with another seed's hidden data "
                                 "the reference gave the same answer (or failed)",
                                 "nothing to fix if the hidden data cannot change the answer; otherwise draw the "
                                 "hidden data from the seed", blocking=False))
    targets = [Known(*k, *known[k]) for k in ordered]
    everything = targets + [Known(*k, *made) for k, made in sampled.items()]
    findings, tries = await _probe(env, probes_asked, targets, everything, limit)
    attempts += [_Attempt(t.check, t.source, t.seed, t.level, t.final, why=t.why) for t in tries]
    async with asyncio.TaskGroup() as group:  # the attacker thinks while the boxes judge
        judged = group.create_task(_judge(env, attempts, max(1, parallel)))
        proposed = group.create_task(_attack(env, attacker, attack_budget, *ordered[0], *known[ordered[0]], run)) \
            if attacker is not None and attack_budget > 0 and ordered else None
    run.outcomes = judged.result()
    if proposed is not None:
        run.outcomes += await _judge(env, proposed.result(), max(1, parallel))
    run.notes[:0] = findings
    report = _report(run, describe)
    log.info("tier 2 of %s %s: %d attempts, %d rewarded, %d blocking findings, %d attacker tokens",
             env.manifest.env_name, env.manifest.version, report.tried, report.rewarded, len(report.blocking),
             report.attacker_tokens)
    return report


_BARE_WRONG = frozenset({"hedge-or", "hedge-comma", "hedge-lines", "every-small-integer", "echo-prompt",
                         "echo-expression", "prompt-completion", "prompt-injection", "empty", "blank"})
"""The bare-answer exploits whose text holds another value beside the right one, or none: wrong whatever the
format. (The others write the right value another way, "+3" or "3.0": a free-form answer verifier may take
those, and that rewards no wrong answer.)"""


def _library(kind: str, answers: Sequence[str]) -> list[Exploit]:
    """The exploit library for ``kind``; for an ``answer`` environment whose answers are bare (no ``<answer>``
    block, so the library's blocked forms fail it for their tags alone), the bare-answer kind's wrong ones too,
    named ``bare:``: hedges and echoes aimed at the form its answers really take."""
    library = for_kind(kind, slow=True)
    if kind == "answer" and answers and all(extract_single_answer(a)[0] is None for a in answers):
        library += [dataclasses.replace(e, name="bare:" + e.name) for e in for_kind("bare-answer", slow=True)
                    if e.name in _BARE_WRONG]
    return library


async def _solve(env: BoxedEnvironment, key: tuple[int, int], limit: asyncio.Semaphore
                 ) -> tuple[ContributedTask, str] | ContributedError:
    async with limit:
        try:
            return await env.solve(*key)
        except ContributedError as exc:
            return exc


async def _probe(env: BoxedEnvironment, asked: Collection[str], targets: list[Known], everything: list[Known],
                 limit: asyncio.Semaphore) -> tuple[list[Finding], list[Try]]:
    """The probes' findings by themselves (a leak, near-constant answers, answers the prompt does not decide)
    and their attempts, to be judged with the rest."""
    kind = env.manifest.kind
    findings: list[Finding] = []
    tries: list[Try] = []
    if "leaks" in asked:
        leaks = await asyncio.to_thread(lambda: {k.key: probes.find_leaks(k.task, k.answer) for k in everything})
        places = probes.systematic(leaks)
        findings += probes.leak_findings(leaks, places)
        tries += [t for k in everything for t in probes.leak_tries(k, leaks[k.key], places)]
    if "constants" in asked:
        near = probes.near_constant(everything, kind)
        findings += [near] if near is not None else []
        tries += probes.constant_tries(everything, kind)
    if "forged" in asked:
        traces = await _traces(env, targets + [k for k in everything if k not in targets][:2], limit)
        tries += probes.forged_tries(targets, everything, traces, kind)
    if "underivable" in asked:
        findings += await _underivable(env, everything, limit)
    return findings, tries


async def _traces(env: BoxedEnvironment, known: Sequence[Known], limit: asyncio.Semaphore
                  ) -> dict[tuple[int, int], str]:
    """What the verifier's children printed while it judged each task's reference (what it parses)."""

    async def one(k: Known) -> tuple[tuple[int, int], str]:
        async with limit:
            try:
                verdict = await env.verify(*k.key, k.answer, trace=True)
            except ContributedError:
                return k.key, ""
        return k.key, "\n".join(verdict.trace)

    return dict(await asyncio.gather(*[one(k) for k in known]))


UNDERIVABLE_TASKS = 2
"""Tasks whose hidden choices, and public ones, are drawn again to see whether the answer moves alone."""


async def _underivable(env: BoxedEnvironment, everything: list[Known], limit: asyncio.Semaphore) -> list[Finding]:
    """Answers an agent cannot derive: tasks posed alike whose verifier refuses each other's answers."""
    checks: list[tuple[Known, str, str]] = []
    for a, b in probes.alike(everything):
        checks.append((a, b.answer, f"task (seed {b.seed}, level {b.level})"))
    variants = [(Variant(hidden=secrets.randbits(32)), "the same task with other hidden random choices"),
                (Variant(rng_salt=secrets.token_hex(8)), "the same seed with other random choices of its own")]

    async def redrawn(k: Known, variant: Variant, how: str) -> tuple[Known, str, str] | None:
        async with limit:
            try:
                task, answer = await env.solve(*k.key, variant=variant)
            except ContributedError:
                return None
        again = Known(*k.key, task, answer)
        if again.shown != k.shown or again.core.casefold() == k.core.casefold():
            return None
        return k, answer, how

    drawn = await asyncio.gather(*[redrawn(k, v, how) for k in everything[:UNDERIVABLE_TASKS]
                                   for v, how in variants])
    checks += [c for c in drawn if c is not None]

    async def refused(k: Known, answer: str, how: str) -> Finding | None:
        async with limit:
            try:
                verdict = await env.verify(*k.key, answer)
            except ContributedError as exc:
                return probes.underivable_finding(k, answer, how, f" ({exc.evidence[:200]})")
        if verdict.passed or verdict.reward > 0:
            return None  # several answers are right: the other task's is right here too
        return probes.underivable_finding(k, answer, how)

    found = await asyncio.gather(*[refused(*c) for c in checks])
    return [f for f in found if f is not None][:4]
