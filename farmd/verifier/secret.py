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

from farmd.errors import ConfigError
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
        found = cls._load(data_dir / KEY_FILE)
        return found if found is not None else cls._write(data_dir, secrets.token_bytes(_KEY_BYTES))

    @classmethod
    def adopt(cls, data_dir: Path, key: bytes) -> VerifierKey:
        """The farm's ``key`` (a shared database's), kept in ``data_dir`` too for the tools that read it there. A
        different key already there is refused: hidden inputs derived from it would not be the farm's."""
        found = cls._load(data_dir / KEY_FILE)
        if found is None:
            return cls._write(data_dir, key)
        if not hmac.compare_digest(found._key, key):
            raise ConfigError(f"{data_dir / KEY_FILE} is not this farm's verifier key (its database holds the farm's): "
                              f"move it away and farmd keeps the farm's there")
        return found

    @classmethod
    def _load(cls, path: Path) -> VerifierKey | None:
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            return None
        loose = stat.S_IMODE(os.stat(path).st_mode)
        if loose & ~FILE_MODE:  # a key others could read makes every hidden test public
            os.chmod(path, FILE_MODE)
            log.warning("%s was mode %o: now %o", path, loose, FILE_MODE)
        return cls(key)

    @classmethod
    def _write(cls, data_dir: Path, key: bytes) -> VerifierKey:
        make_dir(data_dir)
        path = data_dir / KEY_FILE
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
