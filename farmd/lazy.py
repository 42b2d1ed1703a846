"""A module imported the first time one of its attributes is read, not where it is named.

farmd starts once per node and once per test of a suite (about 150 times in ``make test``); a module that only
some of its work uses (httpx: model endpoints) cost every start its import.

Not ``importlib.util.LazyLoader``: on Python 3.11 it marks the module loaded before running it, so a second thread
reading an attribute meanwhile finds it half made (AttributeError). Here every read goes to the module as
``import`` gives it, and ``import`` makes a thread wait for another's import of the same module to finish.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any


class _Deferred(ModuleType):
    """Stands for a module not imported yet; never in ``sys.modules`` (``import`` gives the real one)."""

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attribute)


def module(name: str) -> ModuleType:
    """``name``, imported at the first read of one of its attributes; the module itself if it is imported
    already. A name that no module has is refused here, not at that read."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    return _Deferred(name)
