"""A module imported the first time one of its attributes is read, not where it is named.

farmd starts once per node and once per test of a suite (about 150 times in ``make test``); a module that only
some of its work uses (httpx: model endpoints) cost every start its import.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def module(name: str) -> ModuleType:
    """``name``, loaded on first use (``importlib.util.LazyLoader``); the module itself if it is loaded already."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    lazy = importlib.util.module_from_spec(spec)
    sys.modules[name] = lazy
    spec.loader.exec_module(lazy)
    return lazy
