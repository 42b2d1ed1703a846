"""The queue's steps that every writer of jobs takes inside its own transaction: groups and their jobs
queued, jobs failed or dropped, groups that ended given their places in the done order, and groups that
were never run here stored as finished.

Shared by the record modules that write jobs (``jobs``, ``nodes``' canaries and quarantine, ``intake``'s
quarantine, ``atropos``' pushed groups), so a group ends the same way whoever ended its last job.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from farmd.records import VERIFIED_EXTERNAL, Trajectory
from farmd.store.codec import INSERT_TRAJECTORY, traj_row
from farmd.store.database import MAX_VARS, Statements, Transaction


async def insert_groups(db: Transaction, groups: Iterable[tuple[str, int, int, str, int]],
                        source: str, run_id: int, now: float, *, canary_for: str | None = None) -> list[int]:
    """Groups and their queued jobs, inside the caller's transaction; their ids, in order. ``canary_for``: a
    node's canary groups, their jobs leasable by that node alone (``farmd.store.nodes``). The groups are numbered
    where they are written (``executemany_numbered``) and read back in one statement: on SQLite the whole insert is
    one hop to its thread, where it was one a group (a trainer's batch of 64 groups queued in 64)."""
    queued = list(groups)
    if not queued:
        return []
    await db.executemany_numbered(_TOP_GROUP, functools.partial(_queued_statements, queued, source, run_id, now,
                                                                canary_for))
    top = int((await db.fetchone(_TOP_GROUP))[0])
    return list(range(top - len(queued) + 1, top + 1))


_TOP_GROUP = "SELECT COALESCE(MAX(id), 0) FROM groups"


def _queued_statements(groups: list[tuple[str, int, int, str, int]], source: str, run_id: int, now: float,
                       canary_for: str | None, top: Sequence[Any]) -> Statements:
    """``insert_groups``' statements: the groups numbered on from ``top`` (``_TOP_GROUP``'s row), their jobs."""
    first = int(top[0]) + 1
    group_rows = [(first + i, env, seed, difficulty, agent, size, source, now, run_id, canary_for)
                  for i, (env, seed, difficulty, agent, size) in enumerate(groups)]
    job_rows = [(group_id, env, seed, difficulty, agent, source, now, now, canary_for)
                for group_id, env, seed, difficulty, agent, size, *_ in group_rows for _ in range(size)]
    return [("INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at, run_id, canary) "
             "VALUES (?,?,?,?,?,?,?,?,?,?)", group_rows),
            ("INSERT INTO jobs(group_id, env, seed, difficulty, agent, state, source, created_at, updated_at, "
             "for_node) VALUES (?,?,?,?,?,'queued',?,?,?,?)", job_rows)]


GIVE_BACK = ("state='queued', lease_owner=NULL, lease_expires=NULL, "
             "attempts=CASE WHEN attempts > 0 THEN attempts-1 ELSE 0 END")
"""SET of a lease given back to the queue with its attempt not counted (its rollout never ran, or ended by no fault
of its own); ``drop_cancelled`` then ends those of a cancelled run."""


async def drop_cancelled(db: Transaction, job_ids: list[int], now: float) -> int:
    """Jobs just put back in the queue whose run was cancelled meanwhile end there, cancelled: a
    cancelled run never starts a rollout again. Returns how many."""
    if not job_ids:
        return 0
    dropped = 0
    for start in range(0, len(job_ids), MAX_VARS):
        chunk = job_ids[start:start + MAX_VARS]
        rows = await db.execute_fetchall(
            f"UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND id IN "
            f"({','.join('?' * len(chunk))}) AND group_id IN (SELECT g.id FROM groups g JOIN runs r "
            f"ON r.id = g.run_id WHERE r.cancelled = 1) RETURNING group_id", (now, *chunk))
        groups = sorted({int(r[0]) for r in rows})
        dropped += len(list(rows))
        await finish_groups(db, groups)
    return dropped


async def insert_finished(db: Transaction, groups: list[list[Trajectory]], bodies: list[bytes],
                          *, source: str, now: float, verified_by: str = VERIFIED_EXTERNAL) -> None:
    """Groups that were never run here (pushed from outside, ``source`` says by what), stored as finished farm
    groups: their jobs done, their trajectories at the end of the stream, given ids, group ids and places
    here. Inside the caller's transaction, and sent with its next statement or its commit (the records' ids are
    set by then); ``bodies`` are the trajectories' ``pack_body``, in order. ``verified_by``: whose verdicts they
    hold (an Atropos environment's own scores, or the farm's, for completions a trainer sent to be judged)."""
    await db.executemany_numbered(_TOPS, functools.partial(_finished_statements, groups, bodies, source=source,
                                                           now=now, verified_by=verified_by))


LAST_SEQ = "SELECT COALESCE(MAX(seq), 0) FROM trajectories"
"""The last place taken in the stream: new trajectories take the places after it (writes are one at a time,
``Database.write``)."""
_TOPS = f"SELECT (SELECT COALESCE(MAX(id), 0) FROM groups), (SELECT COALESCE(MAX(id), 0) FROM jobs), ({LAST_SEQ})"
"""Where the ids of new groups, jobs and trajectories start."""


def place_in_stream(trajectories: Iterable[Trajectory], last: int, now: float) -> None:
    """``trajectories`` given the stream's next places after ``last``, in order, and a finish time if they had none."""
    for seq, t in enumerate(trajectories, start=last + 1):
        t.seq = seq
        t.finished_at = t.finished_at or now


def _finished_statements(groups: list[list[Trajectory]], bodies: list[bytes], tops: Sequence[Any], *, source: str,
                         now: float, verified_by: str) -> Statements:
    """``insert_finished``'s statements and their rows, numbered from ``tops`` (``_TOPS``' row)."""
    group_id, job_id, seq = (int(v) for v in tops)
    group_rows: list[tuple[Any, ...]] = []
    job_rows: list[tuple[Any, ...]] = []
    for members in groups:
        group_id += 1
        head = members[0]
        group_rows.append((group_id, head.env, head.seed, head.difficulty, head.agent, len(members), source, now))
        for t in members:
            job_id += 1
            t.id, t.group_id, t.run_id = job_id, group_id, 0
            t.verified_by = verified_by
            job_rows.append((job_id, group_id, t.env, t.seed, t.difficulty, t.agent, source, now, now))
    stored = [t for members in groups for t in members]
    place_in_stream(stored, seq, now)
    traj_rows = [traj_row(t, body) for t, body in zip(stored, bodies, strict=True)]
    return [("INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at, run_id) "
             "VALUES (?,?,?,?,?,?,?,?,0)", group_rows),
            ("INSERT INTO jobs(id, group_id, env, seed, difficulty, agent, state, source, created_at, "
             "updated_at) VALUES (?,?,?,?,?,?,'done',?,?,?)", job_rows),
            (INSERT_TRAJECTORY, traj_rows),
            (FINISH_GROUPS, [(row[0],) for row in group_rows])]


async def fail_job(db: Transaction, job_id: int, attempts: int, error: str, now: float,
                   logged: bool = False) -> None:
    if not logged:
        await db.execute("INSERT INTO failures(job_id, attempt, error, final, at) VALUES (?,?,?,1,?)",
                         (job_id, attempts, error[:2000], now))
    await db.execute("UPDATE jobs SET state='failed', lease_owner=NULL, lease_expires=NULL, last_error=?, "
                     "updated_at=? WHERE id=?", (error[:2000], now, job_id))
    await finish_group_of(db, job_id)


async def finish_group_of(db: Transaction, job_id: int) -> None:
    rows = await db.execute_fetchall("SELECT group_id FROM jobs WHERE id=?", (job_id,))
    await finish_groups(db, [int(r[0]) for r in rows])


async def finish_groups(db: Transaction, group_ids: list[int]) -> None:
    """Groups whose last job just ended get their places in the done order (whole-group streams),
    and the running total of trajectories in groups finished so far (how far a group cursor is)."""
    await db.executemany(FINISH_GROUPS, [(g,) for g in group_ids])


FINISH_GROUPS = (
    "UPDATE groups SET done_seq = (SELECT COALESCE(MAX(done_seq), 0) + 1 FROM groups), "
    "done_total = COALESCE((SELECT done_total FROM groups WHERE done_seq = "
    "(SELECT MAX(done_seq) FROM groups)), 0) + (SELECT COUNT(*) FROM trajectories WHERE group_id = groups.id) "
    "WHERE id = ? AND done_seq IS NULL AND canary IS NULL AND NOT EXISTS "
    "(SELECT 1 FROM jobs WHERE group_id = groups.id AND state IN ('queued', 'leased'))")
"""``finish_groups``' statement, one group id a row."""
