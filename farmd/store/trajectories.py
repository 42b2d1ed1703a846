"""The SQL of stored trajectories: reads in stream order and by group, groups as they finished, pass rates,
and the scores later verifiers gave (re-scoring adds, never overwrites).

Each trajectory is read with its current verdict and, whole, with every verdict it was given
(``farmd.store.verdicts``); a row that cannot be read comes back as a stub that says so (``codec``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from farmd import domain
from farmd.flags import UNREADABLE, WITHDRAWN
from farmd.records import RED_TEAM_PREFIX, Score, Trajectory, View
from farmd.store.codec import TRAJ_COLUMNS, Recent, read_trajectories, read_trajectory
from farmd.store.database import Database
from farmd.store.filters import WITHDRAWN_SQL, TrajectoryFilter, subscription
from farmd.store.verdicts import FIRST, VerdictRecords, give, kept_verdicts


@dataclasses.dataclass(frozen=True, slots=True)
class FinishedGroup:
    """A group as it finished (``finished_groups``): what the task bank learns from and whole-group streams cut."""

    id: int
    done_seq: int
    env: str
    seed: int
    difficulty: int
    agent: str
    size: int
    rewards: list[float]
    """Of its trajectories' current verdicts that count (none withdrawn, none in error, each in its domain)."""
    policy_version: int
    """The newest version among those rewards' trajectories (0: none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PassRate:
    """One environment at one level, by each trajectory's current verdict (``pass_rates``)."""

    env: str
    difficulty: int
    trajectories: int
    passed: int
    mean_reward: float | None
    errors: int


@dataclasses.dataclass(slots=True)
class _PassCounts:
    """Pass rates' sums by (env, level) over the trajectories stored up to ``seq``, with every verdict as it was at
    ``verdicts`` (the newest score's and withdrawal's marks): added to as trajectories are stored, read again from
    the start once a verdict changes."""

    seq: int
    verdicts: tuple[int, int]
    sums: dict[tuple[str, int], list[float]] = dataclasses.field(default_factory=dict)
    """(trajectories, passed, sum of counted rewards, counted rewards, errors)."""

    def add(self, rows: list[tuple[str, int, int, int, float, int, int]]) -> None:
        for env, difficulty, *figures in rows:
            sums = self.sums.setdefault((env, difficulty), [0, 0, 0.0, 0, 0])
            for i, figure in enumerate(figures):
                sums[i] += figure

    def rates(self) -> list[PassRate]:
        return [PassRate(env=env, difficulty=difficulty, trajectories=int(n), passed=int(p),
                         mean_reward=rs / rn if rn else None, errors=int(err))
                for (env, difficulty), (n, p, rs, rn, err) in sorted(self.sums.items())]


class TrajectoryRecords:
    """``recent``: records this process stored lately (``Recent``), served for rows unchanged since."""

    def __init__(self, db: Database, recent: Recent | None = None) -> None:
        self._db = db
        self._recent = recent or Recent()
        self._verdicts = VerdictRecords(db)
        self._pass_counts: _PassCounts | None = None
        """What ``pass_rates`` counted so far, and the marks it counted to."""
        self._pass_lock = asyncio.Lock()
        """One count at a time: two status reads at once would each add the same new trajectories."""

    # -- groups as they finished ------------------------------------------------------------------

    async def finished_groups(self, after: int, limit: int, *, agent: str | None = None,
                              envs: Sequence[str] = (), streamed: bool = False, as_of: int | None = None
                              ) -> list[FinishedGroup]:
        """Groups that ended after done position ``after``, in the order they ended, with their rewards (of their
        current verdicts, none withdrawn; ``as_of`` a verdict mark: of the verdicts they held at that mark, what a
        reader keeping up with ``store.verdicts.changed`` from there must count); only ``agent``'s and only those of
        ``envs`` when given (a subscription); ``streamed``: no group holding one withdrawn."""
        where, args = subscription(agent, envs, streamed=streamed, groups=True)
        groups = await self._db.all(
            f"SELECT id, done_seq, env, seed, difficulty, agent, size FROM groups WHERE done_seq > ? {where} "
            "ORDER BY done_seq LIMIT ?", (after, *args, limit))
        if not groups:
            return []
        rewards: dict[int, list[tuple[float, int]]] = {}
        marks = ",".join("?" * len(groups))
        rows = await self._db.all(
            f"SELECT group_id, reward, policy_version, status, {WITHDRAWN_SQL}, id, verdict_version FROM trajectories "
            f"WHERE group_id IN ({marks}) ORDER BY id", [g[0] for g in groups])
        then = {} if as_of is None else await self._verdicts.at([int(r[5]) for r in rows if r[6] > as_of], as_of)
        for gid, reward, version, status, withdrawn, tid, _ in rows:
            held = then.get(int(tid))
            if held is not None:
                reward, status, withdrawn = held.reward, held.status, WITHDRAWN in held.flags
            if status != "ok" or withdrawn:
                continue
            # A reward out of any domain (a NaN is stored as NULL) or a version that is not one counts for
            # nothing here; its record is served as unreadable (``read_trajectory``).
            if domain.reward_problem(reward, False, "ok", external=True) is None and isinstance(version, int):
                rewards.setdefault(gid, []).append((float(reward), int(version)))
        return [FinishedGroup(id=gid, done_seq=done, env=env, seed=seed, difficulty=difficulty, agent=agent, size=size,
                              rewards=[r for r, _ in rewards.get(gid, [])],
                              policy_version=max((v for _, v in rewards.get(gid, [])), default=0))
                for gid, done, env, seed, difficulty, agent, size in groups]

    # -- trajectories ---------------------------------------------------------------------------

    async def trajectory(self, traj_id: int) -> Trajectory | None:
        """One trajectory, whole, with its scores under every verifier version since."""
        row = await self._db.one(f"SELECT {TRAJ_COLUMNS} FROM trajectories WHERE id=?", (traj_id,))
        if row is None:
            return None
        return (await self._with_scores([await asyncio.to_thread(read_trajectory, row)]))[0]

    async def trajectories(self, *, after_seq: int = 0, limit: int = 100, env: str | None = None,
                           min_policy: int | None = None, newest_first: bool = False, view: View = "full",
                           before_seq: int | None = None, run_id: int = 0, agent: str | None = None,
                           envs: Sequence[str] = (), streamed: bool = False, where: TrajectoryFilter | None = None,
                           withdrawn: bool = True) -> list[Trajectory]:
        """Trajectories in stream order (or newest first), after ``after_seq`` and before ``before_seq``;
        ``view`` says how much of each record (``farmd.records.View``: a summary reads no body, and decompressing
        bodies is most of a read's cost). ``agent`` and ``envs``: only those (a subscription); ``streamed``: none withdrawn nor
        any a trainer is never sent; ``withdrawn`` False: none withdrawn; ``where``: what an operator looking for
        some narrows them to. Each holds its current verdict (``farmd.store.verdicts``)."""
        subscribed, sub_args = subscription(agent, envs, streamed=streamed)
        if not withdrawn:
            subscribed += f" AND NOT {WITHDRAWN_SQL}"
        narrowed, narrow_args = where.sql(self._db.sql) if where is not None else ("", [])
        args: list[object] = [after_seq, *sub_args, *narrow_args]
        where_sql: list[str] = [f"seq > ? {subscribed}{narrowed}"]
        if before_seq is not None:
            where_sql.append("seq < ?")
            args.append(before_seq)
        if run_id:
            where_sql.append("run_id = ?")
            args.append(run_id)
        if env is not None:
            where_sql.append("env = ?")
            args.append(env)
        if min_policy is not None:
            where_sql.append("policy_version >= ?")
            args.append(min_policy)
        order = "DESC" if newest_first else "ASC"
        rows = await self._db.all(
            f"SELECT {_columns(view)} FROM trajectories WHERE {' AND '.join(where_sql)} ORDER BY seq {order} LIMIT ?",
            (*args, limit))
        return await self._read(rows, view)

    async def _read(self, rows: list[Any], view: View) -> list[Trajectory]:
        if view == "summary":
            return read_trajectories(rows)
        # Decompressing and parsing bodies is the cost of a read: off the event loop, and skipped for what was just
        # stored (a trainer that keeps up reads only that).
        records = await asyncio.to_thread(self._recent.read, rows, view == "tokens")
        return records if view == "tokens" else await self._with_scores(records)

    async def _with_scores(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Whole records carry every verdict they were given, the first included: one query for a page. A
        trajectory never given a later one keeps its first in its row only, and reads it from there."""
        if not trajectories:
            return trajectories
        history = await self._verdicts.score_history([t.id for t in trajectories])
        for t in trajectories:
            t.scores = history.get(t.id, [])
            if t.verdict_version == 0 and not any(s.verdict_version == 0 for s in t.scores) \
                    and UNREADABLE not in t.flags:  # a stub's error verdict is no verdict it was given
                t.scores.insert(0, Score(t.verifier_version, t.reward, t.passed, t.status, list(t.reasons),
                                         list(t.flags), t.finished_at, 0))
        return trajectories

    async def group_trajectories(self, group_ids: list[int], view: View = "full") -> list[Trajectory]:
        if not group_ids:
            return []
        marks = ",".join("?" * len(group_ids))
        rows = await self._db.all(
            f"SELECT {_columns(view)} FROM trajectories WHERE group_id IN ({marks}) ORDER BY seq", group_ids)
        return await self._read(rows, view)

    async def withdrawn_count(self, *, env: str | None = None, run_id: int = 0,
                              where: TrajectoryFilter | None = None) -> int:
        """How many withdrawn trajectories match (of ``env``, of run ``run_id``, narrowed by ``where``): what a
        listing or an export that leaves them out says it left out. Read from the withdrawals, not the
        trajectories: as many rows as were withdrawn."""
        narrowed, narrow_args = where.sql(self._db.sql) if where is not None else ("", [])
        sql = (f"SELECT COUNT(*) FROM trajectories WHERE id IN (SELECT trajectory_id FROM withdrawals){narrowed}")
        args: list[object] = [*narrow_args]
        if env is not None:
            sql += " AND env = ?"
            args.append(env)
        if run_id:
            sql += " AND run_id = ?"
            args.append(run_id)
        row = await self._db.one(sql, args)
        return int(row[0]) if row else 0

    async def last_seq(self) -> int:
        row = await self._db.one("SELECT COALESCE(MAX(seq), 0) FROM trajectories")
        return int(row[0]) if row else 0

    async def pass_rates(self) -> list[PassRate]:
        """Per environment and level, by each trajectory's current verdict: trajectories, passed, mean reward,
        errors (never scores); withdrawn ones left out (a quarantine took them back: their verdicts say nothing of
        the policy, and their withdrawn 0 would read as it failing), and a red team's attempts (wrong on purpose,
        they would read as a policy failing).

        Read every stored trajectory once, then only those stored since (``_PassCounts``): a status read every
        second would otherwise scan the whole table every second, a cost that grows with the farm's age. Any
        verdict given or trajectory withdrawn since the last read makes it read them all again (rare: a rescore, a
        quarantine, a coordinator's check that disagreed)."""
        async with self._pass_lock:
            return await self._pass_rates()

    async def _pass_rates(self) -> list[PassRate]:
        marks = await self._db.one("SELECT (SELECT COALESCE(MAX(seq), 0) FROM trajectories), "
                                   "(SELECT COALESCE(MAX(seq), 0) FROM scores), (SELECT COALESCE(MAX(seq), 0) FROM withdrawals)")
        seq, verdicts = int(marks[0]), (int(marks[1]), int(marks[2]))
        counts = self._pass_counts
        if counts is None or counts.verdicts != verdicts or seq < counts.seq:
            counts = _PassCounts(seq=0, verdicts=verdicts)
        if seq > counts.seq:
            counts.add(await self._pass_rows(counts.seq, seq))
            counts.seq = seq
        self._pass_counts = counts
        return counts.rates()

    async def _pass_rows(self, after: int, upto: int) -> list[tuple[str, int, int, int, float, int, int]]:
        # Only rewards in a reward's domain count in the mean: one stored out of it (an infinity, a text) would
        # make every status read show it (``farmd.domain``; its record is served as unreadable).
        bound = domain.EXTERNAL_SCORE_BOUND
        counted = f"status='ok' AND {self._db.sql.is_number('reward')} AND reward BETWEEN ? AND ?"
        rows = await self._db.all(
            "SELECT env, difficulty, COUNT(*), SUM(CASE WHEN status='ok' AND passed=1 THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN {counted} THEN reward ELSE 0 END), SUM(CASE WHEN {counted} THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN status='error' THEN 1 ELSE 0 END) FROM trajectories WHERE seq > ? AND seq <= ? "
            f"AND substr(agent, 1, ?) != ? AND NOT {WITHDRAWN_SQL} GROUP BY env, difficulty",
            (-bound, bound, -bound, bound, after, upto, len(RED_TEAM_PREFIX), RED_TEAM_PREFIX))
        return [(e, int(d), int(n), int(p or 0), float(rs or 0.0), int(rn or 0), int(err or 0))
                for e, d, n, p, rs, rn, err in rows]

    async def finished_since(self, since: float) -> int:
        row = await self._db.one("SELECT COUNT(*) FROM trajectories WHERE finished_at >= ?", (since,))
        return int(row[0]) if row else 0

    # -- scores (re-scoring adds, never overwrites) ---------------------------------------------

    async def add_scores(self, rows: list[tuple[int, str, float, bool, str, list[str], list[str]]]) -> int:
        """(trajectory id, verifier version, reward, passed, status, reasons, flags) rows; a version that scored a
        trajectory already keeps its score. Each added becomes its trajectory's current verdict, the one every reader
        shows (its first kept in its scores), unless it was withdrawn or the verdict is an error: kept, never current
        (``farmd.store.verdicts.give``). A row whose verdict is out of its domain (``farmd.domain``) is not kept:
        logged, never read back. Returns how many were added."""
        now = time.time()
        rows = kept_verdicts(rows)
        if not rows:
            return 0
        async with self._db.write() as db:
            return await give(db, now, rows=rows)

    async def scores(self, traj_id: int) -> list[Score]:
        """Every verdict ``traj_id`` was given, the first included."""
        found = await self.trajectory(traj_id)
        return list(found.scores) if found is not None else []

    async def scored_versions(self, env: str) -> dict[int, set[str]]:
        """Per trajectory of ``env``, the verifier versions a later verdict scored it under (the verdict it was
        stored with is not one: rescoring under its version adds that score, as it always did)."""
        rows = await self._db.all(
            "SELECT s.trajectory_id, s.verifier_version FROM scores s JOIN trajectories t ON t.id = s.trajectory_id "
            f"WHERE t.env = ? AND s.kind != '{FIRST}'", (env,))
        out: dict[int, set[str]] = {}
        for tid, version in rows:
            out.setdefault(int(tid), set()).add(str(version))
        return out


def _columns(view: View) -> str:
    """The columns a read of ``view`` selects: a summary's leaves the body in the database."""
    return TRAJ_COLUMNS.replace("body", "NULL") if view == "summary" else TRAJ_COLUMNS
