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
    """Carried by the current verdict (a quarantine's ``withdrawn`` once withdrawn; a rescore's flags once
    rescored): the same one the listing shows."""
    node: str | None = None
    agent: str | None = None

    def sql(self) -> tuple[str, list[object]]:
        """SQL (each part starting with AND) and its parameters; every verdict field is the current verdict's."""
        parts: list[str] = []
        args: list[object] = []
        for column, op, value in (("policy_version", "=", self.policy_version), ("reward", ">=", self.min_reward),
                                  ("reward", "<=", self.max_reward), ("node", "=", self.node),
                                  ("agent", "=", self.agent)):
            if value is not None:
                parts.append(f" AND {column} {op} ?")
                args.append(value)
        if self.flag is not None:
            # A flags column that is not JSON (never written so) would fail the whole query: read as none.
            parts.append(" AND EXISTS (SELECT 1 FROM json_each(CASE WHEN json_valid(trajectories.flags) THEN "
                         "trajectories.flags ELSE '[]' END) WHERE value = ?)")
            args.append(self.flag)
        return "".join(parts), args
