"""The data directory is farmd's alone: the directory 0700, everything in it 0600.

It holds the verifier's key, every trajectory, the policies trainers publish and the
job queue; none of it is for other users of the host. Modes are set where each file
is created (``os.open`` with the mode), never through the process umask: the
sandbox creates files that the boxes' unprivileged uids must read. ``tighten``
repairs a directory made by an older farmd or by hand.

Standard library and ``farmd.errors`` only: every layer of farm may import this.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

from farmd.errors import DataDirInUse

log = logging.getLogger("farmd.private")

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def make_dir(path: Path) -> None:
    """``path`` (and missing parents) as a private directory; an existing one is left as it is."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def create_file(path: Path) -> None:
    """Create ``path`` empty and private unless it exists (then it is left untouched)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` at once (a reader sees the old file or the new one), private."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def tighten(root: Path) -> list[tuple[Path, int]]:
    """Take group and other access away from ``root`` and everything under it.

    Returns each path changed with the mode it had. Symbolic links are neither followed nor
    changed (a link's own mode means nothing on Linux).
    """
    changed: list[tuple[Path, int]] = []
    root = root.resolve()  # a data directory that is a link: what it points at is the data directory

    def fix(path: Path) -> None:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode) or not mode & _OTHERS:
            return
        os.chmod(path, stat.S_IMODE(mode) & ~_OTHERS, follow_symlinks=False)
        changed.append((path, stat.S_IMODE(mode)))

    fix(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            fix(Path(folder) / name)
    return changed


LOCK_FILE = "farmd.lock"
"""In the data directory: locked by the farmd serving from it, and holding its pid."""


def hold_data_dir(data_dir: Path) -> int:
    """The data directory made if missing and locked for as long as this process lives (the kernel lets go when the
    process ends, killed or not): the lock's file descriptor. Two farmd on one directory would each serve their own
    memory of one store, leasing and streaming apart, and share one outbox and one run file; so the second is refused
    with ``DataDirInUse``, naming the first's pid. Blocking: call it in a thread."""
    make_dir(data_dir)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 16, 0).decode("ascii", errors="replace").strip()
        os.close(fd)
        raise DataDirInUse(f"another farmd (pid {holder if holder.isdigit() else 'unknown'}) serves from {data_dir}: "
                           "one farmd per data directory; stop that one, or give this one a --data of its own") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def make_data_dir_private(data_dir: Path) -> None:
    """The data directory made if missing, then 0700 with all in it 0600, whoever made it looser (an
    older farmd, a copy): each path tightened is logged. Blocking: call it in a thread."""
    make_dir(data_dir)
    for path, mode in tighten(data_dir):
        log.warning("%s was readable by others (mode %o): now only by farmd", path, mode,
                    extra={"event": "data_tightened", "path": str(path)})
