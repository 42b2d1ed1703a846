"""Random draws no participant can predict, read from the kernel's generator a block at a time.

``random.SystemRandom`` reads ``os.urandom`` for every draw: a system call each, and the coordinator draws for
every job it leases (canaries) and every result it stores (re-verification), which made those calls a few percent
of its event loop's time. ``Unpredictable`` draws exactly as it does, from the same source, but takes its bytes
from a block read once per a few hundred draws. The block lives in the process's memory, which no node or client
can read; a forked child starts its own (``os.register_at_fork``), so parent and child never share draws.
"""

from __future__ import annotations

import os
import random
import weakref

_BLOCK = 4096
_RECIP_BPF = 2.0 ** -53  # random's own: a float of 53 random bits
_LIVE: weakref.WeakSet[Unpredictable] = weakref.WeakSet()


class Unpredictable(random.SystemRandom):
    """``random.SystemRandom`` whose bytes come from a block of ``os.urandom``'s, refilled when spent. Every
    method of ``random.Random`` (``randint``, ``choice``, ``shuffle``, ...) draws through ``random`` and
    ``getrandbits``, both taken from the block. Not for threads sharing one instance: the event loop's own."""

    def __init__(self) -> None:
        super().__init__()
        self._block = b""
        self._at = 0
        _LIVE.add(self)

    def _take(self, n: int) -> bytes:
        if self._at + n > len(self._block):
            self._block = os.urandom(max(_BLOCK, n))
            self._at = 0
        out = self._block[self._at:self._at + n]
        self._at += n
        return out

    def _forget(self) -> None:
        self._block = b""
        self._at = 0

    def random(self) -> float:
        return (int.from_bytes(self._take(7)) >> 3) * _RECIP_BPF

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        size = (k + 7) // 8
        return int.from_bytes(self._take(size)) >> (size * 8 - k)

    def randbytes(self, n: int) -> bytes:
        return self._take(n)


def _after_fork() -> None:
    for draws in list(_LIVE):
        draws._forget()


os.register_at_fork(after_in_child=_after_fork)
