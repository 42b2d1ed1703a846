"""The environments a farm serves, by name: the built-ins, and those added while it runs.

The built-ins come from the registry and are always there. Others (an approved version of a contributed
environment, named ``contrib:NAME@VERSION``) are added and removed at run time by whoever approves them;
the catalog holds any ``Environment`` and knows nothing of where one came from, so envs never imports
intake. Whoever resolves a job's environment (the worker, the ``reference`` agent, rescoring) takes an
``EnvLookup``; a catalog's ``get`` is one, and so is the registry's.
"""

from __future__ import annotations

from collections.abc import Callable

from farmd.envs import registry
from farmd.envs.base import Environment
from farmd.errors import Conflict, TaskError

CONTRIBUTED_PREFIX = "contrib:"
"""Contributed environments' names: ``contrib:NAME@VERSION`` for an approved version."""
VERIFIERS_PREFIX = "vf:"
"""An operator's own verifiers environments, ``vf:NAME`` (farm.toml's ``[verifiers]``), run in boxes as
contributed ones are."""

EnvLookup = Callable[[str], Environment]
"""The environment called by a name; TaskError if there is none."""


class Catalog:
    """Built-in environments and environments added at run time, by name."""

    def __init__(self) -> None:
        self._added: dict[str, Environment] = {}

    def add(self, env: Environment) -> None:
        """Serve ``env`` under its ``name``. Conflict if the name is taken: a built-in's can never be, and
        an added one is ``remove``d first, so no environment is swapped for another under a name jobs use."""
        if not env.name:
            raise TaskError(f"{type(env).__name__} has no name: an environment is served by its name")
        if env.name in self._added or env.name in registry.names():
            raise Conflict(f"an environment {env.name!r} is served already; remove it first to replace it")
        self._added[env.name] = env

    def remove(self, name: str) -> Environment:
        """Stop serving the added environment ``name`` and return it; TaskError if none was added by that
        name (the built-ins stay)."""
        env = self._added.pop(name, None)
        if env is None:
            known = ", ".join(sorted(self._added)) or "none"
            raise TaskError(f"no added environment {name!r} to remove (built-ins cannot be); added: {known}")
        return env

    def get(self, name: str) -> Environment:
        """The environment called ``name``; TaskError (listing the known ones) if there is none."""
        env = self._added.get(name)
        if env is not None:
            return env
        try:
            return registry.get(name)
        except TaskError:
            raise TaskError(f"no environment {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        """Every name served: the built-ins, then the added ones, each sorted."""
        return registry.names() + sorted(self._added)

    def max_difficulty(self) -> dict[str, int]:
        """Each environment's highest level, by name: what the task bank serves (this makes every built-in)."""
        return {name: self.get(name).max_difficulty for name in self.names()}
