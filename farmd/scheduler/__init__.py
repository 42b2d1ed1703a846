"""Leases, retries, groups, demand: who runs what, and how much. Workers (``farmd.rollout.worker``)
reach it through the ``Leases`` calls, locally or, later, over gRPC."""

from farmd.scheduler.scheduler import Scheduler, SchedulerConfig

__all__ = ["Scheduler", "SchedulerConfig"]
