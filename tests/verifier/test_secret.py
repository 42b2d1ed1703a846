"""The verifier key: made once per data directory, private, and the only way to the hidden tests."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from farmd.verifier.secret import KEY_FILE, VerifierKey, public_rng


def test_key_is_created_private_and_reused(tmp_path: Path) -> None:
    a = VerifierKey.load_or_create(tmp_path / "data")
    mode = stat.S_IMODE(os.stat(tmp_path / "data" / KEY_FILE).st_mode)
    assert mode == 0o600
    b = VerifierKey.load_or_create(tmp_path / "data")
    assert a.seed("x", 1) == b.seed("x", 1)
    c = VerifierKey.load_or_create(tmp_path / "other")
    assert a.seed("x", 1) != c.seed("x", 1)


def test_rngs() -> None:
    key = VerifierKey(b"k" * 32)
    assert key.rng("env", 1, 2).random() == key.rng("env", 1, 2).random()
    assert key.rng("env", 1, 2).random() != key.rng("env", 1, 3).random()
    assert key.nonce() != key.nonce()
    assert public_rng("env", 1).random() == public_rng("env", 1).random()
