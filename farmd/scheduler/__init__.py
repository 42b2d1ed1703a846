"""Leases, retries, groups, demand: who runs what, and how much. Workers reach it through ``Leases``."""

from farmd.scheduler.scheduler import Scheduler, SchedulerConfig
from farmd.scheduler.worker import Leases, Worker

__all__ = ["Leases", "Scheduler", "SchedulerConfig", "Worker"]
