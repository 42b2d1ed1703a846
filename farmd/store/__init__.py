"""The trajectory store and durable job queue: SQLite (WAL) through aiosqlite, or PostgreSQL through asyncpg.
All of farm's SQL is here."""

from farmd.errors import StoreError
from farmd.store.activity import ActivityBucket, CurvePoint
from farmd.store.filters import TrajectoryFilter
from farmd.store.jobs import JobFailure
from farmd.store.store import Store
from farmd.store.trajectories import FinishedGroup, PassRate

__all__ = ["ActivityBucket", "CurvePoint", "FinishedGroup", "JobFailure", "PassRate", "Store", "StoreError",
           "TrajectoryFilter"]
