"""A verifiers environment driven as a contributed environment, inside a box (never imported by farmd:
``farmd.intake.boxed`` ships its source into each box beside ``env_runner.py``, which loads it for a package
whose manifest says ``form = "verifiers"``).

The package's module defines ``load_environment(**env_args)`` returning a ``verifiers.Environment``; this
adapter gives it the three methods ``env_runner`` calls on any contributed environment:

- ``generate``: row ``seed mod len(dataset)`` of the environment's dataset (built and formatted by verifiers
  itself). The prompt is the row's chat messages as text, ``public`` holds those messages; the row's answer,
  info and other columns are ``hidden``: they never leave the box.
- ``reference``: the row's answer in the parser's format (``XMLParser.format``), or the module's own
  ``farm_reference(row)`` where it defines one.
- ``verify``: the attempt as the assistant's one message, scored by the environment's rubric as verifiers
  scores a rollout (``score_rollout``; ``score_group`` of one for group reward functions). Verifiers turns a
  reward function that raises into a 0; here it is the verifier's failure (raised, so ``env_runner`` reports
  it and farm treats it as any contributed verifier's failure), and so is a reward function whose value is
  not finite or, where it has weight, outside [0, 1]. The weighted sum is clamped to [0, 1]; it passes at the
  environment's own ``pass_threshold``.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import math
import os
import site
import sys
from typing import Any

_MODULE = "farm_verifiers_env"


def prepare(site_dir: str) -> Any:
    """verifiers, imported (its classic API too: the costly part of a box, some seconds of CPU)."""
    # The box's read-only libraries: verifiers and what it needs (``farmd.sandbox.boxsite``).
    libraries = os.path.join(site_dir, "site-packages")
    if libraries not in sys.path:
        site.addsitedir(libraries)
    import verifiers

    _ = verifiers.Environment  # the classic API loads on first touch
    return verifiers


def reseed() -> None:
    """Fresh random state for a call forked from a warmed process, as a fresh box would have."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _message(message: Any) -> dict[str, str]:
    if not isinstance(message, dict):
        message = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    return {"role": str(message.get("role", "user")), "content": _text(message.get("content"))}


class VerifiersEnvironment:
    """``load_environment`` of the package's module, as ``env_runner`` drives a contributed environment."""

    def __init__(self, request: dict[str, Any]) -> None:
        verifiers = prepare(request["site"])
        sys.path.insert(0, os.path.abspath("env"))  # a package's modules import each other
        self._vf = verifiers
        spec = importlib.util.spec_from_file_location(_MODULE, os.path.join("env", request["entry_file"]))
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {request['entry_file']}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE] = module
        spec.loader.exec_module(module)
        self._module = module
        load = getattr(module, request["entry_class"], None)
        if not callable(load):
            raise TypeError(f"{request['entry_file']} has no function {request['entry_class']}")
        env = load(**request.get("env_args", {}))
        if not isinstance(env, verifiers.Environment):
            raise TypeError(f"{request['entry_class']}() returned {type(env).__name__}, not a verifiers Environment")
        self.env = env
        dataset = env.get_dataset() if env.dataset is not None or env.dataset_source is not None \
            else env.get_eval_dataset()
        if dataset is None or len(dataset) == 0:
            raise ValueError("the environment's dataset is empty")
        self.dataset = dataset

    def generate(self, seed: int, difficulty: int, rng: Any, hidden_rng: Any) -> dict[str, Any]:
        index = seed % len(self.dataset)
        row = dict(self.dataset[index])
        raw = row.get("prompt")
        if isinstance(raw, str):
            raw = [{"role": "user", "content": raw}]
        if not isinstance(raw, list) or not raw:
            raise TypeError(f"row {index} has no prompt messages")
        messages = [_message(m) for m in raw]
        prompt = "\n\n".join(m["content"] for m in messages if m["content"])
        hidden = json.loads(json.dumps({k: v for k, v in row.items() if k != "prompt"}, default=str))
        return {"prompt": prompt, "public": {"messages": messages}, "hidden": {"row": hidden, "index": index}}

    def reference(self, task: dict[str, Any]) -> str:
        row = task["hidden"]["row"]
        own = getattr(self._module, "farm_reference", None)
        if callable(own):
            return str(own(row))
        answer = str(row.get("answer", ""))
        parser = self.env.parser
        if callable(getattr(parser, "format", None)) and hasattr(parser, "answer_field"):
            values = {name: "" for name in parser.get_fields()} | {parser.answer_field: answer}
            return str(parser.format(**values))
        return answer

    def verify(self, task: dict[str, Any], final: str) -> dict[str, Any]:
        return asyncio.run(self._score(task, final))

    async def _score(self, task: dict[str, Any], final: str) -> dict[str, Any]:
        vf = self._vf
        row = dict(task["hidden"]["row"])
        messages = task["public"]["messages"]
        rubric = self.env.rubric
        failures: list[str] = []
        for owner in _rubrics(rubric):
            owner.funcs = [_guarded(f, w, failures) for f, w in zip(owner.funcs, owner.weights, strict=False)]
        state = vf.State(input={**row, "prompt": messages})
        state["prompt"] = messages
        state["completion"] = [{"role": "assistant", "content": final}]
        state["trajectory"] = []
        if rubric.has_group_rewards:
            await rubric.score_group([state])
        else:
            await rubric.score_rollout(state)
        if failures:
            raise RuntimeError("; ".join(failures)[:1500])
        total = state.get("reward")
        if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total):
            raise ValueError(f"the rubric's weighted sum is {total!r}, not a finite number")
        reward = min(1.0, max(0.0, float(total)))
        metrics = state.get("metrics") or {}
        threshold = float(getattr(self.env, "pass_threshold", 0.5))
        reasons = [f"{name} = {value:g}" for name, value in sorted(metrics.items())
                   if isinstance(value, int | float)][:15]
        return {"reward": reward, "passed": reward >= threshold,
                "reasons": [f"rubric {float(total):g} (clamped {reward:g}, passes at {threshold:g})", *reasons]}


def _rubrics(rubric: Any) -> list[Any]:
    """``rubric`` and every rubric inside it (a ``RubricGroup`` holds others)."""
    found = [rubric]
    for inner in getattr(rubric, "rubrics", None) or []:
        found += _rubrics(inner)
    return found


def _guarded(func: Any, weight: float, failures: list[str]) -> Any:
    """``func`` as the rubric calls it (the same signature: verifiers passes what it names), with what it
    raises and what it returns out of bounds kept as failures."""
    if getattr(func, "_farm_guarded", False):
        return func
    name = getattr(func, "__name__", repr(func))

    @functools.wraps(func)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            value = func(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except BaseException as exc:
            failures.append(f"reward function {name} raised {type(exc).__name__}: {exc}"[:500])
            raise
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool):  # verifiers takes True and False as 1 and 0
                continue
            if not isinstance(v, int | float):
                failures.append(f"reward function {name} returned {str(v)[:40]!r}, not a number")
            elif not math.isfinite(v):
                failures.append(f"reward function {name} returned {v!r}, not a finite number")
            elif weight != 0 and not 0.0 <= v <= 1.0:
                failures.append(f"reward function {name} returned {v!r}, outside [0, 1]")
        return value

    call._farm_guarded = True  # type: ignore[attr-defined]
    return call
