"""The verifier key's directory is private when the key makes it, and a key left readable is made private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from farmd.verifier.secret import KEY_FILE, VerifierKey


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_key_and_its_directory_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        first = VerifierKey.load_or_create(tmp_path / "data")
    finally:
        os.umask(old)
    assert mode(tmp_path / "data") == 0o700 and mode(tmp_path / "data" / KEY_FILE) == 0o600

    (tmp_path / "data" / KEY_FILE).chmod(0o644)  # loosened by hand, or by a copy
    again = VerifierKey.load_or_create(tmp_path / "data")
    assert mode(tmp_path / "data" / KEY_FILE) == 0o600 and again.seed("x") == first.seed("x")
