"""The intake funnel's SQL: submissions, their findings and costs, contributors and their reputation
ledger, bounties and claims, payouts, quarantines and the withdrawals consumers are told of.

Reached as ``store.intake``; it shares the store's connections and its one-writer-at-a-time rule. What
a state means and when it changes is the funnel's (``farmd.intake.funnel``); this module keeps rows and
keeps each change atomic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from farmd.flags import QUARANTINED, WITHDRAWN
from farmd.records import CANARY_PREFIX
from farmd.store.database import Database, Transaction
from farmd.store.groups import finish_groups
from farmd.store.verdicts import give

STATES = ("checking", "rejected", "in_review", "approved", "quarantined")

_SUBMISSION_COLUMNS = ("id, contributor, name, version, domain, kind, levels, digest, bounty_id, state, tier, detail, "
                       "seeds, attack_budget, mutants, mutants_killed, rounds, library, reviewer, review_note, "
                       "first_look_at, created_at, updated_at, decided_at")


@dataclass
class FindingRow:
    tier: int
    check: str
    evidence: str
    fix: str
    blocking: bool = True


@dataclass
class CostRow:
    tier: int
    box_cpu_s: float = 0.0
    box_wall_s: float = 0.0
    box_calls: int = 0
    attacker_tokens: int = 0
    review_s: float = 0.0

    def __add__(self, other: CostRow) -> CostRow:
        return CostRow(self.tier, self.box_cpu_s + other.box_cpu_s, self.box_wall_s + other.box_wall_s,
                       self.box_calls + other.box_calls, self.attacker_tokens + other.attacker_tokens,
                       self.review_s + other.review_s)


@dataclass
class SubmissionRow:
    id: int
    contributor: str
    name: str
    version: str
    domain: str
    kind: str
    levels: int
    digest: str
    bounty_id: int
    state: str
    tier: int
    detail: str
    seeds: int
    attack_budget: int
    mutants: int
    mutants_killed: int
    rounds: int
    library: str
    """The exploit library's fingerprint when tier 2 last attacked it."""
    reviewer: str
    review_note: str
    first_look_at: float | None
    created_at: float
    updated_at: float
    decided_at: float | None
    findings: list[FindingRow] = field(default_factory=list)
    """Of the latest round."""
    costs: list[CostRow] = field(default_factory=list)
    """Per tier, summed over every round."""
    trajectories: int = 0
    withdrawn: int = 0

    @property
    def env(self) -> str:
        return f"contrib:{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class ContributorRow:
    """A contributor as the rows say: tanked for good or not, reputation (the ledger's sum), submissions by state,
    and what they were paid."""

    name: str
    tanked: bool
    reputation: float
    states: dict[str, int]
    paid: float


@dataclass(frozen=True, slots=True)
class FunnelRow:
    """The funnel as the rows say: submissions by state, checking cost per tier, versions accepted (quarantined
    ones too: they were accepted first), and every payout together."""

    states: dict[str, int]
    tiers: list[CostRow]
    accepted: int
    payouts_usd: float


@dataclass
class LedgerRow:
    seq: int
    contributor: str
    delta: float
    reason: str
    submission_id: int
    at: float


@dataclass
class BountyRow:
    id: int
    domain: str
    requirements: str
    payout_min: float
    payout_max: float
    wanted: int
    min_reputation: float
    posted_by: str
    created_at: float
    claimants: list[str] = field(default_factory=list)
    accepted: int = 0
    paid: float = 0.0

    @property
    def open(self) -> bool:
        return self.accepted < self.wanted


@dataclass
class CanaryRow:
    """A production canary's stored result (the attempt was wrong on purpose: any reward is the verifier's)."""

    seq: int
    trajectory_id: int
    env: str
    agent: str
    seed: int
    difficulty: int
    reward: float
    passed: bool
    status: str


@dataclass
class WithdrawalRow:
    seq: int
    trajectory_id: int
    env: str
    reason: str


def _submission(row: Sequence[Any]) -> SubmissionRow:
    return SubmissionRow(*row)


class IntakeRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    # -- submissions ------------------------------------------------------------------------------

    async def add_submission(self, *, contributor: str, name: str, version: str, domain: str, kind: str,
                             levels: int, digest: str, package: bytes, bounty_id: int, seeds: int,
                             attack_budget: int) -> int | None:
        """A new submission, checking; None if this name and version were already submitted."""
        now = time.time()
        async with self._db.write() as db:
            submission_id = await db.insert(
                "INSERT INTO submissions(contributor, name, version, domain, kind, levels, digest, package, "
                "bounty_id, state, tier, seeds, attack_budget, created_at, updated_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,'checking',1,?,?,?,?) ON CONFLICT DO NOTHING",
                (contributor, name, version, domain, kind, levels, digest, package, bounty_id, seeds, attack_budget,
                 now, now))
            if not submission_id:
                return None
            await db.execute("INSERT INTO contributors(name, created_at) VALUES (?,?) ON CONFLICT DO NOTHING",
                             (contributor, now))
            return submission_id

    async def owner_of(self, name: str) -> str | None:
        """Who first submitted an environment called ``name``: only they may submit its versions."""
        row = await self._db.one("SELECT contributor FROM submissions WHERE name=? ORDER BY id LIMIT 1", (name,))
        return str(row[0]) if row else None

    async def submission(self, submission_id: int) -> SubmissionRow | None:
        row = await self._db.one(f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE id=?", (submission_id,))
        if row is None:
            return None
        sub = _submission(row)
        sub.findings = [FindingRow(int(t), c, e, f, bool(b)) for t, c, e, f, b in await self._db.all(
            "SELECT tier, check_name, evidence, fix, blocking FROM findings WHERE submission_id=? AND round=? "
            "ORDER BY rowid", (submission_id, sub.rounds))]
        sub.costs = [CostRow(int(t), float(c), float(w), int(n), int(k), float(r)) for t, c, w, n, k, r in
                     await self._db.all(
                         "SELECT tier, SUM(box_cpu_s), SUM(box_wall_s), SUM(box_calls), SUM(attacker_tokens), "
                         "SUM(review_s) FROM intake_costs WHERE submission_id=? GROUP BY tier ORDER BY tier",
                         (submission_id,))]
        counts = await self._db.one(
            "SELECT COUNT(*), (SELECT COUNT(*) FROM withdrawals WHERE env=?) FROM trajectories WHERE env=? "
            "AND substr(agent, 1, ?) != ?", (sub.env, sub.env, len(CANARY_PREFIX), CANARY_PREFIX))
        sub.trajectories, sub.withdrawn = int(counts[0]), int(counts[1])
        return sub

    async def named(self, name: str, version: str) -> int | None:
        """The submission of ``name`` at ``version``, if any."""
        row = await self._db.one("SELECT id FROM submissions WHERE name=? AND version=?", (name, version))
        return int(row[0]) if row else None

    async def package(self, submission_id: int) -> bytes | None:
        row = await self._db.one("SELECT package FROM submissions WHERE id=?", (submission_id,))
        return bytes(row[0]) if row else None

    async def submissions(self, *, state: str | None = None, contributor: str | None = None, before_id: int = 0,
                          limit: int = 50) -> list[SubmissionRow]:
        """Newest first, without findings or costs (``submission`` has them)."""
        where, args = ["1 = 1"], list[object]()
        if state:
            where.append("state = ?")
            args.append(state)
        if contributor:
            where.append("contributor = ?")
            args.append(contributor)
        if before_id:
            where.append("id < ?")
            args.append(before_id)
        rows = await self._db.all(f"SELECT {_SUBMISSION_COLUMNS} FROM submissions WHERE {' AND '.join(where)} "
                                  "ORDER BY id DESC LIMIT ?", (*args, limit))
        return [_submission(r) for r in rows]

    async def ids_in(self, states: Iterable[str], contributor: str | None = None) -> list[int]:
        wanted = list(states)
        where = f"state IN ({','.join('?' * len(wanted))})" + (" AND contributor = ?" if contributor else "")
        args: list[object] = [*wanted, *([contributor] if contributor else [])]
        return [int(r[0]) for r in await self._db.all(f"SELECT id FROM submissions WHERE {where} ORDER BY id",
                                                           args)]

    async def approved_since(self, contributor: str, since: float) -> list[int]:
        return [int(r[0]) for r in await self._db.all(
            "SELECT id FROM submissions WHERE contributor=? AND state='approved' AND decided_at >= ? ORDER BY id",
            (contributor, since))]

    async def set_state(self, submission_id: int, state: str, *, tier: int | None = None, detail: str | None = None,
                        expect: Sequence[str] = (), decided: bool = False, reviewer: str | None = None,
                        note: str | None = None) -> bool:
        """Move a submission to ``state``; with ``expect``, only from one of those states (False if not)."""
        async with self._db.write() as db:
            return await _set_state(db, submission_id, state, tier=tier, detail=detail, expect=expect,
                                    decided=decided, reviewer=reviewer, note=note)

    async def start_round(self, submission_id: int, seeds: int, attack_budget: int, detail: str) -> None:
        """Back to checking, from scratch, under (possibly raised) scrutiny: a new round of findings."""
        async with self._db.write() as db:
            await db.execute(
                "UPDATE submissions SET state='checking', tier=1, detail=?, seeds=?, attack_budget=?, rounds=rounds+1, "
                "reviewer='', review_note='', first_look_at=NULL, decided_at=NULL, updated_at=? WHERE id=?",
                (detail, seeds, attack_budget, time.time(), submission_id))

    async def record_tier(self, submission_id: int, round_: int, tier: int, findings: Sequence[FindingRow],
                          cost: CostRow, *, mutants: tuple[int, int] | None = None) -> None:
        """One tier's findings and cost, in one transaction."""
        now = time.time()
        async with self._db.write() as db:
            await db.executemany(
                "INSERT INTO findings(submission_id, round, tier, check_name, evidence, fix, blocking, at) "
                "VALUES (?,?,?,?,?,?,?,?)",
                [(submission_id, round_, f.tier, f.check, f.evidence, f.fix, int(f.blocking), now) for f in findings])
            await db.execute(
                "INSERT INTO intake_costs(submission_id, round, tier, box_cpu_s, box_wall_s, box_calls, attacker_tokens, "
                "review_s, at) VALUES (?,?,?,?,?,?,?,?,?)",
                (submission_id, round_, tier, cost.box_cpu_s, cost.box_wall_s, cost.box_calls, cost.attacker_tokens,
                 cost.review_s, now))
            if mutants is not None:
                await db.execute("UPDATE submissions SET mutants=?, mutants_killed=? WHERE id=?",
                                 (mutants[0], mutants[1], submission_id))

    async def set_library(self, submission_id: int, library: str) -> None:
        async with self._db.write() as db:
            await db.execute("UPDATE submissions SET library=? WHERE id=?", (library, submission_id))

    async def first_look(self, submission_id: int, reviewer: str) -> None:
        """A reviewer opened it: their time on it counts from here unless they say otherwise."""
        async with self._db.write() as db:
            await db.execute("UPDATE submissions SET first_look_at=? WHERE id=? AND first_look_at IS NULL "
                             "AND state='in_review'", (time.time(), submission_id))

    # -- contributors and the ledger -------------------------------------------------------------

    async def add_contributor(self, name: str) -> None:
        async with self._db.write() as db:
            await db.execute("INSERT INTO contributors(name, created_at) VALUES (?,?) ON CONFLICT DO NOTHING",
                             (name, time.time()))

    async def credit(self, contributor: str, delta: float, reason: str, submission_id: int = 0, *,
                     tank: bool = False) -> None:
        """Append to the ledger (it is never changed); ``tank``: the reputation is lost for good."""
        now = time.time()
        async with self._db.write() as db:
            await db.execute("INSERT INTO contributors(name, created_at) VALUES (?,?) ON CONFLICT DO NOTHING",
                             (contributor, now))
            await db.execute("INSERT INTO ledger(contributor, delta, reason, submission_id, at) VALUES (?,?,?,?,?)",
                             (contributor, delta, reason, submission_id, now))
            if tank:
                await db.execute("UPDATE contributors SET tanked=1 WHERE name=?", (contributor,))

    async def credited(self, contributor: str, reason: str) -> bool:
        """Whether the ledger already holds a reason starting with ``reason`` for them (a credit given once)."""
        return await self._db.one("SELECT 1 FROM ledger WHERE contributor=? AND substr(reason, 1, ?) = ?",
                                  (contributor, len(reason), reason)) is not None

    async def contributor(self, name: str) -> ContributorRow | None:
        row = await self._db.one("SELECT tanked, created_at FROM contributors WHERE name=?", (name,))
        if row is None:
            return None
        rep = await self._db.one("SELECT COALESCE(SUM(delta), 0) FROM ledger WHERE contributor=?", (name,))
        counts = dict(await self._db.all("SELECT state, COUNT(*) FROM submissions WHERE contributor=? "
                                         "GROUP BY state", (name,)))
        paid = await self._db.one("SELECT COALESCE(SUM(usd), 0) FROM payouts WHERE contributor=?", (name,))
        return ContributorRow(name=name, tanked=bool(row[0]), reputation=float(rep[0]),
                              states={str(k): int(v) for k, v in counts.items()}, paid=float(paid[0]))

    async def ledger(self, contributor: str, limit: int = 200) -> list[LedgerRow]:
        """Newest first."""
        return [LedgerRow(int(s), c, float(d), r, int(i), float(a)) for s, c, d, r, i, a in await self._db.all(
            "SELECT seq, contributor, delta, reason, submission_id, at FROM ledger WHERE contributor=? "
            "ORDER BY seq DESC LIMIT ?", (contributor, limit))]

    # -- bounties ----------------------------------------------------------------------------------

    async def add_bounty(self, *, domain: str, requirements: str, payout_min: float, payout_max: float, wanted: int,
                         min_reputation: float, posted_by: str) -> int:
        async with self._db.write() as db:
            return await db.insert(
                "INSERT INTO bounties(domain, requirements, payout_min, payout_max, wanted, min_reputation, posted_by, "
                "created_at) VALUES (?,?,?,?,?,?,?,?)",
                (domain, requirements, payout_min, payout_max, wanted, min_reputation, posted_by, time.time()))

    async def bounties(self, ids: Sequence[int] = ()) -> list[BountyRow]:
        where = f"WHERE id IN ({','.join('?' * len(ids))})" if ids else ""
        rows = [BountyRow(*r) for r in await self._db.all(
            "SELECT id, domain, requirements, payout_min, payout_max, wanted, min_reputation, posted_by, created_at "
            f"FROM bounties {where} ORDER BY id", list(ids))]
        by_id = {b.id: b for b in rows}
        for bid, who in await self._db.all("SELECT bounty_id, contributor FROM claims ORDER BY at"):
            if bid in by_id:
                by_id[bid].claimants.append(who)
        for bid, n, usd in await self._db.all("SELECT bounty_id, COUNT(*), SUM(usd) FROM payouts GROUP BY bounty_id"):
            if bid in by_id:
                by_id[bid].accepted, by_id[bid].paid = int(n), float(usd or 0)
        return rows

    async def claim(self, bounty_id: int, contributor: str) -> None:
        async with self._db.write() as db:
            await db.execute("INSERT INTO claims(bounty_id, contributor, at) VALUES (?,?,?) ON CONFLICT DO NOTHING",
                             (bounty_id, contributor, time.time()))

    async def claimed(self, bounty_id: int, contributor: str) -> bool:
        return await self._db.one("SELECT 1 FROM claims WHERE bounty_id=? AND contributor=?",
                                  (bounty_id, contributor)) is not None

    async def pay(self, submission_id: int, bounty_id: int, contributor: str, usd: float) -> bool:
        """One payout per submission; False if it was paid already."""
        async with self._db.write() as db:
            return await db.execute("INSERT INTO payouts(submission_id, bounty_id, contributor, usd, at) "
                                    "VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
                                    (submission_id, bounty_id, contributor, usd, time.time())) > 0

    # -- the funnel as a whole ---------------------------------------------------------------------

    async def funnel(self) -> FunnelRow:
        states = dict(await self._db.all("SELECT state, COUNT(*) FROM submissions GROUP BY state"))
        tiers = [CostRow(int(t), float(c), float(w), int(n), int(k), float(r)) for t, c, w, n, k, r in
                 await self._db.all(
                     "SELECT tier, SUM(box_cpu_s), SUM(box_wall_s), SUM(box_calls), SUM(attacker_tokens), "
                     "SUM(review_s) FROM intake_costs GROUP BY tier ORDER BY tier")]
        # A quarantined version was accepted first: what it cost is part of what acceptance cost.
        accepted = await self._db.one("SELECT COUNT(*) FROM submissions WHERE state IN ('approved', 'quarantined')")
        payouts = await self._db.one("SELECT COALESCE(SUM(usd), 0) FROM payouts")
        return FunnelRow(states={str(k): int(v) for k, v in states.items()}, tiers=tiers, accepted=int(accepted[0]),
                         payouts_usd=float(payouts[0]))

    # -- quarantine and withdrawals ----------------------------------------------------------------

    async def quarantine(self, submission_id: int, env: str, reason: str, *, detail: str | None = None) -> int | None:
        """Quarantine ``env`` for good: its queued jobs are cancelled, its trajectories get a withdrawn
        score (reward 0, flagged) and a withdrawal row each. Returns how many were withdrawn. With ``detail``, the
        submission moves from approved to quarantined in the same transaction (None, and nothing done, if it is no
        longer approved): no reader sees it quarantined with its trajectories not yet withdrawn."""
        now = time.time()
        async with self._db.write() as db:
            if detail is not None and not await _set_state(db, submission_id, "quarantined", detail=detail,
                                                           expect=["approved"]):
                return None
            await db.execute("INSERT INTO quarantined_envs(env, submission_id, reason, at) VALUES (?,?,?,?) "
                             "ON CONFLICT DO NOTHING",
                             (env, submission_id, reason, now))
            await db.execute("UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND env=?",
                             (now, env))
            groups = [int(g[0]) for g in await db.execute_fetchall(
                "SELECT DISTINCT group_id FROM jobs WHERE env=? AND state='cancelled'", (env,))]
            await finish_groups(db, groups)
            return await withdraw(db, "t.env = ?", [env], now)

    async def canary_results(self, after_seq: int, upto_seq: int, limit: int = 500) -> list[CanaryRow]:
        """Production canaries' trajectories on contributed versions stored in ``(after_seq, upto_seq]``, in
        order (a range of the stream's index: a reader that comes back every few seconds reads what is new)."""
        return [CanaryRow(int(q), int(i), e, a, int(s), int(d), float(r), bool(p), st) for q, i, e, a, s, d, r, p, st in
                await self._db.all(
                    "SELECT seq, id, env, agent, seed, difficulty, reward, passed, status FROM trajectories "
                    "WHERE seq > ? AND seq <= ? AND substr(agent, 1, ?) = ? AND substr(env, 1, 8) = 'contrib:' "
                    "ORDER BY seq LIMIT ?", (after_seq, upto_seq, len(CANARY_PREFIX), CANARY_PREFIX, limit))]

    async def quarantined_envs(self) -> set[str]:
        return {str(r[0]) for r in await self._db.all("SELECT env FROM quarantined_envs")}

    async def withdrawals(self, after: int, limit: int = 1000, envs: Sequence[str] = ()) -> list[WithdrawalRow]:
        where = f" AND env IN ({','.join('?' * len(envs))})" if envs else ""
        return [WithdrawalRow(int(s), int(t), e, r) for s, t, e, r in await self._db.all(
            f"SELECT seq, trajectory_id, env, reason FROM withdrawals WHERE seq > ? {where} ORDER BY seq LIMIT ?",
            (after, *envs, limit))]


async def _set_state(db: Transaction, submission_id: int, state: str, *, tier: int | None = None,
                     detail: str | None = None, expect: Sequence[str] = (), decided: bool = False,
                     reviewer: str | None = None, note: str | None = None) -> bool:
    """``IntakeRecords.set_state`` in the caller's transaction."""
    if state not in STATES:
        raise ValueError(f"no submission state {state!r}")
    sets, args = ["state=?", "updated_at=?"], list[object]([state, time.time()])
    for column, value in (("tier", tier), ("detail", detail), ("reviewer", reviewer), ("review_note", note)):
        if value is not None:
            sets.append(f"{column}=?")
            args.append(value)
    if decided:
        sets.append("decided_at=?")
        args.append(time.time())
    where = "id=?" + (f" AND state IN ({','.join('?' * len(expect))})" if expect else "")
    return await db.execute(f"UPDATE submissions SET {', '.join(sets)} WHERE {where}",
                            (*args, submission_id, *expect)) > 0


async def withdraw(db: Transaction, where: str, params: Sequence[object], now: float) -> int:
    """In the caller's transaction: the trajectories matching ``where`` (over ``trajectories t``) whose
    environment is quarantined get a withdrawn verdict (reward 0, flagged), current from now on, and a withdrawal
    row, once each.
    Returns how many were withdrawn now. The store calls it too, for a rollout that was running when its
    environment was quarantined and is stored after. A production canary's is left alone: no stream ever sent
    it, and it stays the evidence it was (a wrong attempt the version rewarded)."""
    where = (f"({where}) AND substr(t.agent, 1, {len(CANARY_PREFIX)}) != '{CANARY_PREFIX}' AND NOT EXISTS "
             "(SELECT 1 FROM withdrawals w WHERE w.trajectory_id = t.id)")
    flags = json.dumps([QUARANTINED, WITHDRAWN])
    # The withdrawn verdict becomes each one's current verdict (every reader shows it), its earlier ones kept.
    reasons = db.sql.json_array("'withdrawn: ' || q.reason")
    await give(db, now, select=(
        f"SELECT t.id, t.verifier_version || '+quarantined', 0, 0, 'ok', {reasons}, CAST(? AS TEXT) "
        f"FROM trajectories t JOIN quarantined_envs q ON q.env = t.env WHERE {where} ORDER BY t.seq", (flags, *params)))
    return await db.execute(
        "INSERT INTO withdrawals(trajectory_id, env, reason, at) SELECT t.id, t.env, q.reason, ? FROM trajectories t "
        f"JOIN quarantined_envs q ON q.env = t.env WHERE {where} AND NOT EXISTS "
        "(SELECT 1 FROM withdrawals w WHERE w.trajectory_id = t.id) ORDER BY t.seq", (now, *params))
