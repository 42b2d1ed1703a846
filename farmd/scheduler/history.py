"""The farm's recent past: its pulse sampled every few seconds and kept in memory.

What a console plots as "over time" that the store does not keep per moment — queue depth, consumer
lag and staleness, the task bank's level and band, nodes up — comes from here. Trajectories over time
come from the store (``Store.activity``), which outlives farmd; these samples start again with it.
A few hours at the default spacing is a few thousand small records: memory farmd can spare.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farmd.scheduler.delivery import ConsumerStatus
from farmd.tasks import cancel_and_wait, every

if TYPE_CHECKING:
    from farmd.scheduler.nodes import Nodes
    from farmd.scheduler.scheduler import QueueCounts, Scheduler

log = logging.getLogger("farmd.scheduler.history")

SAMPLE_EVERY_S = 5.0
KEEP_SAMPLES = 4320
"""Six hours at the default spacing."""
MAX_CONSUMERS_SAMPLED = 32
"""Consumer names come from clients: a sample keeps the ones streaming and the most recent, not all."""


@dataclass(frozen=True, slots=True)
class BankSample:
    """One environment's standing in the task bank at a sample (env "": the totals)."""

    env: str
    level: int
    band_occupancy: float | None
    informative_fraction: float | None
    level_pass_rate: float | None


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    queue: QueueCounts
    throughput_per_s: float
    policy_version: int
    last_seq: int
    streams: int
    nodes: int = 0
    nodes_connected: int = 0
    consumers: tuple[ConsumerStatus, ...] = ()
    bank: tuple[BankSample, ...] = ()
    """Per environment, then the totals (env "")."""


class History:
    def __init__(self, scheduler: Scheduler, nodes: Nodes | None = None, *, every_s: float = SAMPLE_EVERY_S,
                 keep: int = KEEP_SAMPLES) -> None:
        self._scheduler = scheduler
        self._nodes = nodes
        self.every_s = every_s
        self._samples: deque[Sample] = deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="farmd-history")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        # A look at the farm that fails is a gap in a plot, never a stopped daemon.
        await every(lambda: self.every_s, self.sample, log, "sampling the farm's status failed",
                    "history_sample_failed")

    async def sample(self) -> Sample:
        """Take one sample now and keep it."""
        pulse = await self._scheduler.pulse()
        nodes = await self._nodes.status() if self._nodes is not None else []
        bank = pulse.bank
        sample = Sample(
            time=time.time(), queue=pulse.queue, throughput_per_s=pulse.throughput_per_s,
            policy_version=pulse.policy_version, last_seq=pulse.last_seq, streams=pulse.streams,
            nodes=len(nodes), nodes_connected=sum(1 for n in nodes if n.state == "connected"),
            consumers=tuple(_most_relevant(pulse.consumers)),
            bank=tuple(BankSample(env=env, level=entry.level or 0, band_occupancy=entry.band_occupancy,
                                  informative_fraction=entry.informative_fraction,
                                  level_pass_rate=entry.level_pass_rate)
                       for env, entry in [*bank.envs.items(), ("", bank.totals)]))
        self._samples.append(sample)
        return sample

    def since(self, start: float) -> list[Sample]:
        """The samples taken at or after ``start``, oldest first."""
        return [s for s in self._samples if s.time >= start]


def _most_relevant(consumers: Sequence[ConsumerStatus]) -> list[ConsumerStatus]:
    streaming = [c for c in consumers if c.streams > 0]
    rest = sorted((c for c in consumers if c.streams <= 0), key=lambda c: c.acked_at or 0, reverse=True)
    return (streaming + rest)[:MAX_CONSUMERS_SAMPLED]
