"""The verifier's secret: what makes hidden tests unknowable from a task's public data.

Hidden test inputs are drawn from a generator seeded by HMAC(key, env, seed,
difficulty, purpose). An agent that knows the seed, the prompt and farm's source
still cannot precompute them without the key, which lives in the farm's data
directory (mode 0600) and never enters a box.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import secrets
import stat
from pathlib import Path

from farmd.private import FILE_MODE, make_dir

log = logging.getLogger("farmd.verifier")

KEY_FILE = "verifier.key"
_KEY_BYTES = 32


class VerifierKey:
    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a verifier key must be at least 16 bytes")
        self._key = key

    @classmethod
    def load_or_create(cls, data_dir: Path) -> VerifierKey:
        """The key of a farm's data directory, created (0600) on first use."""
        path = data_dir / KEY_FILE
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            pass
        else:
            loose = stat.S_IMODE(os.stat(path).st_mode)
            if loose & ~FILE_MODE:  # a key others could read makes every hidden test public
                os.chmod(path, FILE_MODE)
                log.warning("%s was mode %o: now %o", path, loose, FILE_MODE)
            return cls(key)
        make_dir(data_dir)
        key = secrets.token_bytes(_KEY_BYTES)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, key)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic and never overwrites a key another process made first
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return cls(path.read_bytes())

    def material(self) -> bytes:
        """The key itself, for one purpose: the coordinator hands it to the nodes that join it, over their
        authenticated connection, so a node derives the same hidden inputs. Never logged, never in a box."""
        return self._key

    def seed(self, *parts: object) -> int:
        message = "\x1f".join(str(p) for p in parts).encode()
        return int.from_bytes(hmac.new(self._key, message, hashlib.sha256).digest()[:16], "big")

    def rng(self, *parts: object) -> random.Random:
        """A generator only this key can reproduce, for hidden test data."""
        return random.Random(self.seed(*parts))

    def nonce(self) -> str:
        """A fresh per-run nonce (not derived: never twice the same)."""
        return secrets.token_hex(16)


def public_rng(*parts: object) -> random.Random:
    """A generator anyone can reproduce from a task's public identity (prompt, examples)."""
    message = "\x1f".join(str(p) for p in parts).encode()
    return random.Random(int.from_bytes(hashlib.sha256(message).digest()[:16], "big"))
