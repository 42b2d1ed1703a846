"""Which environments exist, by name. Built-ins are imported lazily: reasoning-gym is slow to load."""

from __future__ import annotations

import functools
import importlib

from farmd.envs.base import Environment
from farmd.errors import TaskError

_BUILTIN = {
    "py-func": "farmd.envs.pyfunc:PyFunc",
    "shell": "farmd.envs.shell:Shell",
    "kernel": "farmd.envs.kernel:Kernel",
    "arith": "farmd.envs.arith:Arith",
    "arith:heldout": "farmd.envs.arith:Arith",
}
_ARGS: dict[str, tuple[str, ...]] = {"arith": ("train",), "arith:heldout": ("heldout",)}
"""Constructor arguments of the built-ins that take some: one class, two environments."""
_RG_PREFIX = "rg:"


def names() -> list[str]:
    from farmd.envs.rg import DATASETS

    return sorted(_BUILTIN) + [f"{_RG_PREFIX}{d}" for d in sorted(DATASETS)]


@functools.cache
def get(name: str) -> Environment:
    """The environment called ``name``; TaskError (listing the known ones) if there is none."""
    if name.startswith(_RG_PREFIX):
        from farmd.envs.rg import ReasoningGym

        return ReasoningGym(name[len(_RG_PREFIX):])
    target = _BUILTIN.get(name)
    if target is None:
        raise TaskError(f"no environment {name!r}; known: {', '.join(names())}")
    module, cls = target.split(":")
    env: Environment = getattr(importlib.import_module(module), cls)(*_ARGS.get(name, ()))
    return env
