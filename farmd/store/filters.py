"""What an operator narrows a list of trajectories to (``farmctl``, the console): each field, when set,
keeps only the trajectories that match it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrajectoryFilter:
    policy_version: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    flag: str | None = None
    """Carried by the first verdict or by any later score (a quarantine's ``withdrawn`` is a later score's)."""
    node: str | None = None
    agent: str | None = None

    def sql(self) -> tuple[str, list[object]]:
        """SQL (each part starting with AND) and its parameters."""
        parts: list[str] = []
        args: list[object] = []
        for column, op, value in (("policy_version", "=", self.policy_version), ("reward", ">=", self.min_reward),
                                  ("reward", "<=", self.max_reward), ("node", "=", self.node),
                                  ("agent", "=", self.agent)):
            if value is not None:
                parts.append(f" AND {column} {op} ?")
                args.append(value)
        if self.flag is not None:
            parts.append(" AND (EXISTS (SELECT 1 FROM json_each(trajectories.flags) WHERE value = ?) OR EXISTS "
                         "(SELECT 1 FROM scores s, json_each(s.flags) WHERE s.trajectory_id = trajectories.id "
                         "AND value = ?))")
            args += [self.flag, self.flag]
        return "".join(parts), args
