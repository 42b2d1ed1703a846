"""A joined node's verdicts are checked, not believed: the coordinator's checks of what nodes report.

Volunteer-computing and decentralised-inference systems do not trust a worker's result because the worker
says so. BOINC validates results against a second, independent run, adaptively: a new host is checked on every
result until it has a record, an established one on a random share; known-answer spot checks (``canaries``) catch
a host that only behaves when it can tell it is being watched; and a host caught once loses its credit and its
standing. farm does the same with one difference: the coordinator itself is the second opinion, on its own boxes
(``farmd.rollout.reverify``), since a verdict is cheap to compute again where a rollout (a model's sampling) is not.

- **Re-verification.** A share of every node's results (``reverify_share``, never below a floor), and each of
  its first ``reverify_first`` after it joins, are picked after they arrive (the node cannot know which) and
  judged again from the stored attempt by the same path ``farmctl rescore`` takes, never reading the node's
  verdict. A verdict that is not the coordinator's (a fail reported as a pass, a reward off by more than
  ``reverify_tolerance``) disagrees.
- **Canaries.** Jobs whose agent answers as a function of the task alone, sent unannounced to one node; the
  coordinator runs the same job and knows the exact answer and verdict the node must report.

This module runs the checks, off the event loop's critical path: a bounded queue served by a few tasks, so results
are stored and answered before any check of them runs. What a disagreement does to the node (quarantine) is
``Nodes``'; every check is recorded (``store.nodes``), and an agreeing re-verification says so on the trajectory
(``verified_by`` coordinator) and adds the coordinator's score row; a disagreeing one adds its score row and
overwrites nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from farmd.metrics import Metrics
from farmd.records import MAX_REASONS, Job, JobState, Score, Trajectory, verified_by_node
from farmd.store import Store
from farmd.tasks import cancel_and_wait
from farmd.text import bounded

log = logging.getLogger("farmd.nodes.checks")

REVERIFY, CANARY = "reverify", "canary"
AGREED, DISAGREED, INCONCLUSIVE = "agreed", "disagreed", "inconclusive"
MAX_WAITING = 10_000
"""Sampled checks waiting at once; past it a sampled pick is dropped (counted). A canary's and a node's first
results are never dropped: they are bounded by what was leased."""
_EXPECTED_KEPT = 256
"""Canary answers kept: every member of a canary group (and any canary at the same task) shares one run."""
_SHOWN = 120


class Checker(Protocol):
    """The coordinator's own judgement (``farmd.rollout.reverify.Rechecker``)."""

    async def verify(self, trajectory: Trajectory) -> tuple[Score, dict[str, Any]]: ...
    """The coordinator's score of ``trajectory``'s attempt, and its verdict's details."""

    async def replicate(self, job: Job) -> Trajectory: ...


Outcome = Callable[[str, str, int, str, str], Awaitable[None]]
"""(node, kind, job id, outcome, detail): what a check found, for ``Nodes`` to act on."""


@dataclass(frozen=True, slots=True)
class Check:
    kind: str
    node: str
    job_id: int
    record: Trajectory | None = None
    """A canary's record (canaries are not stored); None: the stored trajectory is checked."""


def _verdict(passed: bool, reward: float) -> str:
    return f"{'a pass' if passed else 'a fail'} with reward {reward:g}"


REWARD_INTERVAL = "reward_interval"
"""A verdict's detail: ``[low, high]``, the rewards its own measurement cannot tell apart (a kernel's speed reward,
from its speedup's confidence interval: a node's box and the coordinator's time the same kernel differently, more
so on a loaded machine). A node's reward in it agrees; one outside it, by more than the tolerance, does not."""


def reward_interval(details: Mapping[str, Any]) -> tuple[float, float] | None:
    """``details``' reward interval, when it holds a well-formed one."""
    value = details.get(REWARD_INTERVAL)
    if isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value) \
            and value[0] <= value[1]:
        return float(value[0]), float(value[1])
    return None


def verdict_disagreement(record: Trajectory, passed: bool, reward: float, tolerance: float,
                         interval: tuple[float, float] | None = None) -> str:
    """How a node's verdict on an attempt differs from the coordinator's (``passed``, ``reward``, and the rewards
    its measurement cannot tell from it, ``interval``); "" if it does not. A reward that is not a finite number
    never agrees."""
    if record.status != "ok":
        return f"it reported the verifier could not judge; the coordinator's verdict is {_verdict(passed, reward)}"
    low, high = interval if interval is not None else (reward, reward)
    same = (record.passed == passed and math.isfinite(record.reward)
            and min(low, reward) - tolerance <= record.reward <= max(high, reward) + tolerance)
    if same:
        return ""
    return f"it reported {_verdict(record.passed, record.reward)}; the coordinator's verifier gives {_verdict(passed, reward)}"


def answer_disagreement(record: Trajectory, expected: Trajectory) -> str:
    """How a canary's record differs from what its agent does on its task (the coordinator's own run): its final
    answer, or for an action task the actions it took; "" if it does not."""
    if record.final != expected.final:
        return (f"its final answer {bounded(repr(record.final), _SHOWN)} is not the one {expected.agent} gives on this "
                f"task ({bounded(repr(expected.final), _SHOWN)})")
    actions, wanted = [s.action for s in record.steps], [s.action for s in expected.steps]
    if expected.task.kind == "actions" and actions != wanted:
        return f"it reported {len(actions)} actions that are not the {len(wanted)} {expected.agent} takes on this task"
    return ""


class NodeChecks:
    """``checker`` None: this coordinator runs no boxes, so nothing can be checked (said loudly at start)."""

    def __init__(self, store: Store, checker: Checker | None, *, tolerance: float, concurrency: int,
                 outcome: Outcome, skip: Callable[[str], bool], metrics: Metrics | None = None) -> None:
        self._store = store
        self._checker = checker
        self._tolerance = tolerance
        self._concurrency = concurrency
        self._outcome = outcome
        self._skip = skip
        """Whether a node's checks are moot now (it was quarantined: its unchecked results are withdrawn)."""
        self._metrics = metrics
        self._queue: asyncio.PriorityQueue[tuple[int, int, Check]] = asyncio.PriorityQueue()
        self._order = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._expected: OrderedDict[tuple[str, int, int, str], asyncio.Task[Trajectory]] = OrderedDict()
        self.counters = {"queued": 0, "dropped": 0, AGREED: 0, DISAGREED: 0, INCONCLUSIVE: 0}

    @property
    def enabled(self) -> bool:
        return self._checker is not None

    async def start(self) -> None:
        if self._checker is None:
            log.error("this coordinator runs no boxes, so joined nodes' verdicts cannot be verified again here "
                      "and no canary can be checked: their rewards are stored as the nodes' own word",
                      extra={"event": "node_checks_unavailable"})
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._serve(), name=f"node-checks-{i}") for i in range(self._concurrency)]

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        for expected in self._expected.values():
            await cancel_and_wait(expected)
        self._expected.clear()

    def waiting(self) -> int:
        return self._queue.qsize()

    def add(self, check: Check, *, must: bool) -> bool:
        """Queue ``check``; ``must``: a canary's or a node's first results, never dropped. Returns whether it
        was queued (a sampled one is dropped while ``MAX_WAITING`` wait)."""
        if self._checker is None:
            return False
        if not must and self._queue.qsize() >= MAX_WAITING:
            self.counters["dropped"] += 1
            if self._metrics is not None:
                self._metrics.node_checks.labels(check.kind, "dropped").inc()
            if self.counters["dropped"] % 1000 == 1:
                log.warning("%d checks of nodes' results wait: sampled ones are dropped (%d so far)", MAX_WAITING,
                            self.counters["dropped"], extra={"event": "node_checks_dropped"})
            return False
        # Canaries and first results before sampled ones: they are what a liar is caught by soonest.
        self._queue.put_nowait((0 if must else 1, next(self._order), check))
        self.counters["queued"] += 1
        return True

    async def _serve(self) -> None:
        while True:
            _, _, check = await self._queue.get()
            try:
                if not self._skip(check.node):
                    await self._run(check)
            except asyncio.CancelledError:
                raise
            except Exception:  # a check must never take the checker down; the next one runs
                log.exception("checking node %s's result for job %d failed", check.node, check.job_id)

    async def _run(self, check: Check) -> None:
        if check.kind == CANARY:
            assert check.record is not None
            outcome, detail = await self._canary(check.record)
            await self._store.nodes.record_check(check.job_id, check.node, check.kind, outcome, detail)
        else:
            found = await self._reverify(check)  # recorded with the score it gave
            if found is None:
                return
            outcome, detail = found
        self.counters[outcome] += 1
        if self._metrics is not None:
            self._metrics.node_checks.labels(check.kind, outcome).inc()
        await self._outcome(check.node, check.kind, check.job_id, outcome, detail)

    async def _reverify(self, check: Check) -> tuple[str, str] | None:
        assert self._checker is not None
        stored = await self._store.trajectory(check.job_id)
        if stored is None or stored.verified_by != verified_by_node(check.node):
            return None  # no longer the node's word (withdrawn with it, or never its): nothing to check
        try:
            score, details = await self._checker.verify(stored)
        except Exception as exc:  # the coordinator could not judge: nothing is concluded about the node
            outcome, detail = INCONCLUSIVE, bounded(f"the coordinator could not judge: {exc}", 500)
            await self._store.nodes.record_check(check.job_id, check.node, check.kind, outcome, detail)
            return outcome, detail
        why = await self._disagreement(stored, score.passed, score.reward, reward_interval(details))
        said = f"verified again on the coordinator: node {check.node} reported {_verdict(stored.passed, stored.reward)}"
        reasons = [bounded(said if not why else f"{said}, which the coordinator's verifier does not give", 1000),
                   *score.reasons][:MAX_REASONS]
        outcome, detail = (DISAGREED, why) if why else (AGREED, _verdict(score.passed, score.reward))
        await self._store.nodes.reverified(
            check.node, check.kind, (stored.id, score.verifier_version, score.reward, score.passed, score.status,
                                     reasons, list(score.flags)), outcome, detail, confirm=not why)
        return outcome, detail

    async def _canary(self, record: Trajectory) -> tuple[str, str]:
        try:
            expected = await self._expected_for(record)
        except Exception as exc:
            return INCONCLUSIVE, bounded(f"the coordinator could not run the canary itself: {exc}", 500)
        why = answer_disagreement(record, expected) or await self._disagreement(
            record, expected.passed, expected.reward, reward_interval(expected.verdict_details))
        return (DISAGREED, why) if why else (AGREED, f"{expected.agent}: {_verdict(expected.passed, expected.reward)}")

    async def _disagreement(self, record: Trajectory, passed: bool, reward: float,
                            interval: tuple[float, float] | None) -> str:
        """``verdict_disagreement`` of the node's ``record`` with the coordinator's verdict, except that a measured
        reward (a kernel's speed) the node's lies outside of is measured once more: the coordinator's own timing may
        be what is off (its machine busy for a moment), and a quarantine on that word alone is an honest node lost.
        The node then disagrees only with what neither measurement gives. If the second measurement fails, the
        first one's word stands: an attempt that breaks its verifier now and then is no way out of a disagreement."""
        why = verdict_disagreement(record, passed, reward, self._tolerance, interval)
        if not why or interval is None or record.status != "ok" or record.passed != passed:
            return why
        assert self._checker is not None
        with contextlib.suppress(Exception):
            again, details = await self._checker.verify(record)
            if again.passed == passed and again.status == "ok":
                low, high = reward_interval(details) or (again.reward, again.reward)
                span = (min(interval[0], low, reward, again.reward), max(interval[1], high, reward, again.reward))
                why = verdict_disagreement(record, passed, reward, self._tolerance, span)
        return why

    async def _expected_for(self, record: Trajectory) -> Trajectory:
        """The coordinator's own run of a canary's job (one per task and agent, shared by the group's members)."""
        assert self._checker is not None
        key = (record.env, record.seed, record.difficulty, record.agent)
        task = self._expected.get(key)
        if task is None:
            job = Job(id=record.id, group_id=record.group_id, env=record.env, seed=record.seed,
                      difficulty=record.difficulty, agent=record.agent, state=JobState.LEASED, attempts=1)
            task = self._expected[key] = asyncio.get_running_loop().create_task(self._checker.replicate(job))
            # The oldest finished ones go; one still running never does: others may be waiting on it.
            spare = [k for k, t in self._expected.items() if t.done()][:max(0, len(self._expected) - _EXPECTED_KEPT)]
            for old in spare:
                del self._expected[old]
        self._expected.move_to_end(key)
        try:
            return await asyncio.shield(task)
        except Exception:
            if self._expected.get(key) is task:
                del self._expected[key]  # a failure is never kept: the next member tries again
            raise
