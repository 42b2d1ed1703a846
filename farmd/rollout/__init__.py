"""One rollout end to end (the task, the agent's actions in boxes, the verdict, the trajectory),
and the worker that leases jobs and runs them."""

from farmd.rollout.runner import InfraFailure, run_rollout
from farmd.rollout.worker import Leases, Worker

__all__ = ["InfraFailure", "Leases", "Worker", "run_rollout"]
