"""Farm's own rollouts to Atropos trainers: finished groups of ``[atropos] agent`` on ``[atropos] envs``, taken
from farm's delivery like any trainer takes them, joined to the Atropos queue as scored groups.

Each group is built from the trainer-grade record, the way a farm trainer sees it: the record as it goes
over the wire, then ``farm_client.sequences.token_rows``. One sequence per trajectory: ``tokens`` is its
row, ``masks`` its row with -100 where the farm fed tokens in (the prompt, observations) and the token id
where the model produced it, ``inference_logprobs`` the sampling logprob of each model token and 1.0
elsewhere (a logprob is never positive: 1.0 marks a position that was not sampled), ``scores`` its
reward, ``messages`` its conversation. A group whose records lack token ids or logprobs, or whose
trajectories take several rows (turns whose prompts do not extend each other), is passed over and logged.

The queue saves the farm cursor with the groups it adds (one transaction), and the feed acks farm's
delivery after: a restart between the two acks again, never adds twice. It takes no more while
``ahead_groups`` of its groups wait in the queue, so an Atropos trainer's pace is what drives production.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from farm_client.convert import from_message
from farm_client.record import Trajectory as ClientTrajectory
from farm_client.sequences import UntokenizedError, token_rows

from farmd.api.trajectories import trajectory_pb
from farmd.atropos.groups import SCORED_FIELDS, Checked
from farmd.atropos.queue import AtroposQueue
from farmd.atropos.settings import AtroposConfig
from farmd.records import Trajectory
from farmd.scheduler.delivery import Delivery, Subscription
from farmd.store.atropos import pack
from farmd.tasks import cancel_and_wait

log = logging.getLogger("farmd.api.atropos_feed")

_NOT_SAMPLED = 1.0
_IGNORED = -100


class AtroposFeed:
    def __init__(self, delivery: Delivery, queue: AtroposQueue, config: AtroposConfig) -> None:
        self._delivery = delivery
        self._queue = queue
        self._config = config
        self._task: asyncio.Task[None] | None = None
        self.passed_over = 0
        """Groups that could not be given as token sequences."""

    async def start(self) -> None:
        if not self._config.envs:
            return
        kept = self._queue.farm_cursor
        if kept:  # a restart between the queue's save and the ack: the ack is made now
            await self._delivery.ack(self._config.consumer, kept, whole_groups=True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="farmd-atropos-feed")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        subscription = Subscription(agent=self._config.agent, envs=tuple(self._config.envs))
        batches = self._delivery.batches(self._config.consumer, whole_groups=True, batch_size=64, max_staleness=0,
                                         view="full", subscription=subscription)
        try:
            while True:
                await self._queue.until_farm_room(self._config.ahead_groups)
                delivered = await anext(batches)
                made, skipped = await asyncio.to_thread(_atropos_groups, delivered.trajectories)
                if skipped:
                    self.passed_over += skipped
                    log.warning("%d farm groups carry no token ids or logprobs an Atropos trainer could use; "
                                "passed over", skipped, extra={"event": "atropos_feed_skipped", "groups": skipped})
                await self._queue.push(made, farm_cursor=delivered.up_to)
                await self._delivery.ack(self._config.consumer, delivered.up_to, whole_groups=True)
        finally:
            await batches.aclose()  # type: ignore[attr-defined]  # a generator: its stream ends here, not when collected


def _atropos_groups(trajectories: list[Trajectory]) -> tuple[list[Checked], int]:
    """Each whole group of ``trajectories`` as an Atropos scored group (with its stored form); and how many
    groups were passed over."""
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        by_group.setdefault(t.group_id, []).append(t)
    made, skipped = [], 0
    for members in by_group.values():
        group = _group(members)
        if group is None:
            skipped += 1
            continue
        made.append(Checked(group, pack(json.dumps(group, separators=(",", ":")).encode())))
    return made, skipped


def _group(members: list[Trajectory]) -> dict[str, Any] | None:
    tokens, masks, logprobs, scores, messages = [], [], [], [], []
    for t in sorted(members, key=lambda m: m.id):
        record = from_message(trajectory_pb(t), ClientTrajectory)  # a record the wire refuses: a stub, no tokens
        try:
            rows = token_rows(record)
        except UntokenizedError:
            return None
        if len(rows) != 1:
            return None
        (row,) = rows
        tokens.append(row.input_ids)
        masks.append([tok if on else _IGNORED for tok, on in zip(row.input_ids, row.loss_mask, strict=True)])
        logprobs.append([lp if on else _NOT_SAMPLED for lp, on in zip(row.logprobs, row.loss_mask, strict=True)])
        scores.append(float(t.reward))
        messages.append([{"role": m.role, "content": m.content} for m in t.messages])
    group: dict[str, Any] = {name: None for name in SCORED_FIELDS}
    group.update(tokens=tokens, masks=masks, scores=scores, inference_logprobs=logprobs, messages=messages)
    return group
