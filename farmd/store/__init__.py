"""The trajectory store and durable job queue: SQLite (WAL) through aiosqlite, or PostgreSQL through asyncpg.
All of farm's SQL is here."""

from farmd.errors import StoreError
from farmd.store.activity import ActivityBucket, CurvePoint
from farmd.store.consumers import Cursor
from farmd.store.database import Standby
from farmd.store.filters import TrajectoryFilter
from farmd.store.jobs import JobFailure, RunSummary
from farmd.store.store import Store
from farmd.store.trajectories import FinishedGroup, PassRate

__all__ = [
           "ActivityBucket",
           "Cursor",
           "CurvePoint",
           "FinishedGroup",
           "JobFailure",
           "PassRate",
           "RunSummary",
           "Standby",
           "Store",
           "StoreError",
           "TrajectoryFilter",
]
