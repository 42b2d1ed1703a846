"""Tasks drawn from a farm's task bank, and completions judged by the farm (``SampleTasks``, ``Verify``): for a
trainer that samples its own completions (TRL's GRPOTrainer, veRL, its own loop) and asks farm only for tasks and
honest verdicts. ``FarmClient.sample_tasks`` and ``FarmClient.verify`` are the calls; ``farm_client.trl`` builds
TRL's dataset and reward function on them.

A completion is judged as farm judges its own rollouts, and stored as a trajectory of agent ``verify:NAME``.
A reference the farm cannot make is that item's ``error`` (nothing stored for it); a judge that could not judge
fails the call, which is tried again (``retries``) and then raised: never a reward of 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from farm.v1 import farm_pb2, trajectory_pb2

MAX_ITEMS = 256
"""Completions one Verify call carries at most (the farm's bound)."""
MAX_CALL_BYTES = 900 << 10
"""A Verify call's items at most this many bytes: under the farm's bound on the message (1 MiB and a header)."""
MAX_COMPLETION_CHARS = 256 * 1024
"""The farm's bound on one completion."""
MAX_SAMPLED = 1024
"""Tasks one SampleTasks call draws at most (``sample_tasks`` asks as often as it needs)."""
_RETRIED = (grpc.StatusCode.UNAVAILABLE,)


@dataclass(frozen=True)
class SampledTask:
    """A task as farm's chat agents show it to a model (``system``, then ``prompt`` as the user's message), and
    its reference: ``env``, ``seed``, ``difficulty``. Nothing hidden: no tests, no answer."""

    env: str
    seed: int
    difficulty: int
    env_version: str
    system: str
    prompt: str
    entry_point: str = ""
    """Code tasks: the function the completion must define (its last fenced block defining it is judged)."""
    answer_format: str = ""

    def messages(self) -> list[dict[str, str]]:
        """The conversation a chat model is given: the system message, then the task."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class Verdict:
    """One completion's verdict, as its stored trajectory holds it; or, with ``error`` set, why the farm could not
    make its task (``{"code", "message", "reason"}``: nothing was judged or stored, ``reward`` is None)."""

    env: str
    seed: int
    difficulty: int
    reward: float | None
    passed: bool = False
    flags: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    verifier_version: str = ""
    trajectory_id: int = 0
    """``FarmClient.trajectory(id)`` reads the stored record back."""
    group_id: int = 0
    error: dict[str, Any] | None = None


def task_ref(task: Any) -> tuple[str, int, int]:
    """(env, seed, difficulty) of a ``SampledTask``, a mapping with those keys, or such a tuple."""
    if isinstance(task, SampledTask):
        return task.env, task.seed, task.difficulty
    if isinstance(task, Mapping):
        return str(task["env"]), int(task["seed"]), int(task["difficulty"])
    env, seed, difficulty = task
    return str(env), int(seed), int(difficulty)


def sampled(reply: farm_pb2.SampleTasksResponse) -> list[SampledTask]:
    return [SampledTask(env=t.task.env, seed=t.task.seed, difficulty=t.task.difficulty, env_version=t.env_version,
                        system=t.system, prompt=t.prompt, entry_point=t.entry_point, answer_format=t.answer_format)
            for t in reply.tasks]


def calls(refs: Sequence[tuple[str, int, int]], completions: Sequence[str]) -> list[list[int]]:
    """The items' indices split into calls within the farm's bounds, each reference's items kept in one call
    where they fit (the farm stores a call's items of one reference as one group)."""
    by_ref: dict[tuple[str, int, int], list[int]] = {}
    for i, ref in enumerate(refs):
        by_ref.setdefault(ref, []).append(i)
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for members in by_ref.values():
        need = sum(_item_bytes(refs[i], completions[i]) for i in members)
        if current and (len(current) + len(members) > MAX_ITEMS or size + need > MAX_CALL_BYTES):
            out.append(current)
            current, size = [], 0
        for i in members:  # a group larger than a call is split across calls
            one = _item_bytes(refs[i], completions[i])
            if current and (len(current) >= MAX_ITEMS or size + one > MAX_CALL_BYTES):
                out.append(current)
                current, size = [], 0
            current.append(i)
            size += one
    if current:
        out.append(current)
    return out


def _item_bytes(ref: tuple[str, int, int], completion: str) -> int:
    return len(completion.encode("utf-8", "surrogatepass")) + len(ref[0]) + 32


def request(agent: str, refs: Sequence[tuple[str, int, int]], completions: Sequence[str],
            indices: Sequence[int]) -> farm_pb2.VerifyRequest:
    return farm_pb2.VerifyRequest(agent=agent, items=[farm_pb2.VerifyItem(
        task=farm_pb2.TaskRef(env=refs[i][0], seed=refs[i][1], difficulty=refs[i][2]), completion=completions[i])
        for i in indices])


def verdicts(reply: farm_pb2.VerifyResponse, error_dict: Callable[[Any], dict[str, Any]]) -> list[Verdict]:
    out = []
    for r in reply.results:
        ref = (r.task.env, r.task.seed, r.task.difficulty)
        if r.HasField("error"):
            out.append(Verdict(*ref, reward=None, error=error_dict(r.error)))
            continue
        v = r.verdict
        out.append(Verdict(*ref, reward=v.reward, passed=v.passed,
                           flags=[trajectory_pb2.Flag.Name(f).removeprefix("FLAG_").lower() for f in v.flags],
                           reasons=list(v.reasons), verifier_version=v.verifier_version,
                           trajectory_id=v.trajectory_id, group_id=v.group_id))
    return out


def retrying(call: Callable[[], Any], retries: int, backoff_s: float) -> Any:
    """``call()``, tried again after a backoff while the farm says it could not judge now, or cannot be reached
    (UNAVAILABLE), ``retries`` times; then its error is raised. Anything else is raised at once: a request the farm
    refused is refused again."""
    for attempt in range(retries + 1):
        try:
            return call()
        except grpc.RpcError as exc:
            if attempt >= retries or exc.code() not in _RETRIED:
                raise
            time.sleep(backoff_s * 2 ** attempt)
    raise AssertionError("unreachable")
