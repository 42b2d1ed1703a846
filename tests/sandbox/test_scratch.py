"""Scratch copy-in and harvest, without a box: links and special files never followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def _tree(root: Path) -> dict[str, bytes]:
    """A tree that takes a walk holding a descriptor per directory past any small limit: 600 sibling
    directories with a file each, and a 40-deep chain with a side directory at every level (so the walk
    comes back up through levels it has closed), a name that is not UTF-8, and a path past PATH_MAX."""
    files: dict[str, bytes] = {}
    for i in range(600):
        (root / f"w{i}").mkdir(parents=True)
        (root / f"w{i}" / "f").write_bytes(b"%d" % i)
        files[f"w{i}/f"] = b"%d" % i
    level = root
    rel = ""
    for i in range(40):
        level = level / "a"
        rel += "a/"
        (level / "b").mkdir(parents=True)
        (level / "b" / "leaf").write_bytes(b"leaf %d" % i)
        files[f"{rel}b/leaf"] = b"leaf %d" % i
    fd = os.open(root, os.O_RDONLY)
    try:
        os.mkdir(b"caf\xe9", dir_fd=fd)
        with open(os.open(b"caf\xe9/x", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as fh:
            fh.write(b"latin-1")
    finally:
        os.close(fd)
    files["caf\\xe9/x"] = b"latin-1"
    long_rel = ""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(20):  # 20 x 250 characters: past PATH_MAX, reachable only by descriptor
        os.mkdir("n" * 250, dir_fd=fd)
        nfd = os.open("n" * 250, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
        long_rel += "n" * 250 + "/"
    with open(os.open("deep", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as fh:
        fh.write(b"deep")
    os.close(fd)
    files[f"{long_rel}deep"] = b"deep"
    return files


def test_harvest_holds_a_bounded_number_of_descriptors(tmp_path: Path) -> None:
    """The harvest runs in a process allowed 32 descriptors in all: every file of the tree above comes
    out byte-exact and nothing is skipped. One pair of descriptors per directory would need 1,300."""
    src = tmp_path / "s"
    expected = _tree(src)
    code = f"""
import json, os, resource
from pathlib import Path
resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
from farmd.sandbox import scratch
out = scratch.harvest(Path({str(src)!r}), Path({str(tmp_path / "o")!r}), max_bytes=1 << 30)
copied = {{}}
dest = os.open({str(tmp_path / "o")!r}, os.O_RDONLY)
for rel in out.copied:
    parts = os.fsencode(rel.encode().decode("unicode_escape").encode("latin-1")).split(b"/")
    fd = os.dup(dest)
    for part in parts[:-1]:
        nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    with open(os.open(parts[-1], os.O_RDONLY, dir_fd=fd), "rb") as fh:
        copied[rel] = fh.read().decode("latin-1")
    os.close(fd)
print(json.dumps({{"skipped": out.skipped, "copied": copied}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    assert seen["skipped"] == [], seen["skipped"][:5]
    assert seen["copied"] == {rel: content.decode("latin-1") for rel, content in expected.items()}
