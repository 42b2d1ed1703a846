"""The store's reads of the farm over time: trajectories per time bucket and a policy's learning curve.

What the console draws and ``GetHistory`` / ``GetLearningCurve`` answer. Both read only the columns
stored before a record's body (env, level, agent, version, outcome, flags), so a look at a farm of a
million trajectories never decompresses one; ``trajectories_by_time`` and ``trajectories_by_agent``
(migration 9) keep them to the rows they count. Each trajectory counts by its current verdict (a rescore's),
and a withdrawn one not at all (a quarantine took it back: its verdict says nothing of the policy). A red team's
attempts are left out: wrong on purpose, they would read as a policy failing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from farmd.records import RED_TEAM_PREFIX
from farmd.store.database import Database

_COUNTED = ("substr(agent, 1, ?) != ? AND NOT EXISTS (SELECT 1 FROM withdrawals w "
            "WHERE w.trajectory_id = trajectories.id)")
"""Neither a red team's nor withdrawn."""
_RED_TEAM_ARGS = (len(RED_TEAM_PREFIX), RED_TEAM_PREFIX)


@dataclass
class ActivityBucket:
    """One environment's trajectories stored in ``[start, start + width)``."""

    start: float
    env: str
    trajectories: int
    passed: int
    errors: int
    mean_difficulty: float
    max_policy_version: int
    flags: dict[str, int] = field(default_factory=dict)


@dataclass
class CurvePoint:
    """Consecutive trajectories of one agent, in stream order."""

    rollouts: int
    """The agent's trajectories up to and including this point."""
    trajectories: int
    passed: int
    mean_difficulty: float
    policy_version: int
    time: float


class ActivityRecords:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def buckets(self, since: float, width_s: float) -> list[ActivityBucket]:
        """Per environment and ``width_s`` bucket from ``since``: counts, mean level, newest policy version
        and how many carried each flag (their current verdicts'); withdrawn ones are in none of it."""
        bucket = self._db.sql.integer_part("(finished_at - ?) / ?")
        rows = await self._db.all(
            f"SELECT {bucket} AS b, env, COUNT(*), SUM(CASE WHEN status='ok' AND passed=1 THEN 1 ELSE 0 END), SUM(CASE WHEN status='error' THEN 1 ELSE 0 END), "
            "AVG(difficulty), MAX(policy_version) FROM trajectories "
            f"WHERE finished_at >= ? AND {_COUNTED} GROUP BY b, env ORDER BY b, env",
            (since, width_s, since, *_RED_TEAM_ARGS))
        out = {(int(b), env): ActivityBucket(start=since + int(b) * width_s, env=env, trajectories=int(n),
                                             passed=int(p or 0), errors=int(e or 0), mean_difficulty=float(d or 0),
                                             max_policy_version=int(v or 0))
               for b, env, n, p, e, d, v in rows}
        flagged = await self._db.all(
            # A flags column that is not JSON (never written so) would fail the whole query: read as none.
            f"SELECT {bucket} AS b, env, f.value, COUNT(*) FROM trajectories, "
            f"{self._db.sql.json_values('trajectories.flags', 'f')} "
            f"WHERE finished_at >= ? AND {_COUNTED} GROUP BY b, env, f.value",
            (since, width_s, since, *_RED_TEAM_ARGS))
        for b, env, flag, n in flagged:
            found = out.get((int(b), env))
            if found is not None and isinstance(flag, str):
                found.flags[flag] = int(n)
        return list(out.values())

    async def learning_curve(self, agent: str, env: str | None, points: int) -> list[CurvePoint]:
        """``agent``'s trajectories (of ``env``, or all) in stream order, cut into at most ``points`` runs
        of equal length: each one's pass rate, mean level and newest policy version; withdrawn ones left out."""
        env_sql, env_args = (" AND env = ?", [env]) if env else ("", [])
        env_sql += " AND NOT EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = trajectories.id)"
        row = await self._db.one(f"SELECT COUNT(*) FROM trajectories WHERE agent = ?{env_sql}",
                                 (agent, *env_args))
        total = int(row[0]) if row else 0
        if not total:
            return []
        width = max(1, -(-total // max(1, points)))
        # Numbered in stream order, so a point is a count of rollouts, however seqs interleave with others'.
        rows = await self._db.all(
            "SELECT n / ? AS p, COUNT(*), SUM(CASE WHEN status='ok' AND passed=1 THEN 1 ELSE 0 END), AVG(difficulty), MAX(policy_version), "
            "MAX(finished_at) FROM (SELECT ROW_NUMBER() OVER (ORDER BY seq) - 1 AS n, status, passed, difficulty, "
            f"policy_version, finished_at FROM trajectories WHERE agent = ?{env_sql}) AS ranked GROUP BY p ORDER BY p",
            (width, agent, *env_args))
        out, seen = [], 0
        for _, n, passed, level, version, at in rows:
            seen += int(n)
            out.append(CurvePoint(rollouts=seen, trajectories=int(n), passed=int(passed or 0),
                                  mean_difficulty=float(level or 0), policy_version=int(version or 0),
                                  time=float(at or 0)))
        return out

    async def policy_agents(self, limit: int = 50) -> list[str]:
        """Agents whose trajectories a farm policy produced (a version above 0), newest first."""
        rows = await self._db.all(
            "SELECT agent, MAX(seq) AS last FROM trajectories WHERE policy_version > 0 AND "
            f"{_COUNTED} GROUP BY agent ORDER BY last DESC LIMIT ?", (*_RED_TEAM_ARGS, limit))
        return [str(agent) for agent, _ in rows]

