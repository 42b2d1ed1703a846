"""One rollout end to end (the task, the agent's actions in boxes, the verdict, the trajectory),
the worker that leases jobs and runs them, and re-scoring stored trajectories with a newer verifier."""

from farmd.rollout.rescore import Rescored, Scores, rescore
from farmd.rollout.runner import InfraFailure, run_rollout
from farmd.rollout.worker import Leases, Worker

__all__ = ["InfraFailure", "Leases", "Rescored", "Scores", "Worker", "rescore", "run_rollout"]
