"""Leases, retries, groups, demand: who runs what, and how much. Workers (``farmd.rollout.worker``)
reach it through the ``Leases`` calls: locally, or from joined nodes over gRPC through the fleet's registry
(``farmd.scheduler.nodes``). Beside it: delivery to trainers (``Scheduler.delivery``) and published
policies (``Scheduler.policies``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from farmd.scheduler.config import SchedulerConfig

if TYPE_CHECKING:
    from farmd.scheduler.policies import Policies, PolicyChunk
    from farmd.scheduler.scheduler import Scheduler

__all__ = ["Policies", "PolicyChunk", "Scheduler", "SchedulerConfig"]

# Loaded when first asked for: ``farmd.config`` reads SchedulerConfig on every start of farmctl,
# which must not load the store and Prometheus along with the scheduler.
_LAZY = {"Policies": "farmd.scheduler.policies", "PolicyChunk": "farmd.scheduler.policies",
         "Scheduler": "farmd.scheduler.scheduler"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
