"""The store as the rest of farmd sees it: one object over the database and its record modules.

The SQL lives in the record modules, each given the database (``farmd.store.database``), never this
facade: the job queue, runs and leases (``jobs``), trajectories and their scores (``trajectories``),
consumers' cursors (``consumers``), policies (``policies``), small saved state (``state``), and the
intake funnel, Atropos's queue, names, nodes, verdicts and activity, each reached as an attribute. The
facade's own methods are its record modules' methods, bound here under the names farmd has always
called, so a signature and its docstring are written once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from farmd.store.activity import ActivityRecords
from farmd.store.atropos import AtroposRecords
from farmd.store.codec import Recent
from farmd.store.consumers import ConsumerRecords
from farmd.store.database import Database, SqliteDatabase
from farmd.store.intake import IntakeRecords
from farmd.store.jobs import JobRecords
from farmd.store.names import NameRecords
from farmd.store.nodes import NodeRecords
from farmd.store.policies import PolicyRecords
from farmd.store.policy_chunks import PolicyChunks
from farmd.store.policy_files import PolicyFiles
from farmd.store.retention import RetentionRecords
from farmd.store.state import StateRecords
from farmd.store.trajectories import TrajectoryRecords
from farmd.store.verdicts import VerdictRecords


class Store:
    """Open with ``await Store.open(path)``; close with ``await store.close()``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        """The database every record module shares: its connections, migrations and one writer at a time."""
        self.path = db.path
        self.intake = IntakeRecords(db)
        """The intake funnel's rows (submissions, reputation, bounties, quarantines)."""
        self.activity = ActivityRecords(db)
        self.atropos = AtroposRecords(db)
        self.names = NameRecords(db)
        """Which credential each name (a node's, a consumer's, an Atropos id) belongs to."""
        self.nodes = NodeRecords(db)
        """Quarantined nodes, canary groups, and the checks of nodes' results."""
        self.verdicts = VerdictRecords(db)
        """Which verdicts changed since a mark, and what a trajectory's was at one."""

        recent = Recent()  # what this process just stored, which the streams read back next
        jobs = JobRecords(db, recent)
        self.enqueue = jobs.enqueue
        self.enqueue_run = jobs.enqueue_run
        self.run = jobs.run
        self.runs = jobs.runs
        self.cancel_run = jobs.cancel_run
        self.lease = jobs.lease
        self.lease_many = jobs.lease_many
        self.extend = jobs.extend
        self.expired_leases = jobs.expired_leases
        self.requeue_expired = jobs.requeue_expired
        self.expire_leases_of = jobs.expire_leases_of
        self.extend_all_leases = jobs.extend_all_leases
        self.requeue_owner = jobs.requeue_owner
        self.requeue_unheld = jobs.requeue_unheld
        self.complete = jobs.complete
        self.complete_leases = jobs.complete_leases
        self.leased_attempts = jobs.leased_attempts
        self.fail = jobs.fail
        self.job_counts = jobs.job_counts
        self.open_job_counts = jobs.open_job_counts
        self.group_progress = jobs.group_progress
        self.failures = jobs.failures
        self.store_finished = jobs.store_finished

        trajectories = TrajectoryRecords(db, recent)
        self.finished_groups = trajectories.finished_groups
        self.trajectory = trajectories.trajectory
        self.trajectories = trajectories.trajectories
        self.group_trajectories = trajectories.group_trajectories
        self.withdrawn_count = trajectories.withdrawn_count
        self.last_seq = trajectories.last_seq
        self.pass_rates = trajectories.pass_rates
        self.finished_since = trajectories.finished_since
        self.add_scores = trajectories.add_scores
        self.scores = trajectories.scores
        self.scored_versions = trajectories.scored_versions
        self.score_history = self.verdicts.score_history

        consumers = ConsumerRecords(db)
        self.cursor = consumers.cursor
        self.ack = consumers.ack
        self.consumers = consumers.consumers
        self.consumers_named = consumers.consumers_named
        self.consumed = consumers.consumed
        self.unconsumed = consumers.unconsumed

        # Content in files beside SQLite's; in the database on PostgreSQL, where every coordinator reads it.
        files = PolicyChunks(db, db.path.parent) if db.shared else PolicyFiles(db.path.parent)
        self._policies = PolicyRecords(db, files)
        self.retention = RetentionRecords(db, self._policies.files)
        """Which policy versions still hold content, pins, removal, and the disk the store and policies take."""
        self.policy_upload = self._policies.policy_upload
        self.add_policy = self._policies.add_policy
        self.policy_by_hash = self._policies.policy_by_hash
        self.policy_by_version = self._policies.policy_by_version
        self.publications = self._policies.publications
        self.policy_content = self._policies.policy_content
        self.latest_policy = self._policies.latest_policy

        state = StateRecords(db)
        self.get_state = state.get_state
        self.put_state = state.put_state

    @classmethod
    async def open(cls, path: Path, url: str | None = None) -> Store:
        """The store under the data directory (``path``: its SQLite file), or on the PostgreSQL server ``url``
        (``postgresql://...``), the data directory still holding what is not in the database."""
        if url is not None:
            from farmd.store.postgres import PostgresDatabase  # asyncpg is loaded by the farms that use it

            db: Database = await PostgresDatabase.open(url, path)
        else:
            db = await SqliteDatabase.open(path)
        try:
            store = cls(db)
            await asyncio.to_thread(store._policies.files.sweep)
        except BaseException:
            await db.close()
            raise
        return store

    async def close(self) -> None:
        await self.db.close()
