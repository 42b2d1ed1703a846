"""The SQL of a fleet's trust in its nodes: results bound to their leases, canary groups, the coordinator's checks
of nodes' verdicts, and quarantined nodes with their results withdrawn.

Reached as ``store.nodes``; it shares the store's connections and its one-writer-at-a-time rule. When a node is
checked, and what a disagreement means, is the scheduler's (``farmd.scheduler.checks``, ``farmd.scheduler.nodes``);
this module keeps rows and keeps each change atomic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farmd.flags import QUARANTINED, WITHDRAWN
from farmd.records import Trajectory, verified_by_node
from farmd.store.database import Database
from farmd.store.groups import GIVE_BACK, drop_cancelled, insert_groups
from farmd.store.verdicts import VerdictRow, give, kept_verdicts
from farmd.text import bounded

"""What a lease says a result is (and its run, which a node's record does not know)."""
_SHOWN = 80
_RECORD_CHECK = ("INSERT INTO node_checks(job_id, node, kind, outcome, detail, at) VALUES (?,?,?,?,?,?) "
                 "ON CONFLICT(job_id) DO UPDATE SET node=excluded.node, kind=excluded.kind, outcome=excluded.outcome, "
                 "detail=excluded.detail, at=excluded.at")
_CONFIRM = ("UPDATE trajectories SET verified_by='coordinator' WHERE id=? AND verified_by=? AND NOT EXISTS "
            "(SELECT 1 FROM withdrawals w WHERE w.trajectory_id = trajectories.id)")


@dataclass(frozen=True, slots=True)
class Completion:
    """What one report of finished jobs came to."""

    stored: list[int] = field(default_factory=list)
    """Trajectories stored now, each under its lease's identity."""
    refused: dict[int, str] = field(default_factory=dict)
    """Jobs whose record disagreed with their lease, and how: not stored, back in the queue."""
    canaries: dict[int, Trajectory] = field(default_factory=dict)
    """Canary jobs now done, with their records (under their leases' identity): checked, never stored."""

    @property
    def reported(self) -> list[int]:
        """What the worker is told was stored: a canary's result looks stored like any other."""
        return sorted([*self.stored, *self.canaries])


def _shown(value: object) -> str:
    return bounded(repr(value), _SHOWN)


def lease_identity(record: Trajectory, row: Sequence[Any], newest: int = 0) -> tuple[Trajectory, str]:
    """``record`` under the identity its job's row gives (``(id, group_id, run_id, env, seed, difficulty, agent,
    policy_version, ...)``), and how the record disagreed with it ("" when it did not). A record from a node
    knows no run: 0 there is no disagreement. A model server's job (``openai:``) keeps the version its record
    says, when it is a version the farm has (0 to ``newest``): the version leased is what the farm expected, the
    record's is what the server said it sampled with (a sync may land between the lease and the request). The
    record is the store's to keep from here (``complete`` sets its place too): its fields are set in place, not
    copied, since a copy of every record is most of what this costs a worker's flush."""
    _, group_id, run_id, env, seed, difficulty, agent, policy_version = row[:8]
    version = int(policy_version)
    if str(agent).startswith("openai:") and 0 <= record.policy_version <= newest:
        version = record.policy_version
    leased = {"group_id": int(group_id), "env": str(env), "seed": int(seed), "difficulty": int(difficulty),
              "agent": str(agent), "policy_version": version}
    wrong = [f"{name} {_shown(getattr(record, name))} (its lease's is {_shown(value)})"
             for name, value in leased.items() if getattr(record, name) != value]
    if record.run_id and record.run_id != int(run_id or 0):
        wrong.append(f"run_id {_shown(record.run_id)} (its lease's is {int(run_id or 0)})")
    for name, value in leased.items():
        setattr(record, name, value)
    record.run_id = int(run_id or 0)
    return record, ("the record names " + "; ".join(wrong)) if wrong else ""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """What quarantining a node did, in one transaction."""

    withdrawn: int
    """Its results no coordinator check had confirmed, withdrawn from every stream (consumers are told)."""
    requeued: int
    """Jobs it held, back in the queue (their attempt not counted)."""
    cancelled: int
    """Canary jobs waiting for it, dropped."""


@dataclass(frozen=True, slots=True)
class CheckRow:
    job_id: int
    node: str
    kind: str
    outcome: str
    detail: str
    at: float


class NodeRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    # -- canaries ----------------------------------------------------------------------------------

    async def enqueue_canary(self, node: str, template_job: int, agent: str, max_size: int | None = None
                             ) -> tuple[int | None, int] | None:
        """A canary group for ``node`` shaped as ``template_job``'s group (environment, task, size, source) with
        ``agent`` acting, its jobs leasable by ``node`` alone. Ids come from the same sequences as every job's.
        Returns the group's (id, size), or (None, size) when the template's group is over ``max_size`` (nothing
        is written: the caller knows what to wait for); None when the template is gone."""
        # A group's shape never changes once made, so it is read outside the write: a read takes no write lock.
        template = await self._db.one(
            "SELECT g.env, g.seed, g.difficulty, g.size, g.source FROM jobs j JOIN groups g ON g.id = j.group_id "
            "WHERE j.id = ?", (template_job,))
        if template is None:
            return None
        env, seed, difficulty, size, source = template
        if max_size is not None and int(size) > max_size:
            return None, int(size)
        now = time.time()
        async with self._db.write() as db:
            (group_id,) = await insert_groups(db, [(env, seed, difficulty, agent, int(size))], source, 0,
                                              now, canary_for=node)
            return group_id, int(size)

    async def cancel_canaries(self, node: str | None = None) -> int:
        """Drop canary jobs still queued for ``node`` (None: for every node; a coordinator starting has no
        nodes yet, and each gets canaries of its own once it works). Returns how many."""
        async with self._db.write() as db:
            return await db.execute(
                "UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND for_node IS NOT NULL "
                "AND (CAST(? AS TEXT) IS NULL OR for_node = ?)", (time.time(), node, node))

    # -- checks --------------------------------------------------------------------------------------

    async def record_check(self, job_id: int, node: str, kind: str, outcome: str, detail: str) -> None:
        async with self._db.write() as db:
            await db.execute(_RECORD_CHECK, (job_id, node, kind, outcome, detail, time.time()))

    async def reverified(self, node: str, kind: str, score: VerdictRow, outcome: str, detail: str, *,
                         confirm: bool) -> None:
        """The coordinator verified ``node``'s result again: ``score`` given to the trajectory (``verdicts.give``:
        a later verdict, current unless withdrawn), the node's verdict confirmed where ``confirm`` (the trajectory
        says ``verified_by='coordinator'`` from then on, unless it no longer reads as the node's: withdrawn with it),
        and the check recorded (as ``record_check``), in one transaction: a crash leaves all or none, and what were
        three writes of a dozen statements are a handful of round trips."""
        now = time.time()
        kept = kept_verdicts([score])  # before the writer is held
        async with self._db.write() as db:
            if kept:
                await give(db, now, rows=kept)
            if confirm:
                await db.executemany(_CONFIRM, [(score[0], verified_by_node(node))])
            await db.executemany(_RECORD_CHECK, [(score[0], node, kind, outcome, detail, now)])

    async def checks(self, node: str, limit: int = 100) -> list[CheckRow]:
        """``node``'s latest checks, newest first."""
        return [CheckRow(int(j), n, k, o, d, float(a)) for j, n, k, o, d, a in await self._db.all(
            "SELECT job_id, node, kind, outcome, detail, at FROM node_checks WHERE node=? ORDER BY at DESC LIMIT ?",
            (node, limit))]

    # -- quarantine ----------------------------------------------------------------------------------

    async def quarantined(self) -> dict[str, tuple[str, float]]:
        """Every quarantined node: (why, since when)."""
        return {str(n): (str(r), float(a)) for n, r, a in
                await self._db.all("SELECT name, reason, at FROM quarantined_nodes")}

    async def quarantine(self, node: str, reason: str, *, everything: bool = False) -> Quarantined:
        """Quarantine ``node`` for good (until ``clear``), in one transaction: every result of its that reads as its
        own verdict still (none the coordinator confirmed; ``everything``: those it confirmed too) gets a withdrawn
        verdict (reward 0, flagged), current from now on, and a withdrawal row, and its group leaves whole-group
        streams; the jobs it holds
        go back to the queue, and canary jobs waiting for it are dropped."""
        now = time.time()
        async with self._db.write() as db:
            await db.execute("INSERT INTO quarantined_nodes(name, reason, at) VALUES (?,?,?) ON CONFLICT(name) "
                             "DO UPDATE SET reason=excluded.reason, at=excluded.at",
                             (node, reason, now))
            # One scan for its results (a quarantine is rare; an index on every trajectory's row is not).
            ids = [int(r[0]) for r in await db.execute_fetchall(
                "SELECT id FROM trajectories WHERE verified_by = ? OR (? = 1 AND node = ? AND verified_by = 'coordinator') "
                "ORDER BY seq", (verified_by_node(node), int(everything), node))]
            withdrawn = 0
            flags = json.dumps([QUARANTINED, WITHDRAWN])
            why = f"withdrawn: node {node} was quarantined: {reason}"
            for start in range(0, len(ids), 10_000):
                chunk = ids[start:start + 10_000]
                marks = ",".join("?" * len(chunk))
                await give(db, now, select=(
                    f"SELECT id, verifier_version || '+quarantined', 0, 0, 'ok', {db.sql.json_array('CAST(? AS TEXT)')}, "
                    "CAST(? AS TEXT) FROM trajectories t "
                    f"WHERE id IN ({marks}) AND NOT EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = t.id) "
                    "ORDER BY seq", (why, flags, *chunk)))
                withdrawn += await db.execute(
                    "INSERT INTO withdrawals(trajectory_id, env, reason, at) SELECT t.id, t.env, ?, ? FROM trajectories t "
                    f"WHERE t.id IN ({marks}) AND NOT EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = t.id) "
                    "ORDER BY t.seq", (f"node {node} quarantined: {reason}", now, *chunk))
                await db.execute(f"UPDATE groups SET withheld = 1 WHERE id IN (SELECT group_id FROM trajectories "
                                 f"WHERE id IN ({marks}))", chunk)
            prefix = f"{node}:"
            held = [int(r[0]) for r in await db.execute_fetchall(
                f"UPDATE jobs SET {GIVE_BACK}, last_error='its node was quarantined', updated_at=? WHERE state='leased' "
                "AND substr(lease_owner, 1, ?) = ? RETURNING id", (now, len(prefix), prefix))]
            cancelled = {int(r[0]) for r in await db.execute_fetchall(
                "UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND for_node = ? RETURNING id",
                (now, node))}
            back = [j for j in held if j not in cancelled]
            dropped = await drop_cancelled(db, back, now)
            return Quarantined(withdrawn=withdrawn, requeued=len(back) - dropped, cancelled=len(cancelled))

    async def clear(self, node: str) -> str | None:
        """Let ``node`` join again; why it had been quarantined, or None if it was not. What was withdrawn stays
        withdrawn: consumers were told."""
        async with self._db.write() as db:
            rows = await db.execute_fetchall("DELETE FROM quarantined_nodes WHERE name=? RETURNING reason", (node,))
            found = next(iter(rows), None)
            return None if found is None else str(found[0])
