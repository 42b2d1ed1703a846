"""The hook for local torch policies: the protocol a policy meets, and the agent that drives it.

A policy is anything with ``generate(prompts, max_tokens) -> texts`` (one text per
prompt). ``TorchPolicyAgent`` renders the conversation of ``ChatAgent`` into a
prompt (ChatML by default; pass the model's own template as ``render``) and runs
``generate`` in a worker thread, so that the event loop keeps serving while the
GPU works. Loading weights by path or name (``torch:...`` specs) comes later; this
module imports no torch itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol, runtime_checkable

from farmd.agents.chat import ChatAgent, ChatLimits, Completion, Message
from farmd.errors import EndpointError


@runtime_checkable
class TorchPolicy(Protocol):
    """What farm needs of a local policy."""

    def generate(self, prompts: list[str], max_tokens: int) -> list[str]:
        """One completion per prompt, in order, each at most ``max_tokens`` tokens. Blocking is fine: it is
        called from a worker thread, one call at a time."""
        ...


def chatml(messages: list[Message]) -> str:
    """ChatML, ending with an open assistant turn: the template of many open chat models."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return f"{turns}<|im_start|>assistant\n"


class TorchPolicyAgent(ChatAgent):
    """A ``ChatAgent`` whose model is a ``TorchPolicy`` in this process.

    A failure of ``generate`` (it raised, or returned something other than one text) raises
    ``EndpointError``, like an unreachable endpoint: the model could not answer, which is no score.
    """

    def __init__(self, policy: TorchPolicy, *, name: str = "torch", render: Callable[[list[Message]], str] = chatml,
                 limits: ChatLimits | None = None) -> None:
        super().__init__(limits=limits)
        self.policy = policy
        self.name = name
        self._render = render
        # Held in the worker thread, not the event loop: a cancelled caller leaves its thread running, and the
        # next call must still wait for it rather than enter generate() alongside it.
        self._busy = threading.Lock()

    async def complete(self, messages: list[Message], *, max_tokens: int, policy_version: int, tools: bool = False,
                       group: Hashable | None = None, seed: int | None = None) -> Completion:
        # ``tools`` stays off for this agent (a bare generate has no tool calls); every request is its own,
        # and ``seed`` is not used yet (this hook samples with torch's global generator).
        started = time.monotonic()
        prompt = self._render(messages)
        try:
            texts = await asyncio.to_thread(self._generate, prompt, max_tokens)
        except Exception as exc:
            raise EndpointError(f"policy {self.name}: generate raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(texts, list) or len(texts) != 1 or not isinstance(texts[0], str):
            raise EndpointError(f"policy {self.name}: generate returned {type(texts).__name__} "
                                f"{str(texts)[:100]!r}, not a list of one text", transient=False)
        return Completion(text=texts[0], latency=time.monotonic() - started)

    def _generate(self, prompt: str, max_tokens: int) -> list[str]:
        with self._busy:
            return self.policy.generate([prompt], max_tokens)
