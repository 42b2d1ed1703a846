"""Scratch copy-in and harvest, without a box: links and special files never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from farmd.sandbox import scratch


def test_harvest_copies_only_single_link_regular_files(tmp_path: Path) -> None:
    src = tmp_path / "scratch"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("a")
    (src / "sub" / "b.bin").write_bytes(b"\0\1")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (src / "link").symlink_to(secret)
    (src / "dirlink").symlink_to(tmp_path)
    os.link(src / "a.txt", src / "hard")  # a.txt now has two links as well
    os.mkfifo(src / "fifo")
    out = scratch.harvest(src, tmp_path / "out", max_bytes=1 << 20)
    assert out.copied == ["sub/b.bin"]
    reasons = dict(out.skipped)
    assert reasons["link"] == "symbolic link" and reasons["dirlink"] == "symbolic link"
    assert reasons["a.txt"] == "hard link" and reasons["hard"] == "hard link"
    assert reasons["fifo"] == "not a regular file"
    assert (tmp_path / "out" / "sub" / "b.bin").read_bytes() == b"\0\1"
    assert not (tmp_path / "out" / "link").exists()
    for p in (tmp_path / "out").rglob("*"):
        assert "host secret" not in (p.read_text() if p.is_file() else "")


def test_harvest_bound(tmp_path: Path) -> None:
    src = tmp_path / "s"
    src.mkdir()
    (src / "big").write_bytes(b"x" * 1000)
    (src / "small").write_bytes(b"y" * 10)
    out = scratch.harvest(src, tmp_path / "o", max_bytes=100)
    assert out.copied == ["small"] and dict(out.skipped)["big"] == "over the harvest size bound"


def test_copy_in_mapping_refuses_escapes(tmp_path: Path) -> None:
    scratch.copy_in({"d/x.py": b"1"}, tmp_path, os.getuid(), os.getgid())
    assert (tmp_path / "d" / "x.py").read_bytes() == b"1"
    for bad in ("../x", "/etc/x", "a/../../x", ""):
        with pytest.raises(ValueError):
            scratch.copy_in({bad: b""}, tmp_path, os.getuid(), os.getgid())


def test_copy_in_directory_skips_links(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("x = 1")
    (src / "link").symlink_to("/etc/passwd")
    dst = tmp_path / "dst"
    dst.mkdir()
    scratch.copy_in(src, dst, os.getuid(), os.getgid())
    assert (dst / "pkg" / "m.py").read_text() == "x = 1"
    assert not (dst / "link").exists()
