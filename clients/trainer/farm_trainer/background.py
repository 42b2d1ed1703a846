"""Work that waits on the farm, done in a thread of its own so that the trainer's loop never waits with it.

In lockstep the farm samples nothing while the trainer is between a batch and its publish: whatever the trainer's
loop waits on there (polling an evaluation's runs, reading its results back, asking the farm's status) is time the
whole farm stands still. ``Background(fn)`` runs ``fn(stop)`` in a daemon thread; the loop asks ``ready()`` (an
event's flag, never a call to the farm) and takes ``result()`` when it is. ``cancel()`` sets ``stop``, which a
``fn`` that waits watches, and lets the thread go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Background"]

T = TypeVar("T")


class Background(Generic[T]):
    def __init__(self, fn: Callable[[threading.Event], T], *, name: str) -> None:
        self._fn = fn
        self._stop = threading.Event()
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn(self._stop)
        except BaseException as exc:  # handed to whoever takes the result, in its own thread
            self._error = exc
        finally:
            self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def result(self) -> T:
        """What ``fn`` returned, or its exception raised here; only once ``ready()``."""
        if not self._done.is_set():
            raise RuntimeError("the background work has not finished")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def cancel(self, join_s: float = 1.0) -> None:
        """Ask ``fn`` to stop (through its event) and give it ``join_s`` to; a daemon thread never holds up an exit."""
        self._stop.set()
        self._thread.join(join_s)
