"""One rollout end to end: the task, the agent's actions in boxes, the verdict, the trajectory."""

from farmd.rollout.runner import InfraFailure, run_rollout

__all__ = ["InfraFailure", "run_rollout"]
