"""Farm as TRL's task source and reward: a ``datasets.Dataset`` of tasks from the farm's task bank, and a reward
function for ``GRPOTrainer(reward_funcs=[...])`` that has the farm judge each batch (the Verify API).

    from farm_client import FarmClient
    from farm_client.trl import reward_function, task_dataset

    farm = FarmClient("127.0.0.1:7431")
    trainer = GRPOTrainer(model=..., train_dataset=task_dataset(farm, "arith", 512),
                          reward_funcs=[reward_function(farm, agent="my-run")], args=GRPOConfig(...))

``datasets`` and ``trl`` are imported here only (``farm_client`` itself stays light): install them beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from farm_client.client import FarmClient
from farm_client.verify import Verdict

REF_COLUMNS = ("env", "seed", "difficulty")
"""The task reference columns: TRL passes a dataset's columns other than ``prompt`` to reward functions by name."""


def task_dataset(client: FarmClient, env: str, n: int, *, difficulty: int = 0, conversational: bool = True) -> Any:
    """``n`` tasks of ``env`` drawn from the farm's task bank (``FarmClient.sample_tasks``) as a ``datasets.Dataset``:
    a ``prompt`` column, in TRL's conversational form (a list of ``{"role", "content"}`` messages: farm's system
    message, then the task) or, with ``conversational=False``, its plain form (the task's text alone); and the task
    reference columns ``env``, ``seed``, ``difficulty``, which the reward function reads back."""
    from datasets import Dataset  # type: ignore[import-untyped]

    tasks = client.sample_tasks(env, n, difficulty=difficulty)
    return Dataset.from_dict({
        "prompt": [t.messages() if conversational else t.prompt for t in tasks],
        "env": [t.env for t in tasks],
        "seed": [t.seed for t in tasks],
        "difficulty": [t.difficulty for t in tasks],
    })


class FarmReward:
    """A TRL reward function (``prompts, completions, **kwargs -> list[float]``) whose rewards are the farm's
    verdicts: each batch's completions, with the task reference columns TRL passes as keyword arguments, are
    judged through ``FarmClient.verify`` and stored under agent ``verify:AGENT``. Raises, never returns 0, when the
    farm could not judge (an infrastructure failure, after the client's retries) or could not make a task (a
    reference column that names no task of the farm). ``verdicts`` keeps every verdict it returned, in order."""

    def __init__(self, client: FarmClient, agent: str, *, retries: int = 3) -> None:
        self.client = client
        self.agent = agent
        self.retries = retries
        self.__name__ = "farm"
        """TRL logs a reward function's rewards by its name (``rewards/farm/mean``)."""
        self.verdicts: list[Verdict] = []
        self._lock = threading.Lock()

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        missing = [c for c in REF_COLUMNS if c not in kwargs]
        if missing:
            raise ValueError(f"farm's reward needs the task reference columns {', '.join(REF_COLUMNS)} (missing: "
                             f"{', '.join(missing)}): train on farm_client.trl.task_dataset, or keep those columns")
        refs = list(zip(*(kwargs[c] for c in REF_COLUMNS), strict=True))
        if len(refs) != len(completions):
            raise ValueError(f"{len(completions)} completions and {len(refs)} task references")
        got = self.client.verify(self.agent, refs, [completion_text(c) for c in completions], retries=self.retries)
        refused = [v for v in got if v.error is not None]
        if refused:
            e = refused[0].error or {}
            raise ValueError(f"the farm could not make {len(refused)} of the tasks (first: {refused[0].env}/"
                             f"{refused[0].seed}@{refused[0].difficulty}: {e.get('reason')}: {e.get('message')})")
        with self._lock:
            self.verdicts += got
        return [float(v.reward) for v in got if v.reward is not None]


def reward_function(client: FarmClient, agent: str, *, retries: int = 3) -> FarmReward:
    """A reward function for ``GRPOTrainer(reward_funcs=[...])`` that verifies each batch through the farm
    (``FarmReward``); its trajectories are stored under agent ``verify:AGENT``."""
    return FarmReward(client, agent, retries=retries)


def completion_text(completion: Any) -> str:
    """A completion as TRL hands it over: the text (plain form), or the messages of a conversational one, whose
    assistant content is the reply."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        parts = [m.get("content", "") for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        texts = [p if isinstance(p, str) else _content_text(p) for p in parts]
        return "".join(texts)
    raise TypeError(f"a completion is a string or a list of messages, not {type(completion).__name__}")


def _content_text(content: Any) -> str:
    """Multi-part content (``[{"type": "text", "text": ...}]``): its text parts."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)
