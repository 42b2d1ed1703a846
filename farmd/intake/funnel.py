"""The intake funnel: a submitted environment goes through tier 1 (structure), tier 2 (attacks) and tier 3
(a person), and only then serves tasks; bounties pay for accepted ones, reputation decides scrutiny, and a
hack found later quarantines a version.

States (``farmd.store.intake.STATES``): ``checking`` (tiers 1-2 running, or due after a restart) →
``rejected`` (a blocking finding, or a reviewer) or ``in_review`` (the queue) → ``approved`` (served as
``contrib:NAME@VERSION``) → ``quarantined``. A re-review (the author was caught planting an exploit) sends a
version back to ``checking`` as a new round, under full scrutiny, and stops serving it meanwhile.

The funnel runs the contributed code only through ``BoxedEnvironment``: every call a fresh box, bounded,
with a per-task seed and never the farm's key. An infrastructure failure while checking (a box that will
not start) is never a verdict: the submission stays ``checking`` and is tried again.

A check cannot be told from production: its seeds are drawn as the task bank draws production's (the farm's
keyed ``SeedSequence``, from the stretch production serves first), and production keeps checking: a share of
every approved version's jobs are canaries (``canaries.py``) whose rewards ``watch_canaries`` reads; one
rewarded quarantines the version. What checking costs is bounded per submission (``check_box_s``) and per
verdict (``verdict_cpu_s``, ``verdict_wall_s``), and ``parallel_checks`` submissions are checked at once, so a
slow one holds one slot for a bounded time, never the funnel.

Serving is the daemon's: the funnel calls ``serve(env, package)`` on approval and ``unserve(env)`` when a
version stops serving, so intake never reaches into the scheduler or the task bank.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from farmd.errors import (
    BadRequest,
    CheckBudgetSpent,
    Conflict,
    FailedPrecondition,
    FarmError,
    Forbidden,
    NotFound,
    PackageError,
)
from farmd.intake import reputation
from farmd.intake.attacker import Attacker
from farmd.intake.boxed import BoxedEnvironment, Call
from farmd.intake.canaries import ProductionCanaries
from farmd.intake.checks import Finding
from farmd.intake.contributed_checks import tier1_report
from farmd.intake.exploits import fingerprint
from farmd.intake.package import Package, read_package
from farmd.intake.probes import COST, verdict_cost
from farmd.intake.settings import IntakeConfig
from farmd.intake.tier2 import run_tier2
from farmd.sandbox import Sandbox
from farmd.store import Store
from farmd.store.intake import (
    BountyRow,
    CanaryRow,
    ContributorRow,
    CostRow,
    FindingRow,
    LedgerRow,
    SubmissionRow,
)
from farmd.taskbank import CHECK_HORIZON, SeedSequence
from farmd.text import bounded, is_sha256
from farmd.verifier import VerifierKey

log = logging.getLogger("farmd.intake")

MAX_NOTE_CHARS = 4000
MAX_FIELD_CHARS = 2000
CANARY_CHECK = "production_canary"
_CANARY_CURSOR = "intake_canaries"
_CANARIES_READ = 500
_REVIEW_CAP_S = 2 * 3600.0
"""A reviewer's time taken from their first look is capped: a submission left open overnight is not work."""
_SOUND_EVERY_S = 60.0

Serve = Callable[[str, Package], Awaitable[None]]
Unserve = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Prices:
    box_cpu_hour_usd: float
    attacker_usd_per_mtok: float
    review_hour_usd: float

    def usd(self, cost: CostRow) -> float:
        return (cost.box_cpu_s / 3600 * self.box_cpu_hour_usd + cost.attacker_tokens / 1e6 * self.attacker_usd_per_mtok
                + cost.review_s / 3600 * self.review_hour_usd)


def _row(f: Finding, tier: int) -> FindingRow:
    return FindingRow(tier, bounded(f.check, 100), bounded(f.evidence, MAX_FIELD_CHARS), bounded(f.fix, MAX_FIELD_CHARS),
                      getattr(f, "blocking", True))


def _cost(tier: int, calls: Sequence[Call], tokens: int = 0) -> CostRow:
    return CostRow(tier, sum(c.cpu_s for c in calls), sum(c.wall_s for c in calls), len(calls), tokens)


@dataclass(frozen=True, slots=True)
class Standing:
    """A contributor as the funnel answers for them: their rows, the trust those earn, their ledger newest first."""

    row: ContributorRow
    trust: reputation.Trust
    ledger: list[LedgerRow]


@dataclass(frozen=True, slots=True)
class Figures:
    """The funnel's arithmetic: submissions by state, checking cost per tier, what accepting an environment cost
    (every submission's checking and every payout, over the environments accepted; None before the first)."""

    states: dict[str, int]
    tiers: list[CostRow]
    accepted: int
    payouts_usd: float
    total_usd: float
    usd_per_accepted: float | None
    per_accepted: CostRow | None


class Funnel:
    def __init__(self, store: Store, sandbox: Sandbox | None, key: VerifierKey, config: IntakeConfig, *,
                 serve: Serve, unserve: Unserve, attacker: Attacker | None = None) -> None:
        self._store = store
        self._records = store.intake
        self._sandbox = sandbox
        self._key = key
        self.config = config
        self.prices = Prices(config.box_cpu_hour_usd, config.attacker_usd_per_mtok, config.review_hour_usd)
        self._serve_env = serve
        self._unserve_env = unserve
        self._attacker = attacker
        self._checking: dict[int, asyncio.Task[None]] = {}
        self._costing: dict[int, BoxedEnvironment] = {}
        """The environment each running check spends through (what a check stopped for its cost had spent)."""
        self._slots = asyncio.Semaphore(config.parallel_checks)
        """Checks share the node's boxes with rollouts: a few submissions at a time keep intake a guest, and
        each one's box seconds are bounded (``check_box_s``), so a slow one never holds the funnel."""
        self._sound: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self.seeds = SeedSequence.keyed(key.seed)
        """The task bank's sequence of fresh seeds (the daemon hands the scheduler the same one)."""
        self.canaries = ProductionCanaries(config.canary_share)
        """Which canary jobs go beside an approved version's (the daemon hands it to the scheduler)."""

    async def _serve(self, env: str, package: Package) -> None:
        self.canaries.serve(env, package.manifest.kind)
        await self._serve_env(env, package)

    async def _unserve(self, env: str) -> None:
        self.canaries.unserve(env)
        await self._unserve_env(env)

    def _environment(self, package: Package) -> BoxedEnvironment:
        """A submission's environment in this funnel's boxes, its checks bounded in box seconds."""
        assert self._sandbox is not None
        c = self.config
        return BoxedEnvironment(package, self._sandbox, self._key, budget_s=c.check_box_s,
                                verdict_cpu_s=c.verdict_cpu_s, verdict_wall_s=c.verdict_wall_s)

    def draw_seed(self, env: str, level: int, rng: random.Random) -> int:
        """A seed to check ``env`` on at ``level``, drawn as the task bank draws production's: the farm's keyed
        sequence, at a place among the first ``CHECK_HORIZON`` production hands out."""
        return self.seeds.nth(env, level, rng.randrange(CHECK_HORIZON))

    # -- life ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve every approved version, and pick up the checks a restart interrupted."""
        for sub in await self._records.submissions(state="approved", limit=1_000_000):
            package = await self._package(sub.id)
            await self._serve(sub.env, package)
        if self._sandbox is not None:
            for sid in await self._records.ids_in(["checking"]):
                self._schedule(sid)
            for sub in await self._records.submissions(state="approved", limit=1_000_000):
                if sub.library != fingerprint(sub.kind):
                    self._schedule(sub.id, recheck=True)
        self._sound = asyncio.create_task(self._credit_sound_forever(), name="intake-sound")
        self._watching = asyncio.create_task(self._watch_canaries_forever(), name="intake-canaries")

    async def stop(self) -> None:
        tasks = [*self._checking.values(), *(t for t in (self._sound, self._watching) if t is not None)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._checking.clear()

    async def idle(self) -> None:
        """Until no check is running (tests and ``farmctl submit --wait`` poll; this is for in-process use)."""
        while self._checking:
            await asyncio.gather(*self._checking.values(), return_exceptions=True)

    # -- submitting ----------------------------------------------------------------------------------

    async def submit(self, contributor: str, data: bytes, bounty_id: int = 0, *, sha256: str = "") -> SubmissionRow:
        """Take ``data`` in for checking. A declared ``sha256`` must be the bytes': an upload cancelled part way
        reaches the server as a shorter one, and only the hash tells them apart."""
        if self._sandbox is None:
            raise FailedPrecondition("this coordinator's host cannot isolate untrusted code (farmctl doctor says "
                                     "why), so it checks no submission", reason="NO_ISOLATION")
        if len(data) > self.config.max_package_bytes:
            raise BadRequest(f"the package is {len(data)} bytes; at most {self.config.max_package_bytes}",
                             reason="PACKAGE_TOO_LARGE")
        if sha256 and not is_sha256(sha256):
            raise BadRequest("a package's sha256 is 64 lowercase hex digits")
        try:
            package = await asyncio.to_thread(_read_whole, data, sha256)
        except PackageError as exc:
            raise BadRequest("the package is not valid: " + "; ".join(exc.problems)[:1500],
                             reason="INVALID_PACKAGE") from exc
        m = package.manifest
        owner = await self._records.owner_of(m.name)
        if owner is not None and owner != contributor:
            raise Forbidden(f"an environment called {m.name!r} is {owner!r}'s: choose another name",
                            reason="NAME_TAKEN")
        if bounty_id:
            bounty = await self._bounty(bounty_id)
            if not await self._records.claimed(bounty_id, contributor):
                raise FailedPrecondition(f"bounty {bounty_id} is not claimed by {contributor!r}: claim it first",
                                         reason="BOUNTY_NOT_CLAIMED")
            if bounty.domain != m.domain:
                raise BadRequest(f"bounty {bounty_id} wants domain {bounty.domain!r}; the manifest says {m.domain!r}")
        standing = await self.standing(contributor)
        sid = await self._records.add_submission(
            contributor=contributor, name=m.name, version=m.version, domain=m.domain, kind=m.kind, levels=m.levels,
            digest=package.digest, package=data, bounty_id=bounty_id, seeds=standing.seeds,
            attack_budget=standing.attack_budget)
        if sid is None:
            raise Conflict(f"{m.name} {m.version} was submitted already: any change is a new version",
                           reason="VERSION_EXISTS")
        log.info("submission %d: %s %s from %s", sid, m.name, m.version, contributor,
                 extra={"event": "submitted", "submission": sid, "contributor": contributor})
        self._schedule(sid)
        return await self.submission(sid)

    async def submission(self, submission_id: int) -> SubmissionRow:
        sub = await self._records.submission(submission_id)
        if sub is None:
            raise NotFound(f"no submission {submission_id}")
        return sub

    async def submissions(self, *, state: str | None = None, contributor: str | None = None, before_id: int = 0,
                          limit: int = 50) -> list[SubmissionRow]:
        return await self._records.submissions(state=state, contributor=contributor, before_id=before_id, limit=limit)

    async def package_of(self, env: str, *, approved_only: bool = True) -> tuple[SubmissionRow, bytes]:
        """The submission named ``contrib:NAME@VERSION`` and its package as submitted (NotFound if there is no
        such version, or, with ``approved_only``, it is not served)."""
        name, _, version = env.removeprefix("contrib:").partition("@")
        sid = await self._records.named(name, version) if env.startswith("contrib:") and version else None
        sub = await self._records.submission(sid) if sid is not None else None
        data = await self._records.package(sid) if sid is not None else None
        if sub is None or data is None or (approved_only and sub.state != "approved"):
            raise NotFound(f"no {'approved ' if approved_only else ''}contributed environment {env!r}")
        return sub, data

    async def _package(self, submission_id: int) -> Package:
        data = await self._records.package(submission_id)
        if data is None:
            raise NotFound(f"no submission {submission_id}")
        return await asyncio.to_thread(read_package, data)

    # -- tiers 1 and 2 -------------------------------------------------------------------------------

    def _schedule(self, submission_id: int, *, recheck: bool = False) -> None:
        if submission_id in self._checking:
            return
        task = asyncio.create_task(self._check(submission_id, recheck), name=f"intake-check-{submission_id}")
        self._checking[submission_id] = task
        task.add_done_callback(lambda _t: self._checking.pop(submission_id, None))

    async def _check(self, submission_id: int, recheck: bool = False) -> None:
        async with self._slots:
            try:
                try:
                    await (self._recheck(submission_id) if recheck else self._run_tiers(submission_id))
                except BaseExceptionGroup as group:  # a task group's: the budget ran out in one of its tasks
                    spent = _budget_spent(group)
                    if spent is None:
                        raise
                    raise spent from group
            except asyncio.CancelledError:
                raise
            except CheckBudgetSpent as spent:
                await self._too_costly(submission_id, spent)
            except FarmError as exc:  # a box that would not start: no verdict, tried again on the next start
                log.warning("submission %d: checking failed for the farm's reasons, not the submission's: %s",
                            submission_id, exc, extra={"event": "intake_infra", "submission": submission_id})
                await self._records.set_state(submission_id, "checking", expect=["checking"],
                                              detail=f"checking was interrupted ({bounded(str(exc), 300)}); "
                                                     "it is tried again when farmd restarts")
            except Exception:
                log.exception("submission %d: checking crashed", submission_id)
                await self._records.set_state(submission_id, "checking", expect=["checking"],
                                              detail="checking crashed (farmd's fault, see its log); "
                                                     "it is tried again when farmd restarts")
            finally:
                env = self._costing.pop(submission_id, None)
                if env is not None:  # its boxes between batches: closed now, not when they time out
                    await env.aclose()

    async def _run_tiers(self, submission_id: int) -> None:
        sub = await self.submission(submission_id)
        if sub.state != "checking":
            return
        env = self._environment(await self._package(submission_id))
        self._costing[submission_id] = env
        rng = secrets.SystemRandom()
        # Fresh seeds each round, drawn as the bank draws production's: a check and a rollout look alike.
        seeds = sorted({self.draw_seed(sub.env, 1, rng) for _ in range(sub.seeds)})
        await self._records.set_state(submission_id, "checking", tier=1, detail="tier 1: structural checks")
        report = await tier1_report(env, seeds)
        findings = [_row(f, 1) for f in report.findings]
        cov = report.coverage
        await self._records.record_tier(submission_id, sub.rounds, 1, findings, _cost(1, env.calls),
                                        mutants=(cov.differing, cov.killed) if cov else None)
        if _first_blocking(findings):
            await self._reject(sub, 1, findings, reputation.REJECTED_TIER1)
            return
        await self._records.set_state(submission_id, "checking", tier=2, detail="tier 2: attacks")
        done = len(env.calls)
        # What tier 1's verdicts cost decides before any attack is paid for: the farm's budget, not the manifest's.
        costly = verdict_cost(env.calls, self.config.verdict_cpu_s, self.config.verdict_wall_s)
        if costly is not None:
            findings = [_row(costly, 2)]
            await self._records.record_tier(submission_id, sub.rounds, 2, findings, _cost(2, []))
            await self._reject(sub, 2, findings, reputation.REJECTED_TIER2)
            return
        levels = sub.levels

        def key(i: int) -> tuple[int, int]:
            return self.draw_seed(sub.env, 1 + i % levels, rng), 1 + i % levels

        keys = [key(i) for i in range(self.config.tier2_tasks)]
        sample = [key(i) for i in range(self.config.tier2_sample)]
        t2 = await run_tier2(env, keys, attacker=self._attacker, attack_budget=sub.attack_budget, sample=sample,
                             draw=lambda level: self.draw_seed(sub.env, level, rng))
        findings = [_row(f, 2) for f in t2.findings]
        await self._records.record_tier(submission_id, sub.rounds, 2, findings,
                                        _cost(2, env.calls[done:], t2.attacker_tokens))
        await self._records.set_library(submission_id, fingerprint(sub.kind))
        if _first_blocking(findings):
            await self._reject(sub, 2, findings, reputation.REJECTED_TIER2)
            return
        share = f"; the verifier rejected {cov.killed} of {cov.differing} differing mutants" if cov and cov.differing \
            else ""
        await self._records.set_state(submission_id, "in_review", tier=3, expect=["checking"],
                                      detail=f"passed tiers 1 and 2 ({t2.tried} attacks, none rewarded{share}); "
                                             "waiting for a reviewer")

    async def _recheck(self, submission_id: int) -> None:
        """An accepted version attacked again by a library that has grown since: an exploit that earns reward
        now quarantines it (its author is not blamed for good: the hole may be an honest one)."""
        sub = await self.submission(submission_id)
        if sub.state != "approved":
            return
        env = self._environment(await self._package(submission_id))
        self._costing[submission_id] = env
        # A version already served is attacked again whatever it costs: it is serving, and its cost was judged.
        env.budget_s = env.verdict_cpu_s = env.verdict_wall_s = None
        rng = secrets.SystemRandom()
        keys = [(self.draw_seed(sub.env, 1 + i % sub.levels, rng), 1 + i % sub.levels)
                for i in range(self.config.tier2_tasks)]
        library = fingerprint(sub.kind)
        t2 = await run_tier2(env, keys, canaries=0, probes_asked=())
        findings = [_row(f, 2) for f in t2.findings]
        await self._records.record_tier(submission_id, sub.rounds, 2, findings, _cost(2, env.calls))
        await self._records.set_library(submission_id, library)
        first = _first_blocking(findings)
        if first is not None:
            await self.quarantine(submission_id, "the exploit library", bounded(first.evidence, 1000))

    async def _too_costly(self, submission_id: int, spent: CheckBudgetSpent) -> None:
        """Checking used the box seconds one submission may: refused as too costly, at the tier it was in."""
        sub = await self.submission(submission_id)
        env = self._costing.get(submission_id)
        calls = env.calls if env is not None else []
        finding = FindingRow(sub.tier, COST, bounded(f"checking stopped: {spent.evidence}", MAX_FIELD_CHARS),
                             "make each call cheap: the farm checks a version within a bounded number of box "
                             "seconds, and pays a bounded cost per verdict", True)
        await self._records.record_tier(submission_id, sub.rounds, sub.tier, [finding], _cost(sub.tier, calls))
        await self._reject(sub, sub.tier, [finding],
                           reputation.REJECTED_TIER1 if sub.tier <= 1 else reputation.REJECTED_TIER2)

    async def _reject(self, sub: SubmissionRow, tier: int, findings: list[FindingRow], delta: float) -> None:
        first = _first_blocking(findings)
        assert first is not None
        more = sum(f.blocking for f in findings) - 1
        detail = f"rejected at tier {tier}: {first.check}" + (f" (and {more} more)" if more else "")
        if await self._records.set_state(sub.id, "rejected", tier=tier, detail=detail, expect=["checking"],
                                         decided=True):
            await self._records.credit(sub.contributor, delta, f"submission {sub.id} ({sub.env}) {detail}", sub.id)

    # -- tier 3 --------------------------------------------------------------------------------------

    async def looked_at(self, submission_id: int, reviewer: str) -> None:
        await self._records.first_look(submission_id, reviewer)

    async def review(self, submission_id: int, reviewer: str, *, approve: bool, note: str, planted: bool = False,
                     minutes: float = 0.0) -> SubmissionRow:
        note = note.strip()
        if not note:
            raise BadRequest("a review needs a note: what you checked and what you saw")
        if len(note) > MAX_NOTE_CHARS:
            raise BadRequest(f"a note is at most {MAX_NOTE_CHARS} characters")
        if approve and planted:
            raise BadRequest("planted is a reason to reject, not to approve")
        if not 0 <= minutes <= 24 * 60:
            raise BadRequest("minutes is the reviewer's time: 0 to 1440")
        sub = await self.submission(submission_id)
        if sub.contributor == reviewer:
            raise Forbidden("nobody reviews their own submission", reason="OWN_SUBMISSION")
        if sub.state != "in_review":
            raise FailedPrecondition(f"submission {submission_id} is {sub.state}, not in review",
                                     reason="NOT_IN_REVIEW")
        now = time.time()  # once: read twice, a review with no first look took a negative moment
        review_s = minutes * 60 if minutes else min(now - (sub.first_look_at or now), _REVIEW_CAP_S)
        state = "approved" if approve else "rejected"
        if not await self._records.set_state(submission_id, state, tier=3, expect=["in_review"], decided=True,
                                             reviewer=reviewer, note=bounded(note, MAX_NOTE_CHARS),
                                             detail=f"{state} by {reviewer}"):
            raise FailedPrecondition(f"submission {submission_id} was decided meanwhile", reason="NOT_IN_REVIEW")
        await self._records.record_tier(submission_id, sub.rounds, 3, [], CostRow(3, review_s=review_s))
        if approve:
            await self._accept(sub)
        elif planted:
            await self._tank(sub, f"submission {sub.id} ({sub.env}) rejected by {reviewer} for a planted exploit")
        else:
            await self._records.credit(sub.contributor, reputation.REJECTED_REVIEW,
                                       f"submission {sub.id} ({sub.env}) rejected by {reviewer}", sub.id)
        return await self.submission(submission_id)

    async def _accept(self, sub: SubmissionRow) -> None:
        await self._serve(sub.env, await self._package(sub.id))
        await self._records.credit(sub.contributor, reputation.ACCEPTED, f"submission {sub.id} ({sub.env}) accepted",
                                   sub.id)
        if sub.bounty_id:
            await self._pay(sub)

    async def _pay(self, sub: SubmissionRow) -> None:
        """Paid on acceptance, while the bounty wants more: its floor, plus its range times the share of
        mutants the verifier rejected (a stronger verifier is worth more)."""
        bounty = await self._bounty(sub.bounty_id)
        if not bounty.open:
            return
        share = sub.mutants_killed / sub.mutants if sub.mutants else 0.0
        usd = round(bounty.payout_min + (bounty.payout_max - bounty.payout_min) * share, 2)
        await self._records.pay(sub.id, sub.bounty_id, sub.contributor, usd)

    # -- quarantine and tanking -------------------------------------------------------------------------

    async def quarantine(self, submission_id: int, by: str, reason: str, *, planted: bool = False
                         ) -> tuple[SubmissionRow, int]:
        reason = reason.strip()
        if not reason:
            raise BadRequest("a quarantine needs a reason: the hack that was found")
        sub = await self.submission(submission_id)
        if sub.state != "approved":
            raise FailedPrecondition(f"submission {submission_id} is {sub.state}: only an approved version is "
                                     "quarantined", reason="NOT_APPROVED")
        reason = bounded(reason, MAX_NOTE_CHARS)
        # Unserved first: no new rollout of it is started while it is being quarantined. The state and the
        # withdrawals are one transaction.
        await self._unserve(sub.env)
        withdrawn = await self._records.quarantine(submission_id, sub.env, reason,
                                                   detail=f"quarantined by {by}: {reason}")
        if withdrawn is None:
            raise FailedPrecondition(f"submission {submission_id} changed meanwhile", reason="NOT_APPROVED")
        log.warning("quarantined %s (submission %d): %s; %d trajectories withdrawn", sub.env, sub.id, reason,
                    withdrawn, extra={"event": "quarantined", "submission": sub.id, "withdrawn": withdrawn})
        why = f"submission {sub.id} ({sub.env}) quarantined by {by}: {reason}"
        if planted:
            await self._tank(sub, why)
        else:
            await self._records.credit(sub.contributor, reputation.QUARANTINED, why, sub.id)
        return await self.submission(submission_id), withdrawn

    async def _tank(self, sub: SubmissionRow, why: str) -> None:
        """For good: the reputation, and every pending or recently accepted version back to full review."""
        await self._records.credit(sub.contributor, reputation.TANKED, why, sub.id, tank=True)
        full = reputation.strictest(self.config)
        since = time.time() - self.config.recent_days * 86400
        again = [i for i in await self._records.ids_in(["checking", "in_review"], sub.contributor) if i != sub.id]
        recent = [i for i in await self._records.approved_since(sub.contributor, since) if i != sub.id]
        for sid in again + recent:
            other = await self.submission(sid)
            if sid in recent:
                await self._unserve(other.env)
            task = self._checking.pop(sid, None)
            if task is not None:
                task.cancel()
            await self._records.start_round(sid, full.seeds, full.attack_budget,
                                            f"sent back for full review: {bounded(why, 300)}")
            if self._sandbox is not None:
                self._schedule(sid)

    # -- reputation ------------------------------------------------------------------------------------

    async def standing(self, name: str) -> reputation.Trust:
        found = await self._records.contributor(name)
        rep, tanked = (found.reputation, found.tanked) if found else (0.0, False)
        return reputation.trust(rep, tanked, self.config)

    async def contributor(self, name: str) -> Standing:
        found = await self._records.contributor(name)
        if found is None:
            raise NotFound(f"no contributor {name!r}")
        return Standing(row=found, trust=reputation.trust(found.reputation, found.tanked, self.config),
                        ledger=await self._records.ledger(name))

    async def credit_sound(self) -> int:
        """Credit every accepted version that has served ``sound_after`` trajectories unquarantined; once each."""
        credited = 0
        for sub in await self._records.submissions(state="approved", limit=1_000_000):
            reason = f"{sub.env} proved sound"
            full = await self._records.submission(sub.id)
            if full is None or full.trajectories < self.config.sound_after \
                    or await self._records.credited(sub.contributor, reason):
                continue
            await self._records.credit(sub.contributor, reputation.PROVED_SOUND,
                                       f"{reason} over {full.trajectories} trajectories", sub.id)
            credited += 1
        return credited

    async def _credit_sound_forever(self) -> None:
        while True:
            await asyncio.sleep(_SOUND_EVERY_S)
            try:
                await self.credit_sound()
            except Exception:
                log.exception("crediting sound environments failed")

    # -- production canaries ----------------------------------------------------------------------------

    async def watch_canaries(self) -> int:
        """Read the canaries stored since the last look; quarantine every approved version one of them earned
        reward (or a pass) from, with the canary as a finding. Returns how many versions were quarantined."""
        saved = await self._store.get_state(_CANARY_CURSOR)
        cursor = int(saved["seq"]) if saved else 0
        upto = await self._store.last_seq()
        caught = 0
        while cursor < upto:
            rows = await self._records.canary_results(cursor, upto, _CANARIES_READ)
            for row in rows:
                if row.status == "ok" and (row.reward > 0 or row.passed):
                    caught += await self._canary_rewarded(row)
            cursor = rows[-1].seq if len(rows) == _CANARIES_READ else upto
            await self._store.put_state(_CANARY_CURSOR, {"seq": cursor})
        return caught

    async def _canary_rewarded(self, row: CanaryRow) -> int:
        name, _, version = row.env.removeprefix("contrib:").partition("@")
        sid = await self._records.named(name, version)
        sub = await self._records.submission(sid) if sid is not None else None
        if sub is None or sub.state != "approved":
            return 0  # quarantined already (by an earlier canary), or no longer served
        what = row.agent.removeprefix("redteam:canary:")
        evidence = (f"production canary {what!r} (a known-wrong attempt, trajectory {row.trajectory_id}) earned "
                    f"reward {row.reward:g} (passed: {str(row.passed).lower()}) on task (seed {row.seed}, level "
                    f"{row.difficulty}) after the version was approved")
        log.warning("%s rewarded a canary: %s", sub.env, evidence,
                    extra={"event": "canary_rewarded", "submission": sub.id, "trajectory": row.trajectory_id})
        await self._records.record_tier(sub.id, sub.rounds, 2, [FindingRow(
            2, CANARY_CHECK, bounded(evidence, MAX_FIELD_CHARS),
            "judge every attempt by the task's hidden data, the same way on every task and every day: production "
            "keeps checking")], CostRow(2))
        try:
            await self.quarantine(sub.id, "a production canary", evidence)
        except FailedPrecondition:
            return 0  # decided meanwhile
        return 1

    async def _watch_canaries_forever(self) -> None:
        while True:
            try:
                await self.watch_canaries()
            except Exception:
                log.exception("reading production canaries failed")
            await asyncio.sleep(self.config.canary_check_s)

    # -- bounties ----------------------------------------------------------------------------------------

    async def post_bounty(self, by: str, *, domain: str, requirements: str, payout_min: float, payout_max: float,
                          wanted: int, min_reputation: float) -> BountyRow:
        domain, requirements = domain.strip(), requirements.strip()
        if not domain or len(domain) > 64:
            raise BadRequest("a bounty names its domain (1-64 characters)")
        if not requirements or len(requirements) > MAX_NOTE_CHARS:
            raise BadRequest(f"a bounty states its requirements (1-{MAX_NOTE_CHARS} characters)")
        if not 0 <= payout_min <= payout_max <= 1_000_000:
            raise BadRequest("the payout range is MIN-MAX with 0 <= MIN <= MAX <= 1000000")
        if not 1 <= wanted <= 100_000:
            raise BadRequest("wanted is how many environments: 1 to 100000")
        if not -1e6 <= min_reputation <= 1e6:
            raise BadRequest("min_reputation is out of range")
        bid = await self._records.add_bounty(domain=bounded(domain, 64), requirements=bounded(requirements, MAX_NOTE_CHARS),
                                             payout_min=payout_min, payout_max=payout_max, wanted=wanted,
                                             min_reputation=min_reputation, posted_by=by)
        return await self._bounty(bid)

    async def bounties(self, open_only: bool = False) -> list[BountyRow]:
        return [b for b in await self._records.bounties() if b.open or not open_only]

    async def _bounty(self, bounty_id: int) -> BountyRow:
        found = await self._records.bounties([bounty_id])
        if not found:
            raise NotFound(f"no bounty {bounty_id}")
        return found[0]

    async def claim(self, bounty_id: int, contributor: str) -> BountyRow:
        bounty = await self._bounty(bounty_id)
        if not bounty.open:
            raise FailedPrecondition(f"bounty {bounty_id} has all the environments it wanted", reason="BOUNTY_CLOSED")
        found = await self._records.contributor(contributor)
        rep, tanked = (found.reputation, found.tanked) if found else (0.0, False)
        standing = reputation.trust(rep, tanked, self.config)
        if rep < bounty.min_reputation or bounty.payout_max > standing.max_payout:
            raise Forbidden(f"bounty {bounty_id} needs reputation {bounty.min_reputation:g} and pays up to "
                            f"{bounty.payout_max:g}; {contributor!r} has {rep:g} ({standing.name}: bounties up to "
                            f"{standing.max_payout:g})", reason="REPUTATION_TOO_LOW")
        await self._records.add_contributor(contributor)
        await self._records.claim(bounty_id, contributor)
        return await self._bounty(bounty_id)

    # -- the funnel's figures ------------------------------------------------------------------------------

    async def figures(self) -> Figures:
        """Submissions by state, cost per tier and per accepted environment (the seed document's arithmetic:
        every submission's checking cost and every payout, over the environments accepted)."""
        raw = await self._records.funnel()
        tiers = raw.tiers
        total = CostRow(0)
        for cost in tiers:
            total = total + cost
        total.tier = 0
        checking_usd = sum(self.prices.usd(c) for c in tiers)
        total_usd = checking_usd + raw.payouts_usd
        accepted = raw.accepted
        per = None
        if accepted:
            per = CostRow(0, total.box_cpu_s / accepted, total.box_wall_s / accepted, round(total.box_calls / accepted),
                          round(total.attacker_tokens / accepted), total.review_s / accepted)
        return Figures(states=raw.states, tiers=tiers, accepted=accepted, payouts_usd=raw.payouts_usd,
                       total_usd=total_usd, usd_per_accepted=total_usd / accepted if accepted else None,
                       per_accepted=per)


def _read_whole(data: bytes, sha256: str) -> Package:
    """The package ``data`` holds, once it hashes to ``sha256`` (when one is declared)."""
    if sha256 and (actual := hashlib.sha256(data).hexdigest()) != sha256:
        raise BadRequest(f"the package hashes to {actual}, not the declared {sha256}: was its upload cut short?",
                         reason="PACKAGE_HASH_MISMATCH")
    return read_package(data)


def _first_blocking(findings: Sequence[FindingRow]) -> FindingRow | None:
    return next((f for f in findings if f.blocking), None)


def _budget_spent(exc: BaseException) -> CheckBudgetSpent | None:
    """The ``CheckBudgetSpent`` that ended a check, also from inside a task group's exceptions."""
    if isinstance(exc, CheckBudgetSpent):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _budget_spent(inner)
            if found is not None:
                return found
    return None
