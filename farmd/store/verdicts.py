"""The SQL of verdicts: which of a trajectory's verdicts is current, the history behind it, what changed since a mark.

A trajectory's row holds its current verdict (reward, passed, status, reasons, flags, verifier version), so every
reader that reads the row (listings, exports, streams, pass rates, the console, the task bank) shows the same one;
``verdict_version`` names it: 0 the verdict it was stored with, else the ``seq`` of the score that replaced it.
``scores`` holds every verdict it was given: the first (kind ``first``, copied there when a later one comes, so a
trajectory nobody looked at again costs no row), each later one that became current (``current``), and those
kept but never current (``kept``: given after the trajectory was withdrawn, which is for good, or not a verdict at
all, an error). ``seq`` only grows, across the whole store: a trajectory changed after mark M has a
``verdict_version`` above M, one range of an index.

``give`` is the one way a later verdict enters, inside its caller's transaction: a rescore and a coordinator's
check of a node's verdict (``Store.add_scores``), and a withdrawal (``farmd.store.intake.withdraw``, a node's
quarantine in ``farmd.store.nodes``). Reached as ``store.verdicts`` for the reads; it shares the store's database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from farmd import domain
from farmd.flags import OF_THE_ATTEMPT
from farmd.records import Score
from farmd.store.codec import log_unreadable, read_json
from farmd.store.database import MAX_VARS, Database, Transaction
from farmd.text import valid_tree

log = logging.getLogger("farmd.store")

FIRST, CURRENT, KEPT = "first", "current", "kept"

VerdictRow = tuple[int, str, float, bool, str, list[str], list[str]]
"""(trajectory id, verifier version, reward, passed, status, reasons, flags): a verdict to give."""

_PENDING_COLUMNS = "trajectory_id, verifier_version, reward, passed, status, reasons, flags"


def kept_verdicts(rows: Sequence[VerdictRow]) -> list[VerdictRow]:
    """The rows ``give`` may take: each verdict in its domain (``farmd.domain``), its text made valid. One out of it
    is not kept: logged, never read back."""
    kept: list[VerdictRow] = []
    for t, v, r, p, s, rs, fl in rows:
        problem = domain.reward_problem(r, p, s)
        if problem is None:
            kept.append((t, v, r, p, s, valid_tree(rs)[0], valid_tree(fl)[0]))
        else:
            log.error("a score of trajectory %s out of its domain was not kept: %s", t, problem,
                      extra={"event": "refused_score", "trajectory": t})
    return kept


async def _pending(db: Transaction) -> None:
    # A temporary table of the writing connection: verdicts given by a statement (a withdrawal's INSERT ... SELECT)
    # and by a list (a rescore's) go through the same three statements below. Neither answers anything, so both
    # ride with the transaction's next statement (``executemany``): a hop to SQLite's thread each was most of what
    # giving one verdict cost.
    await db.executemany(f"CREATE TEMP TABLE IF NOT EXISTS pending_verdicts (n {db.sql.serial_key()}, trajectory_id "
                         "BIGINT NOT NULL, verifier_version TEXT NOT NULL, reward DOUBLE PRECISION NOT NULL, passed "
                         "BIGINT NOT NULL, status TEXT NOT NULL, reasons TEXT NOT NULL, flags TEXT NOT NULL)", [()])
    await db.executemany(f"DELETE FROM {db.sql.temp('pending_verdicts')}", [()])


async def give(db: Transaction, now: float, *, rows: Sequence[VerdictRow] = (),
               select: tuple[str, Sequence[object]] | None = None) -> int:
    """Give trajectories later verdicts, in the caller's transaction: ``rows``, or what ``select`` (a SELECT of
    ``trajectory_id, verifier_version, reward, passed, status, reasons (JSON), flags (JSON)`` and its parameters)
    yields. Each is added to its trajectory's scores (one per verifier version: a version that scored it already
    keeps its score), its first verdict kept there once, and the newest one added becomes the row's current verdict,
    unless the trajectory was withdrawn (for good: the score is kept, the withdrawal stays current) or the verdict
    is an error (never a score). Returns how many scores were added."""
    await _pending(db)
    pending = db.sql.temp("pending_verdicts")
    if rows:
        await db.executemany(f"INSERT INTO {pending}({_PENDING_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
                             [(t, v, r, int(p), s, json.dumps(rs, ensure_ascii=False),
                               json.dumps(fl, ensure_ascii=False)) for t, v, r, p, s, rs, fl in rows])
    if select is not None:
        sql, params = select
        await db.execute(f"INSERT INTO {pending}({_PENDING_COLUMNS}) {sql}", params)
    # The attempt's own flags go on with each verdict given to it (``farmd.flags.OF_THE_ATTEMPT``).
    kept = ", ".join(f"'{f}'" for f in OF_THE_ATTEMPT)
    await db.executemany(
        f"UPDATE {pending} SET flags = (SELECT {db.sql.json_group_array('a.value')} FROM (SELECT g.value FROM "
        f"{db.sql.json_values('pending_verdicts.flags', 'g')} UNION ALL SELECT j.value FROM trajectories t, "
        f"{db.sql.json_values('t.flags', 'j')} WHERE t.id = pending_verdicts.trajectory_id AND j.value "
        f"IN ({kept}) AND j.value NOT IN (SELECT o.value FROM {db.sql.json_values('pending_verdicts.flags', 'o')})) "
        "AS a)", [()])
    top = await _mark(db)
    added = await db.execute(
        "INSERT INTO scores(trajectory_id, verifier_version, reward, passed, status, reasons, flags, "
        "scored_at, kind) SELECT p.trajectory_id, p.verifier_version, p.reward, p.passed, p.status, p.reasons, "
        f"p.flags, ?, CASE WHEN p.status = 'ok' AND NOT EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = "
        f"p.trajectory_id) THEN '{CURRENT}' ELSE '{KEPT}' END FROM {pending} p "
        "WHERE EXISTS (SELECT 1 FROM trajectories t WHERE t.id = p.trajectory_id) ORDER BY p.n ON CONFLICT DO NOTHING",
        (now,))
    if added:  # these and the DELETE ride with the caller's next statement, or its commit
        # The verdict each was stored with, kept before it is replaced (once: a later verdict finds it there).
        await db.executemany(
            "INSERT INTO scores(trajectory_id, verifier_version, reward, passed, status, reasons, flags, "
            f"scored_at, kind) SELECT t.id, t.verifier_version, t.reward, t.passed, t.status, t.reasons, t.flags, "
            f"t.finished_at, '{FIRST}' FROM trajectories t WHERE t.verdict_version = 0 AND t.id IN "
            "(SELECT trajectory_id FROM scores WHERE seq > ?) ON CONFLICT DO NOTHING", [(top,)])
        # Each one's newest current score: one with none newer. Not a MAX(seq) ... GROUP BY trajectory_id, which
        # SQLite's planner read by walking scores_by_trajectory whole for its order, every score ever given, for
        # each verdict given (8.7 ms at 200k scores, measured); this reads the new scores' range of seq.
        await db.executemany(
            "UPDATE trajectories SET reward = s.reward, passed = s.passed, status = s.status, reasons = s.reasons, "
            "flags = s.flags, verifier_version = s.verifier_version, verdict_version = s.seq FROM scores s "
            f"WHERE s.seq > ? AND s.kind = '{CURRENT}' AND trajectories.id = s.trajectory_id AND NOT EXISTS "
            f"(SELECT 1 FROM scores n WHERE n.trajectory_id = s.trajectory_id AND n.seq > s.seq AND n.kind = '{CURRENT}')",
            [(top,)])
    await db.executemany(f"DELETE FROM {pending}", [()])
    return added


async def _mark(db: Transaction) -> int:
    rows = await db.execute_fetchall("SELECT COALESCE(MAX(seq), 0) FROM scores")
    return int(next(iter(rows))[0])


def verdict_score(version: Any, reward: Any, passed: Any, status: Any, reasons: Any, flags: Any, at: Any, kind: Any,
                  seq: Any) -> Score | None:
    """A score row (or a trajectory's verdict columns) as a ``Score``, its ``verdict_version`` 0 for the first
    verdict and its ``seq`` for a later one; None when it is not one in its domain (a score is left out, never the
    record it scores)."""
    try:
        score = Score(version if isinstance(version, str) else "", reward, passed in (1, True), status,
                      read_json(reasons), read_json(flags), at, 0 if kind == FIRST else int(seq))
    except Exception:  # a score's JSON columns that do not decode, as a trajectory's body (see read_trajectory)
        return None
    if passed not in (0, 1) or domain.reward_problem(score.reward, score.passed, score.status) \
            or not isinstance(score.reasons, list) or not isinstance(score.flags, list) \
            or domain.time_problem(at, "scored_at"):
        return None
    return score


@dataclass
class VerdictChange:
    """A trajectory whose current verdict changed after a mark: what it is now, and every verdict it had."""

    trajectory_id: int
    env: str
    seq: int
    group_id: int
    seed: int
    difficulty: int
    agent: str
    policy_version: int
    group_done: int | None
    """Its group's place among finished groups (None: not finished), what the task bank reads groups by."""
    verdict_version: int
    withdrawn: bool
    withdrawal_reason: str
    current: Score | None
    """The row's verdict now (None: the row holds one out of its domain; its record reads as unreadable)."""
    scores: list[Score] = field(default_factory=list)
    """Every verdict it was given, the first (``verdict_version`` 0) included, in the order given."""


class VerdictRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def mark(self) -> int:
        """The store's verdict mark now: every verdict given after this has a higher ``verdict_version``."""
        row = await self._db.one("SELECT COALESCE(MAX(seq), 0) FROM scores")
        return int(row[0]) if row else 0

    async def changed(self, after: int, limit: int) -> list[VerdictChange]:
        """Trajectories whose current verdict changed after mark ``after``, in the order they changed (by
        ``verdict_version``: page on from the last one's), each with its scores."""
        rows = await self._db.all(
            "SELECT t.id, t.env, t.seq, t.group_id, t.seed, t.difficulty, t.agent, t.policy_version, t.verdict_version, "
            "t.verifier_version, t.reward, t.passed, t.status, t.reasons, t.flags, t.finished_at, "
            "(SELECT w.reason FROM withdrawals w WHERE w.trajectory_id = t.id ORDER BY w.seq LIMIT 1), "
            "(SELECT g.done_seq FROM groups g WHERE g.id = t.group_id) "
            # "> 0" as well: SQLite reads the partial index trajectories_by_verdict only for a bound it can see.
            "FROM trajectories t WHERE t.verdict_version > ? AND t.verdict_version > 0 ORDER BY t.verdict_version "
            "LIMIT ?", (after, limit))
        out = [VerdictChange(int(i), str(env), int(seq), int(g), int(seed), int(d), str(agent), int(pv),
                             None if done is None else int(done), int(vv), why is not None, str(why or ""),
                             verdict_score(v, r, p, st, rs, fl, at, "", int(vv)))
               for i, env, seq, g, seed, d, agent, pv, vv, v, r, p, st, rs, fl, at, why, done in rows]
        history = await self.score_history([c.trajectory_id for c in out])
        for c in out:
            c.scores = history.get(c.trajectory_id, [])
        return out

    async def at(self, trajectory_ids: Sequence[int], mark: int) -> dict[int, Score]:
        """The verdict each of these trajectories held at mark ``mark`` (what a reader that read it then saw), for
        those changed since (the others hold it still: not in the answer). A verdict out of its domain is left
        out."""
        out: dict[int, Score] = {}
        ids = list(trajectory_ids)
        for start in range(0, len(ids), MAX_VARS):
            chunk = ids[start:start + MAX_VARS]
            marks = ",".join("?" * len(chunk))
            # The newest score that was current by the mark; none: the first verdict (copied to the scores when
            # the first later one came, whatever its seq).
            rows: list[Any] = await self._db.all(
                "SELECT s.trajectory_id, s.verifier_version, s.reward, s.passed, s.status, s.reasons, s.flags, "
                "s.scored_at, s.kind, s.seq FROM trajectories t JOIN scores s ON s.seq = COALESCE("
                f"(SELECT MAX(c.seq) FROM scores c WHERE c.trajectory_id = t.id AND c.kind = '{CURRENT}' AND c.seq <= ?), "
                f"(SELECT f.seq FROM scores f WHERE f.trajectory_id = t.id AND f.kind = '{FIRST}')) "
                f"WHERE t.id IN ({marks}) AND t.verdict_version > ?", (mark, *chunk, mark))
            for tid, v, r, p, st, rs, fl, at, kind, seq in rows:
                score = verdict_score(v, r, p, st, rs, fl, at, kind, seq)
                if score is not None:
                    out[int(tid)] = score
        return out

    async def score_history(self, trajectory_ids: list[int]) -> dict[int, list[Score]]:
        """The scores table's verdicts of these trajectories, the first one first, then in the order given; one out
        of its domain is left out (logged), never the record it scores."""
        out: dict[int, list[Score]] = {}
        for start in range(0, len(trajectory_ids), MAX_VARS):
            ids = trajectory_ids[start:start + MAX_VARS]
            for tid, v, r, p, st, rs, fl, at, kind, seq in await self._db.all(
                    "SELECT trajectory_id, verifier_version, reward, passed, status, reasons, flags, scored_at, kind, "
                    f"seq FROM scores WHERE trajectory_id IN ({','.join('?' * len(ids))}) "
                    f"ORDER BY trajectory_id, kind != '{FIRST}', seq", ids):
                score = verdict_score(v, r, p, st, rs, fl, at, kind, seq)
                if score is not None:
                    out.setdefault(int(tid), []).append(score)
                else:
                    log_unreadable(f"{tid} (a score under {str(v)[:60]})", ["a score out of its domain"])
        return out
