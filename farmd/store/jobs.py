"""The durable job queue's SQL: groups queued (alone or as a run), runs and their progress, leases taken,
extended, expired and given back, jobs failed, and jobs completed with their trajectories stored.

Completing a job and storing its trajectory is one transaction (a job's id is its trajectory's id, so a
retried completion can never store twice), and an accepted job is in the database before ``enqueue``
returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from farmd.records import VERIFIED_LOCAL, Job, JobState, Trajectory, evolve
from farmd.store.codec import INSERT_TRAJECTORY, Recent, checked_bodies, traj_row
from farmd.store.database import MAX_VARS, Database, Dialect, Statements, Transaction
from farmd.store.groups import (
    GIVE_BACK,
    LAST_SEQ,
    drop_cancelled,
    fail_job,
    finish_groups,
    insert_finished,
    insert_groups,
    place_in_stream,
)
from farmd.store.intake import withdraw
from farmd.store.nodes import Completion, lease_identity

log = logging.getLogger("farmd.store")

_JOB_COLUMNS = "id, group_id, env, seed, difficulty, agent, state, attempts, lease_owner, lease_expires, " \
               "policy_version, source"
CONTRIBUTED_ENV_PREFIX = "contrib:"
"""Only a contributed environment can be quarantined: only its trajectories are looked at for withdrawal."""


_OF_RUNS = "run_id != 0"
"""The term of ``groups_by_run``'s and ``trajectories_by_run``'s WHERE (groups the demand made are run 0): written
into a query of runs' rows, it lets SQLite read those partial indexes, which it takes only where the query's own
terms imply theirs; without it, each read of a run walked every group, job and trajectory the farm ever had."""
_ENDPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _endpoint_filter(dialect: Dialect, endpoint: str | None, exclude: Sequence[str]) -> tuple[str, list[str]]:
    """SQL (``AND ...``, and its arguments) that keeps the jobs of ``endpoint``'s agents only, or none of
    ``exclude``'s. A shell pattern (``Dialect.glob``), not LIKE: an endpoint's name may hold ``_``, which LIKE reads
    as any character; a name holds none of a pattern's (``*?[``), and ``[?]`` is the query string's literal ``?``."""
    def of(name: str) -> tuple[str, list[str]]:
        if not _ENDPOINT_NAME.fullmatch(name):
            raise ValueError(f"not an endpoint name: {name!r}")
        glob = dialect.glob("agent")
        return f"({glob} OR {glob})", [dialect.glob_pattern(f"openai:*@{name}"),
                                       dialect.glob_pattern(f"openai:*@{name}[?]*")]
    if endpoint is not None:
        sql, args = of(endpoint)
        return f"AND {sql} ", args
    parts = [of(name) for name in exclude]
    if not parts:
        return "", []
    return "".join(f"AND NOT {sql} " for sql, _ in parts), [a for _, args in parts for a in args]


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """A run as queued, and how far its jobs have come (``run``, ``runs``)."""

    id: int
    env: str
    agent: str
    rollouts: int
    group_size: int
    group_ids: list[int]
    state: str
    """running, succeeded, failed or cancelled."""
    jobs: int
    done: int
    failed: int
    cancelled: int
    passed: int
    created_at: float
    finished_at: float
    """When its last job ended (0: a job is still queued or leased)."""
    last_error: str
    """Its newest job error, as the job keeps it ("": none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobFailure:
    """One failed attempt at a job: an infrastructure failure, never a score."""

    job_id: int
    run_id: int
    """0: a job production queued, not a run."""
    attempt: int
    final: bool
    """Its last attempt: the job failed for good."""
    error: str
    """What the worker said, ``Kind: message`` (``farmd.errors``' class names), bounded when it was stored."""
    at: float


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseAsk:
    """One worker's lease request (``JobRecords.lease``' arguments), as ``lease_many`` takes many."""

    owner: str
    n: int
    endpoint: str | None = None
    exclude: tuple[str, ...] = ()


def _stored_statements(keep: list[Trajectory], bodies: dict[int, bytes], now: float, rows: list[tuple[Any, ...]],
                       top: Sequence[Any]) -> Statements:
    """``complete_leases``' trajectories given their places in the stream after ``top`` (the greatest ``seq``
    stored), and their rows, which are also added to ``rows`` (the caller keeps them for the streams)."""
    place_in_stream(keep, int(top[0]), now)
    rows.extend(traj_row(t, bodies[t.id]) for t in keep)
    return [(INSERT_TRAJECTORY, rows)]


def _job(row: Any) -> Job:
    return Job(id=row[0], group_id=row[1], env=row[2], seed=row[3], difficulty=row[4], agent=row[5],
               state=JobState(row[6]), attempts=row[7], lease_owner=row[8], lease_expires=row[9],
               policy_version=row[10], source=row[11])


def _node(owner: str) -> str:
    return owner.partition(":")[0]  # a canary's jobs go to the node it tests, and to no other


async def _lease_alone(db: Transaction, ask: LeaseAsk, which: tuple[str, list[str]], now: float, lease_s: float,
                       version_for: Callable[[str], int]) -> list[Job]:
    jobs = [_job(r) for r in await db.execute_fetchall(
        f"UPDATE jobs SET state='leased', lease_owner=?, lease_expires=?, policy_version=0, "
        f"attempts=attempts+1, updated_at=? WHERE id IN "
        f"(SELECT id FROM jobs WHERE state='queued' AND not_before <= ? AND (for_node IS NULL OR for_node = ?) "
        f"{which[0]}ORDER BY id LIMIT ?) RETURNING {_JOB_COLUMNS}",
        (ask.owner, now + lease_s, now, now, _node(ask.owner), *which[1], ask.n))]
    versions = {agent: version_for(agent) for agent in {j.agent for j in jobs}}
    tagged: dict[int, list[int]] = {}
    for j in jobs:
        if versions[j.agent]:
            tagged.setdefault(versions[j.agent], []).append(j.id)
    for version, ids in tagged.items():  # rides with the commit: no hop of its own
        for start in range(0, len(ids), MAX_VARS):
            chunk = ids[start:start + MAX_VARS]
            await db.executemany(f"UPDATE jobs SET policy_version=? WHERE id IN ({','.join('?' * len(chunk))})",
                                 [(version, *chunk)])
    return sorted((evolve(j, policy_version=versions[j.agent]) for j in jobs), key=lambda j: j.id)


ANALYZE_AFTER = 500
"""Jobs queued (by this process) before the planner's statistics of the queue are first brought up to date."""
_LEASED_TOGETHER = 1024
"""Jobs one UPDATE of ``_lease_together`` leases at most (five parameters each, well under either database's
limit); more go in further statements."""


async def _lease_together(db: Transaction, asks: list[LeaseAsk], which: tuple[str, list[str]], now: float,
                          lease_s: float, version_for: Callable[[str], int]) -> list[list[Job]] | None:
    """What each of ``asks`` (one endpoint filter) takes, as ``_lease_alone`` one after the other would give it; None
    when the jobs read cannot say (nothing is written then)."""
    nodes = sorted({_node(ask.owner) for ask in asks})
    wanted = sum(ask.n for ask in asks)
    rows = await db.execute_fetchall(
        f"SELECT id, for_node, agent FROM jobs WHERE state='queued' AND not_before <= ? AND (for_node IS NULL OR "
        f"for_node IN ({','.join('?' * _bucket(len(nodes)))})) {which[0]}ORDER BY id LIMIT ?",
        (now, *_padded(nodes), *which[1], wanted))
    picks = _share_out([(int(i), node) for i, node, _ in rows], [(_node(a.owner), a.n) for a in asks],
                       complete=len(rows) < wanted)
    if picks is None:
        return None
    agents = {int(i): str(agent) for i, _, agent in rows}
    versions = {agent: version_for(agent) for agent in set(agents.values())}  # once an agent, as _lease_alone
    owners = {job_id: ask.owner for ask, ids in zip(asks, picks, strict=True) for job_id in ids}
    leased: dict[int, Job] = {}
    ids = list(owners)
    for start in range(0, len(ids), _LEASED_TOGETHER):
        chunk = ids[start:start + _LEASED_TOGETHER]
        size = _bucket(len(chunk))  # a handful of statement shapes, each prepared once
        pad = [-1] * (size - len(chunk))  # no job has id -1
        owner_cases = [v for i in chunk + pad for v in (i, owners.get(i))]
        version_cases = [v for i in chunk + pad for v in (i, versions[agents[i]] if i in agents else 0)]
        for row in await db.execute_fetchall(
                f"UPDATE jobs SET state='leased', lease_owner=CASE id {' '.join(['WHEN ? THEN ?'] * size)} END, "
                f"lease_expires=?, policy_version=CASE id {' '.join(['WHEN ? THEN CAST(? AS BIGINT)'] * size)} "
                f"ELSE 0 END, attempts=attempts+1, updated_at=? WHERE id IN ({','.join('?' * size)}) RETURNING {_JOB_COLUMNS}",
                (*owner_cases, now + lease_s, *version_cases, now, *chunk, *pad)):
            job = _job(row)
            leased[job.id] = job
    return [[leased[i] for i in ids] for ids in picks]


def _share_out(queued: list[tuple[int, str | None]], asks: list[tuple[str, int]], *, complete: bool
               ) -> list[list[int]] | None:
    """``queued`` (id, the node it is only for), oldest first, shared out to ``asks`` (node, how many) in their
    order, each taking the oldest it may that no ask before it took: what each would take alone, one after the
    other, if ``queued`` holds every job any of them may take (``complete``) or every ask got all it asked for
    (the jobs past those read are all newer); None otherwise."""
    taken: set[int] = set()
    picks: list[list[int]] = []
    for node, n in asks:
        mine: list[int] = []
        for job_id, only_for in queued:
            if len(mine) == n:
                break
            if job_id not in taken and (only_for is None or only_for == node):
                mine.append(job_id)
        if len(mine) < n and not complete:
            return None
        taken.update(mine)
        picks.append(mine)  # oldest first, as queued is
    return picks


def _bucket(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _padded(values: list[str]) -> list[str]:
    """``values``, repeated at the end up to a power of two long (``_bucket``): as many statement shapes as that."""
    return values + [values[-1]] * (_bucket(len(values)) - len(values))


class JobRecords:
    """``recent``: where what it stores is kept for the streams to read back (``Recent``)."""

    def __init__(self, db: Database, recent: Recent | None = None) -> None:
        self._db = db
        self._recent = recent or Recent()
        self._settled_upto = 0
        """Every job up to this id is done, failed or cancelled, for good (``job_counts``)."""
        self._settled: dict[str, int] = {}
        """Those jobs by state, canaries left out."""
        self._counting = asyncio.Lock()
        self._queued_since = 0
        """Jobs this process queued since the planner's statistics of ``jobs`` were last brought up to date."""
        self._analyzed = 0
        """Jobs this process had queued by then."""

    # -- the job queue --------------------------------------------------------------------------

    async def enqueue(self, groups: Iterable[tuple[str, int, int, str, int]], source: str = "request") -> list[int]:
        """Add groups of (env, seed, difficulty, agent, size) jobs. Returns the group ids. Durable on return."""
        queued = list(groups)
        async with self._db.write() as db:
            ids = await insert_groups(db, queued, source, 0, time.time())
        await self._queued(queued)
        return ids

    async def enqueue_run(self, env: str, agent: str, rollouts: int, group_size: int,
                          groups: Iterable[tuple[str, int, int, str, int]]) -> tuple[int, list[int]]:
        """A run and its groups, in one transaction. Returns (run id, group ids)."""
        now = time.time()
        queued = list(groups)
        async with self._db.write() as db:
            run_id = await db.insert("INSERT INTO runs(env, agent, rollouts, group_size, created_at) VALUES (?,?,?,?,?)",
                                     (env, agent, rollouts, group_size, now))
            ids = await insert_groups(db, queued, "request", run_id, now)
        await self._queued(queued)
        return run_id, ids

    async def _queued(self, groups: list[tuple[str, int, int, str, int]]) -> None:
        """After jobs were queued: once a tenth more than the statistics know of (``ANALYZE_AFTER`` at least), bring
        them up to date. PostgreSQL's planner, going by statistics that predate a large run, took the queue for a
        few dozen jobs and read every queued job to lease a few (5 ms a lease at 29,000 queued, measured), until
        autovacuum looked again, about once a minute; on a new farm it had none at all."""
        self._queued_since += sum(max(0, size) for *_, size in groups)
        if self._queued_since < max(ANALYZE_AFTER, self._analyzed // 10):
            return
        self._analyzed += self._queued_since
        self._queued_since = 0
        try:
            await self._db.analyze("jobs")
        except Exception:  # the queue is stored; statistics are the planner's, and autovacuum's too
            log.exception("updating the planner's statistics of the job queue failed")

    async def store_finished(self, groups: list[list[Trajectory]], bodies: list[bytes], *, source: str) -> None:
        """Groups judged here that no job of the queue ran (completions a trainer sent to be verified), stored as
        finished groups in one transaction: their trajectories given ids and places in the stream, verdicts the
        farm's own (``verified_by`` local). ``bodies``: the trajectories' ``pack_body``, in order."""
        async with self._db.write() as db:
            await insert_finished(db, groups, bodies, source=source, now=time.time(), verified_by=VERIFIED_LOCAL)

    # -- runs -----------------------------------------------------------------------------------

    async def run(self, run_id: int) -> RunSummary | None:
        """A run as queued, and how far its jobs have come."""
        found = await self._runs([run_id])
        return found[0] if found else None

    async def runs(self, before_id: int = 0, limit: int = 50) -> list[RunSummary]:
        """Runs newest first, starting below ``before_id`` (0: from the newest)."""
        ids = await self._db.all("SELECT id FROM runs WHERE (? = 0 OR id < ?) ORDER BY id DESC LIMIT ?",
                                 (before_id, before_id, limit))
        return await self._runs([int(r[0]) for r in ids])

    async def _runs(self, run_ids: list[int]) -> list[RunSummary]:
        """``run`` for many runs in a handful of queries (a page of runs is not a query per run)."""
        out = []
        for start in range(0, len(run_ids), MAX_VARS):
            chunk = run_ids[start:start + MAX_VARS]
            marks = ",".join("?" * len(chunk))
            rows = await self._db.all(f"SELECT id, env, agent, rollouts, group_size, cancelled, created_at FROM runs "
                                      f"WHERE id IN ({marks})", chunk)
            groups: dict[int, list[int]] = {}
            for run_id, group_id in await self._db.all(
                    f"SELECT run_id, id FROM groups WHERE run_id IN ({marks}) AND {_OF_RUNS} ORDER BY id", chunk):
                groups.setdefault(int(run_id), []).append(int(group_id))
            counts: dict[int, dict[str, int]] = {}
            ended: dict[int, float] = {}
            for run_id, state, n, last in await self._db.all(
                    f"SELECT g.run_id, j.state, COUNT(*), MAX(j.updated_at) FROM jobs j JOIN groups g "
                    f"ON g.id = j.group_id WHERE g.run_id IN ({marks}) AND g.{_OF_RUNS} GROUP BY g.run_id, j.state",
                    chunk):
                counts.setdefault(int(run_id), {})[state] = int(n)
                ended[int(run_id)] = max(ended.get(int(run_id), 0.0), float(last))
            passed = {int(r): int(n) for r, n in await self._db.all(
                f"SELECT run_id, COUNT(*) FROM trajectories WHERE run_id IN ({marks}) AND {_OF_RUNS} AND status='ok' "
                "AND passed=1 GROUP BY run_id", chunk)}
            # Each run's newest job error (numbered per run, newest first: one statement both dialects run).
            errors = {int(r): (str(e), float(at)) for r, e, at in await self._db.all(
                "SELECT run_id, last_error, updated_at FROM (SELECT g.run_id, j.last_error, j.updated_at, ROW_NUMBER() "
                "OVER (PARTITION BY g.run_id ORDER BY j.updated_at DESC) AS r FROM jobs j JOIN groups g ON g.id = "
                f"j.group_id WHERE g.run_id IN ({marks}) AND g.{_OF_RUNS} AND j.last_error IS NOT NULL) AS newest "
                "WHERE r = 1", chunk)}
            for run_id, env, agent, rollouts, group_size, cancelled, created_at in rows:
                jobs = counts.get(run_id, {})
                open_jobs = jobs.get("queued", 0) + jobs.get("leased", 0)
                if cancelled:
                    state = "cancelled"
                elif open_jobs:
                    state = "running"
                else:
                    state = "failed" if jobs.get("failed", 0) else "succeeded"
                out.append(RunSummary(
                    id=run_id, env=env, agent=agent, rollouts=rollouts, group_size=group_size,
                    group_ids=groups.get(run_id, []), state=state, jobs=sum(jobs.values()), done=jobs.get("done", 0),
                    failed=jobs.get("failed", 0), cancelled=jobs.get("cancelled", 0), passed=passed.get(run_id, 0),
                    created_at=created_at, finished_at=ended.get(run_id, 0.0) if not open_jobs else 0.0,
                    last_error=errors.get(run_id, ("", 0.0))[0]))
        order = {run_id: i for i, run_id in enumerate(run_ids)}
        return sorted(out, key=lambda r: order[r.id])

    async def cancel_run(self, run_id: int) -> bool:
        """Drop a run's queued jobs (rollouts already leased finish and are stored). False: no such run."""
        now = time.time()
        async with self._db.write() as db:
            if not await db.execute("UPDATE runs SET cancelled=1 WHERE id=?", (run_id,)):
                return False
            await db.execute("UPDATE jobs SET state='cancelled', updated_at=? WHERE state='queued' AND group_id IN "
                             f"(SELECT id FROM groups WHERE run_id=? AND {_OF_RUNS})", (now, run_id))
            groups = [int(g[0]) for g in await db.execute_fetchall(
                f"SELECT id FROM groups WHERE run_id=? AND {_OF_RUNS}", (run_id,))]
            await finish_groups(db, groups)
        return True

    async def lease(self, owner: str, n: int, lease_s: float, policy_version: int | Callable[[str], int], *,
                    endpoint: str | None = None, exclude: Sequence[str] = ()) -> list[Job]:
        """Lease up to ``n`` queued jobs (oldest first) whose backoff has passed to ``owner`` until now +
        ``lease_s``, each tagged with the policy version it runs: ``policy_version(its agent spec)``, or
        ``policy_version`` itself for every job (0: none). ``endpoint``: only jobs of agents ``openai:MODEL@`` that
        endpoint; ``exclude``: no jobs of these endpoints (a worker's endpoints each have their own cap)."""
        (jobs,) = await self.lease_many([LeaseAsk(owner, n, endpoint, tuple(exclude))], lease_s, policy_version)
        return jobs

    async def lease_many(self, asks: Sequence[LeaseAsk], lease_s: float, policy_version: int | Callable[[str], int]
                         ) -> list[list[Job]]:
        """``lease`` for each of ``asks`` in turn, in one transaction (many nodes asking at once pay one). An ask
        whose endpoint is not an endpoint's name fails the whole: ValueError, before anything is written.

        Asks that follow one another with the same endpoint filter are served together, in two statements: the
        queued jobs any of them may take, read once (as many as they ask for in all), shared out in the asks'
        order as each ask alone would take them (``_share_out``), then leased in one UPDATE. One statement an ask
        was most of what a fleet's leases cost: on PostgreSQL a round trip each (about 90 us of the coordinator's
        CPU, and the server's parse and plan), on SQLite a hop to its connection's thread. Where the jobs read
        cannot say what an ask would have taken (one ask short while more jobs may lie past those read), those
        asks are served one statement each, as before."""
        version_for = policy_version if callable(policy_version) else (lambda _agent, v=policy_version: v)
        filters = [_endpoint_filter(self._db.sql, ask.endpoint, ask.exclude) for ask in asks]
        now = time.time()
        out: list[list[Job]] = [[] for _ in asks]
        async with self._db.write() as db:
            for which, together in itertools.groupby(range(len(asks)), key=filters.__getitem__):  # runs of one filter
                run = list(together)
                shared = await _lease_together(db, [asks[i] for i in run], which, now, lease_s, version_for) \
                    if len(run) > 1 else None
                for k, i in enumerate(run):
                    out[i] = shared[k] if shared is not None else \
                        await _lease_alone(db, asks[i], which, now, lease_s, version_for)
        return out

    async def extend(self, owner: str, job_ids: list[int], lease_s: float) -> int:
        """Extend ``owner``'s leases (a heartbeat). Returns how many are still its own."""
        if not job_ids:
            return 0
        marks = ",".join("?" * len(job_ids))
        async with self._db.write() as db:
            return await db.execute(
                f"UPDATE jobs SET lease_expires=? WHERE state='leased' AND lease_owner=? AND id IN ({marks})",
                (time.time() + lease_s, owner, *job_ids))

    async def expired_leases(self) -> dict[int, int]:
        """Jobs whose leases have run out, each with the attempts it has had: for the scheduler to
        decide which ``requeue_expired`` fails for good."""
        rows = await self._db.all("SELECT id, attempts FROM jobs WHERE state='leased' AND lease_expires < ?",
                                  (time.time(),))
        return {int(job_id): int(attempts) for job_id, attempts in rows}

    async def requeue_expired(self, final: Mapping[int, bool]) -> tuple[int, int]:
        """End the expired leases of the jobs in ``final``: back to the queue, or, where ``final`` says so,
        failed for good. A job leased or heartbeaten since it was found expired is left alone. Returns
        (requeued, failed)."""
        now = time.time()
        async with self._db.write() as db:
            requeued: list[int] = []
            failed = 0
            for job_id, last in final.items():
                rows = await db.execute_fetchall(
                    "SELECT attempts FROM jobs WHERE id=? AND state='leased' AND lease_expires < ?", (job_id, now))
                if not rows:
                    continue
                if last:
                    attempts = int(next(iter(rows))[0])
                    await fail_job(db, job_id, attempts, "its lease expired (the worker died or hung)", now)
                    failed += 1
                else:
                    await db.execute("UPDATE jobs SET state='queued', lease_owner=NULL, lease_expires=NULL, "
                                     "last_error='lease expired', updated_at=? WHERE id=?", (now, job_id))
                    requeued.append(job_id)
            dropped = await drop_cancelled(db, requeued, now)
        return len(requeued) - dropped, failed

    async def expire_leases_of(self, owner_prefix: str, keep: str) -> int:
        """End every lease held under ``owner_prefix`` except ``keep``'s at once: a node that restarts
        knows its earlier incarnation's rollouts died with it, so they need not wait out their lease."""
        async with self._db.write() as db:
            return await db.execute(
                "UPDATE jobs SET lease_expires=0 WHERE state='leased' AND substr(lease_owner, 1, ?)=? "
                "AND lease_owner != ?", (len(owner_prefix), owner_prefix, keep))

    async def extend_all_leases(self, until: float) -> int:
        """Every lease runs at least until ``until``: a coordinator that was down cannot have heard its
        nodes' heartbeats, and their results, buffered meanwhile, must still find their leases held."""
        async with self._db.write() as db:
            return await db.execute("UPDATE jobs SET lease_expires=? WHERE state='leased' AND lease_expires < ?",
                                    (until, until))

    async def requeue_owner(self, owner: str) -> int:
        """Give back every lease of ``owner`` (a worker shutting down); the attempt is not counted."""
        now = time.time()
        async with self._db.write() as db:
            rows = await db.execute_fetchall(
                f"UPDATE jobs SET {GIVE_BACK}, updated_at=? WHERE state='leased' AND lease_owner=? RETURNING id",
                (now, owner))
            ids = [int(r[0]) for r in rows]
            return len(ids) - await drop_cancelled(db, ids, now)

    async def requeue_unheld(self, owner: str, held: Collection[int]) -> int:
        """Give back every lease of ``owner`` but ``held``'s (a node joining again says what it holds; the rest were
        granted in replies it never received); the attempt is not counted. Returns how many went back."""
        now = time.time()
        async with self._db.write() as db:
            leased = await db.execute_fetchall("SELECT id FROM jobs WHERE state='leased' AND lease_owner=?", (owner,))
            lost = [int(r[0]) for r in leased if int(r[0]) not in held]
            ids: list[int] = []
            for start in range(0, len(lost), MAX_VARS):
                chunk = lost[start:start + MAX_VARS]
                rows = await db.execute_fetchall(
                    f"UPDATE jobs SET {GIVE_BACK}, updated_at=? "
                    f"WHERE state='leased' AND lease_owner=? AND id IN ({','.join('?' * len(chunk))}) RETURNING id",
                    (now, owner, *chunk))
                ids.extend(int(r[0]) for r in rows)
            return len(ids) - await drop_cancelled(db, ids, now)

    async def complete(self, items: list[tuple[str, Trajectory]]) -> list[int]:
        """``complete_leases`` for a worker of the farm's own: the ids stored now (a canary's included)."""
        done = await self.complete_leases(items)
        return done.reported

    async def complete_leases(self, items: list[tuple[str, Trajectory]], *, refuse_mismatch: bool = False,
                              checked: bool = False) -> Completion:
        """Store trajectories of jobs leased by their owners, and mark the jobs done; one transaction.

        A job whose lease its owner no longer holds (it expired and went elsewhere) or that is already done is
        skipped. What is stored is the job's own identity (group, run, environment, seed, level, agent, policy
        version), never what the record says: a record that says otherwise is stored as its lease's, or with
        ``refuse_mismatch`` (a joined node's) refused, its job back in the queue (the attempt not counted: the
        job did nothing wrong). A canary's result marks its job done and is not stored: the caller checks it.
        Every record is checked against its domain (``farmd.domain``) unless ``checked``: farmd's own rollouts
        checked them as they made them (``run_rollout``), and a check is a tenth of what storing one costs.
        A batch costs a handful of statements, not a few per trajectory: each is a round trip to the
        connection's thread.
        """
        if not items:
            return Completion()
        latest = {traj.id: (owner, traj) for owner, traj in items}  # one job reported twice: once
        bodies, out_of_domain = await asyncio.to_thread(
            functools.partial(checked_bodies, {tid: t for tid, (_, t) in latest.items()}, checked=checked))
        for tid, found in out_of_domain.items():
            # Every entry checks its records first (a node's, a model's, an Atropos push); one that got here
            # anyway is not stored, so no reader meets it: its job stays leased until the lease runs out.
            log.error("trajectory %d is out of its domain and was not stored: %s", tid, "; ".join(found[:3])[:1000],
                      extra={"event": "refused_trajectory", "trajectory": tid})
            del latest[tid]
        now = time.time()
        ids = sorted(latest)
        refused: dict[int, str] = {}
        bound: dict[int, Trajectory] = {}
        canaries: dict[int, Trajectory] = {}
        async with self._db.write() as db:
            # Every owner's at once (a batch holds many nodes' reports): a row counts only for the owner holding it.
            for start in range(0, len(ids), MAX_VARS):
                chunk = ids[start:start + MAX_VARS]
                marks = ",".join("?" * len(chunk))
                jobs = await db.execute_fetchall(
                    f"SELECT j.id, j.group_id, g.run_id, j.env, j.seed, j.difficulty, j.agent, j.policy_version, "
                    f"j.for_node, j.lease_owner, (SELECT COALESCE(MAX(version), 0) FROM policies) "
                    f"FROM jobs j JOIN groups g ON g.id = j.group_id WHERE j.state='leased' AND j.id IN ({marks})", chunk)
                for job in jobs:
                    tid = int(job[0])
                    if job[9] != latest[tid][0]:
                        continue
                    traj, why = lease_identity(latest[tid][1], job, int(job[10]))
                    if why and refuse_mismatch:
                        refused[tid] = why
                        continue
                    if why:  # the farm's own worker: a bug, not a lie; its lease decides
                        log.error("job %d's record disagrees with its lease (%s): stored as its lease's", tid, why,
                                  extra={"event": "record_mismatch", "job": tid})
                    (canaries if job[8] is not None else bound)[tid] = traj
            done = sorted({*bound, *canaries})
            for start in range(0, len(done), MAX_VARS):  # rides with the next statement: no hop of its own
                chunk = done[start:start + MAX_VARS]
                await db.executemany(f"UPDATE jobs SET state='done', lease_expires=NULL, updated_at=? "
                                     f"WHERE id IN ({','.join('?' * len(chunk))})", [(now, *chunk)])
            if refused:
                back = sorted(refused)
                await db.execute(
                    f"UPDATE jobs SET {GIVE_BACK}, last_error='its result was refused', updated_at=? "
                    f"WHERE id IN ({','.join('?' * len(back))})",
                    (now, *back))
                await drop_cancelled(db, back, now)
            keep = [bound[tid] for tid in sorted(bound)]
            rows: list[tuple[Any, ...]] = []
            if keep:
                await db.executemany_numbered(LAST_SEQ, functools.partial(_stored_statements, keep, bodies, now, rows))
                late = [t.id for t in keep if t.env.startswith(CONTRIBUTED_ENV_PREFIX)]
                if late:  # running when its environment was quarantined: withdrawn as it is stored
                    await withdraw(db, f"t.id IN ({','.join('?' * len(late))})", late, now)
            await finish_groups(db, sorted({t.group_id for t in keep}))
        if keep:  # committed (their places in the stream, and ``rows``, made with the commit): what streams read next
            self._recent.remember(rows, keep)
        return Completion(stored=[t.id for t in keep], refused=refused, canaries=canaries)

    async def leased_attempts(self, owner: str, job_id: int) -> int | None:
        """The attempts a job ``owner`` holds the lease of has had; None: ``owner`` does not hold it."""
        row = await self._db.one("SELECT attempts FROM jobs WHERE id=? AND state='leased' AND lease_owner=?",
                                 (job_id, owner))
        return None if row is None else int(row[0])

    async def fail(self, owner: str, job_id: int, error: str, *, final: bool, not_before: float = 0.0
                   ) -> JobState | None:
        """An infrastructure failure of a leased job, recorded apart from every score: failed for good
        when ``final``, else back in the queue, leased again no earlier than ``not_before`` (a time).
        The scheduler decides which. None: ``owner`` does not hold the lease."""
        now = time.time()
        async with self._db.write() as db:
            row = await db.fetchone("SELECT attempts FROM jobs WHERE id=? AND state='leased' AND lease_owner=?",
                                    (job_id, owner))
            if row is None:
                return None
            attempts = int(row[0])
            await db.execute("INSERT INTO failures(job_id, attempt, error, final, at) VALUES (?,?,?,?,?)",
                             (job_id, attempts, error[:2000], int(final), now))
            if final:
                await fail_job(db, job_id, attempts, error, now, logged=True)
                return JobState.FAILED
            await db.execute("UPDATE jobs SET state='queued', lease_owner=NULL, lease_expires=NULL, last_error=?, "
                             "not_before=?, updated_at=? WHERE id=?", (error[:2000], not_before, now, job_id))
            if await drop_cancelled(db, [job_id], now):
                return JobState.CANCELLED
            return JobState.QUEUED

    async def job_counts(self) -> dict[str, int]:
        """Jobs in every state: counts every job ever queued (for status, not for loops); a node's canaries are
        not the farm's work (each node's row counts its own)."""
        # A job leaves queued and leased for done, failed or cancelled and never comes back, and ids only grow (one
        # writer at a time, each new job above the largest): every job below the oldest one still open is settled
        # for good. Those are counted once and kept; each read counts the jobs above the last mark alone, and moves
        # the mark up to below the oldest open job. Reading every job each time cost 5-7 ms a status read at 87,000
        # jobs (three minutes of the learning loop), growing with the farm's age; now 0.2-0.4 ms, after a first read
        # that reads every row once (62 ms there). One statement, so one snapshot.
        async with self._counting:
            rows = await self._db.all(
                "SELECT state, id <= mark.upto, COUNT(*), mark.upto FROM jobs, (SELECT COALESCE("
                "(SELECT MIN(id) FROM jobs WHERE state IN ('queued', 'leased')) - 1, (SELECT MAX(id) FROM jobs), 0) "
                "AS upto) AS mark WHERE id > ? AND for_node IS NULL GROUP BY state, id <= mark.upto, mark.upto",
                (self._settled_upto,))
            counts = dict(self._settled)
            for state, settled, n, upto in rows:
                counts[state] = counts.get(state, 0) + int(n)
                if settled:
                    self._settled[state] = self._settled.get(state, 0) + int(n)
                self._settled_upto = max(self._settled_upto, int(upto))
        return {state: n for state, n in counts.items() if n}

    async def open_job_counts(self) -> dict[str, int]:
        """Queued and leased jobs only (canaries not: no trainer's demand waits on one): an index range as long
        as the queue, cheap every second."""
        rows = await self._db.all("SELECT state, COUNT(*) FROM jobs WHERE state IN ('queued', 'leased') "
                                  "AND for_node IS NULL GROUP BY state")
        return {state: n for state, n in rows}

    async def group_progress(self, group_ids: list[int]) -> tuple[int, int, int, int]:
        """(jobs, done, failed, passed) over the given groups."""
        totals = [0, 0, 0, 0]
        for start in range(0, len(group_ids), MAX_VARS):  # SQLite binds at most 32766 values per statement
            chunk = group_ids[start:start + MAX_VARS]
            marks = ",".join("?" * len(chunk))
            row = await self._db.one(
                f"SELECT COUNT(*), SUM(state='done'), SUM(state='failed') FROM jobs WHERE group_id IN ({marks})", chunk)
            passed = await self._db.one(
                f"SELECT COUNT(*) FROM trajectories WHERE group_id IN ({marks}) AND status='ok' AND passed=1", chunk)
            for i, value in enumerate((*row, passed[0])):
                totals[i] += int(value or 0)
        return totals[0], totals[1], totals[2], totals[3]

    async def failures(self, limit: int = 20) -> list[JobFailure]:
        """The newest ``limit`` job failures, newest first, each with its job's run (0: none)."""
        rows = await self._db.all("SELECT f.job_id, f.attempt, f.error, f.final, f.at, COALESCE(g.run_id, 0) FROM "
                                  "(SELECT * FROM failures ORDER BY id DESC LIMIT ?) f LEFT JOIN jobs j ON j.id = "
                                  "f.job_id LEFT JOIN groups g ON g.id = j.group_id ORDER BY f.id DESC", (limit,))
        return [JobFailure(int(j), int(r), int(a), bool(f), str(e), float(t)) for j, a, e, f, t, r in rows]
