"""What a list of trajectories is narrowed to: an operator's filter (``farmctl``, the console), each field,
when set, keeping only the trajectories that match it; a trainer's subscription; what no stream sends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from farmd.records import CANARY_PREFIX
from farmd.store.database import Dialect

WITHDRAWN_SQL = "EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = trajectories.id)"
"""A trajectory a quarantine took back: its current verdict is the withdrawn one, for good."""


def subscription(agent: str | None, envs: Sequence[str], *, streamed: bool = False, groups: bool = False
               ) -> tuple[str, list[object]]:
    """SQL (starting with AND, or empty) and its parameters keeping only ``agent``'s rows of ``envs``;
    ``streamed``: and none of a quarantined environment, nor one withdrawn alone (its node was quarantined), nor
    for ``groups`` (rows of ``groups``, not ``trajectories``) a group holding one (no trainer stream sends them),
    nor an intake canary's (a known-wrong attempt that checks a contributed verifier, never data)."""
    where, args = "", list[object]()
    if streamed:
        where = " AND env NOT IN (SELECT env FROM quarantined_envs) AND substr(agent, 1, ?) != ?"
        args += [len(CANARY_PREFIX), CANARY_PREFIX]
        where += (" AND withheld = 0" if groups else
                  " AND NOT EXISTS (SELECT 1 FROM withdrawals w WHERE w.trajectory_id = trajectories.id)")
    if agent:
        where += " AND agent = ?"
        args.append(agent)
    if envs:
        where += f" AND env IN ({','.join('?' * len(envs))})"
        args.extend(envs)
    return where, args


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

    def sql(self, dialect: Dialect) -> tuple[str, list[object]]:
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
            parts.append(f" AND EXISTS (SELECT 1 FROM {dialect.json_values('trajectories.flags', 'f')} "
                         "WHERE f.value = ?)")
            args.append(self.flag)
        return "".join(parts), args
