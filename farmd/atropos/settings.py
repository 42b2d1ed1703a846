"""``[atropos]`` in farm.toml: which of farm's own rollouts Atropos trainers are served."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AtroposConfig:
    envs: tuple[str, ...] = ()
    """Farm environments whose finished groups join the Atropos queue (empty: none; the queue then holds only
    what Atropos environments push)."""
    agent: str = ""
    """Whose groups: the agent spec exactly as queued (``torch:tiny``, ``openai:MODEL@NAME``). Their records must
    carry token ids and sampling logprobs (a group without them is passed over and logged)."""
    consumer: str = "atropos"
    """The farm consumer that takes them (its cursor survives restarts, as any trainer's). Name it in
    ``[scheduler] demand_consumers`` for its pace to drive production."""
    ahead_groups: int = 64
    """Farm groups waiting in the Atropos queue at most: past this, taking more waits for a trainer's batches."""

    def __post_init__(self) -> None:
        if self.envs and not self.agent:
            raise ValueError("envs need an agent: whose rollouts on them go to Atropos trainers")
        if self.ahead_groups < 1:
            raise ValueError(f"ahead_groups must be at least 1, not {self.ahead_groups}")
