"""Which seeds the task bank hands out, and intake checks on: the n-th fresh seed of an environment at a
level is a keyed permutation of n over ``[0, SEED_SPACE)``.

A contributed verifier sees the seed of every task it judges. Were production's seeds 0, 1, 2, ... and the
funnel's drawn at random, a verifier could behave on large seeds and pass anything on small ones; were
production's seeds anything a contributor can compute, it could behave on the rest. So both come from one
function, keyed by a secret of the farm: production takes ``nth(env, level, 0)``, ``nth(env, level, 1)``,
...; the funnel takes ``nth(env, level, n)`` for ``n`` drawn from the same first stretch of that sequence.
Without the key, every seed either hands a box is an unpredictable number in ``[0, 2**31)``, and any rule a
verifier applies to its seed holds on checks and on production alike.

It is a permutation (a Feistel network over 32 bits, walked back into 31: ``nth`` never repeats a seed for
one environment and level, and ``index`` inverts it), so "a fresh seed is never handed out twice" still
holds. Round functions are keyed BLAKE2b: without the key the sequence cannot be told from random draws.
Without a key (``SeedSequence(None)``) the n-th seed is ``n``: the bank's own tests, and nothing served.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

SEED_SPACE = 1 << 31
"""Seeds handed to environments: ``[0, 2**31)``, what any environment's ``random.Random(seed)`` takes."""
CHECK_HORIZON = 1 << 20
"""The stretch of the sequence intake's checks draw from: the first million tasks production serves per level."""

_HALF_BITS = 16
_HALF = (1 << _HALF_BITS) - 1
_ROUNDS = 8


@dataclass(frozen=True)
class SeedSequence:
    """Fresh seeds per (environment, level); ``key`` None: the seeds are the counters themselves."""

    key: bytes | None = field(default=None, repr=False)
    _rounds: dict[tuple[str, int], tuple[bytes, ...]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)

    def __post_init__(self) -> None:
        if self.key is not None and len(self.key) < 16:
            raise ValueError("a seed sequence's key is at least 16 bytes")

    @classmethod
    def keyed(cls, derive: Callable[..., int]) -> SeedSequence:
        """The farm's sequence, from its secret (``VerifierKey.seed``): a key of its own, derived, so the
        sequence says nothing of hidden data and the bank never holds the verifier's key."""
        return cls(derive("taskbank", "fresh seeds").to_bytes(16, "big"))

    def nth(self, env: str, level: int, n: int) -> int:
        """The ``n``-th fresh seed of ``env`` at ``level`` (``n`` in ``[0, SEED_SPACE)``)."""
        if not 0 <= n < SEED_SPACE:
            raise ValueError(f"a seed's index is in [0, {SEED_SPACE}), not {n}")
        if self.key is None:
            return n
        keys = self._keys(env, level)
        x = n
        while True:  # cycle-walking: a permutation of 2**32 values, kept to the 2**31 that are seeds
            x = _encrypt(keys, x)
            if x < SEED_SPACE:
                return x

    def index(self, env: str, level: int, seed: int) -> int:
        """Where ``seed`` falls in the sequence of ``env`` at ``level`` (the inverse of ``nth``)."""
        if not 0 <= seed < SEED_SPACE:
            raise ValueError(f"a seed is in [0, {SEED_SPACE}), not {seed}")
        if self.key is None:
            return seed
        keys = self._keys(env, level)
        x = seed
        while True:
            x = _decrypt(keys, x)
            if x < SEED_SPACE:
                return x

    def _keys(self, env: str, level: int) -> tuple[bytes, ...]:
        found = self._rounds.get((env, level))
        if found is None:
            assert self.key is not None
            base = hashlib.blake2b(f"{env}\x1f{level}".encode(), key=self.key, digest_size=32).digest()
            found = tuple(hashlib.blake2b(bytes([r]), key=base, digest_size=32).digest() for r in range(_ROUNDS))
            if len(self._rounds) < 4096:  # one entry per environment and level served: bounded all the same
                self._rounds[(env, level)] = found
        return found


def _round(key: bytes, half: int) -> int:
    return int.from_bytes(hashlib.blake2b(half.to_bytes(2, "big"), key=key, digest_size=2).digest(), "big")


def _encrypt(keys: tuple[bytes, ...], x: int) -> int:
    left, right = x >> _HALF_BITS, x & _HALF
    for key in keys:
        left, right = right, left ^ _round(key, right)
    return (left << _HALF_BITS) | right


def _decrypt(keys: tuple[bytes, ...], x: int) -> int:
    left, right = x >> _HALF_BITS, x & _HALF
    for key in reversed(keys):
        left, right = right ^ _round(key, left), left
    return (left << _HALF_BITS) | right
