"""A box's scratch directory: a size-bounded tmpfs of its own, mounted by farmd.

A tmpfs per box bounds disk use and inode count exactly, leaves nothing on the
host's disks, and makes hard links to host files impossible (they would cross a
filesystem). Files are copied in before the program starts and harvested after
every process of the box is dead, one path component at a time and never through
a link: a box that plants a symlink to /etc/shadow gets the symlink skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from farmd.sandbox.owners import owner_alive

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_COPY_CHUNK = 1 << 20
_MAX_DEPTH = 64
# Directory levels below the root whose descriptors the harvest keeps open. Enough that a
# wide tree never reopens a directory; few enough that, at two descriptors a level, the
# harvest holds two dozen at most however the box shaped its tree.
_HELD_LEVELS = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def mount_tmpfs(path: Path, size_bytes: int, inodes: int, uid: int, gid: int) -> None:
    """Mount a fresh tmpfs at ``path`` (an empty directory), owned by the box's slot uid."""
    opts = f"size={size_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={gid}"
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def unmount(path: Path) -> None:
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not mounted: nothing to do
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


def is_full(path: Path, slack_bytes: int = 4096) -> bool:
    """True when the scratch tmpfs has no room left for another block or another file."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < slack_bytes or st.f_favail == 0


def copy_in(source: Path | Mapping[str, bytes], scratch: Path, uid: int, gid: int) -> None:
    """Place the caller's files in the scratch directory, owned by the box's uid.

    ``source`` is a directory (its regular files and subdirectories are copied;
    links in it are not followed) or a mapping of relative path -> content.
    """
    if isinstance(source, Mapping):
        for rel, content in source.items():
            target = _safe_join(scratch, rel)
            _mkdirs(target.parent, scratch, uid, gid)
            target.write_bytes(content)
            os.chown(target, uid, gid)
        return
    for root, dirs, files in os.walk(source, followlinks=False):
        rel_root = Path(root).relative_to(source)
        for d in dirs:
            src = Path(root) / d
            if src.is_symlink():
                continue
            dst = scratch / rel_root / d
            dst.mkdir(mode=0o755, exist_ok=True)
            os.chown(dst, uid, gid)
        for f in files:
            src = Path(root) / f
            st = os.lstat(src)
            if not stat.S_ISREG(st.st_mode):
                continue
            dst = scratch / rel_root / f
            shutil.copyfile(src, dst, follow_symlinks=False)
            os.chmod(dst, stat.S_IMODE(st.st_mode) | 0o600)
            os.chown(dst, uid, gid)


def _safe_join(root: Path, rel: str) -> Path:
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or any(p in ("..", "") for p in parts):
        raise ValueError(f"file name {rel!r} must be a relative path without '..'")
    return root.joinpath(*parts)


def _mkdirs(path: Path, root: Path, uid: int, gid: int) -> None:
    missing: list[Path] = []
    p = path
    while p != root and not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o755)
        os.chown(d, uid, gid)


@dataclass
class Harvest:
    """What came out of a box: files copied, and everything skipped with the reason."""

    copied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    bytes_copied: int = 0


def harvest(scratch: Path, dest: Path, max_bytes: int, private_fs: bool = False) -> Harvest:
    """Copy the scratch directory's regular files to ``dest``, never following a link.

    Every component is opened relative to its parent's descriptor with O_NOFOLLOW,
    so a symlink anywhere in the tree is skipped rather than resolved on the host;
    a file with several hard links is copied only when ``private_fs`` says the scratch
    directory is a filesystem of its own (a box's tmpfs), so that every other link is
    inside it too; otherwise it is skipped. Both trees are walked by
    descriptor, one component at a time, so neither depth nor path length nor odd
    bytes in names can break it, and with a bounded number of descriptors held, so
    neither can thousands of directories (in farmd, a descriptor held here is one
    another box cannot launch with). What it will not copy is listed with the
    reason. Call only once the box is dead.
    """
    out = Harvest()
    dest.mkdir(parents=True, exist_ok=True)
    root_fd = os.open(scratch, _O_DIR)
    dest_fd = os.open(dest, _O_DIR)
    try:
        _harvest_tree(root_fd, dest_fd, out, max_bytes, os.fstat(root_fd).st_dev if private_fs else -1)
    finally:
        os.close(root_fd)
        os.close(dest_fd)
    return out


def _shown(path: str) -> str:
    """A path as text: bytes that are not UTF-8 are shown as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


@dataclass
class _Level:
    """One directory on the walk's current path, in the source tree and in its copy."""

    name: str
    """Its name in its parent ('' for the root)."""
    shown: str
    """Its path below the root as the result shows it, with a trailing slash ('' for the root)."""
    ident: tuple[int, int]
    """(st_dev, st_ino) of the source directory, to know it again when it is reopened."""
    src: int = -1
    dst: int = -1
    """Open descriptors, or -1 while closed to bound how many the walk holds."""
    pending: list[str] = field(default_factory=list)
    """Subdirectories still to walk, the next one last."""


def _harvest_tree(root_fd: int, dest_root_fd: int, out: Harvest, max_bytes: int, device: int) -> None:
    """Depth first, the files of a directory before its subdirectories, in name order.

    Only the root and the deepest ``_HELD_LEVELS`` directories of the current path stay open
    (two descriptors each: source and copy). A directory whose descriptors were closed is
    reopened from its nearest open ancestor, one O_NOFOLLOW component at a time, when the
    walk comes back to it. The roots are closed by the caller.
    """
    st = os.fstat(root_fd)
    root = _Level("", "", (st.st_dev, st.st_ino), src=root_fd, dst=dest_root_fd)
    root.pending = _harvest_dir(root, 0, out, max_bytes, device)
    path = [root]
    try:
        while path:
            top = path[-1]
            if not top.pending:
                path.pop()
                if top is not root:
                    _close(top)
                continue
            if top.src < 0 and not _reopen(path, out):
                top.pending.clear()
                continue
            child = _enter(top, top.pending.pop(), out)
            if child is None:
                continue
            path.append(child)
            for far in path[1:-_HELD_LEVELS]:
                _close(far)
            child.pending = _harvest_dir(child, len(path) - 1, out, max_bytes, device)
    finally:
        for level in path[1:]:
            _close(level)


def _close(level: _Level) -> None:
    for fd in (level.src, level.dst):
        if fd >= 0:
            os.close(fd)
    level.src = level.dst = -1


def _enter(parent: _Level, name: str, out: Harvest) -> _Level | None:
    """Open subdirectory ``name`` of ``parent`` and its copy (made here), or skip it with the reason."""
    shown = f"{parent.shown}{_shown(name)}"
    try:
        src = os.open(name, _O_DIR, dir_fd=parent.src)
    except OSError as exc:
        out.skipped.append((shown, f"open failed: {exc.strerror}"))
        return None
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent.dst)
        dst = os.open(name, _O_DIR, dir_fd=parent.dst)
    except OSError as exc:
        os.close(src)
        out.skipped.append((shown, f"cannot create: {exc.strerror}"))
        return None
    st = os.fstat(src)
    return _Level(name, f"{shown}/", (st.st_dev, st.st_ino), src=src, dst=dst)


def _reopen(path: list[_Level], out: Harvest) -> bool:
    """Reopen the closed directories at the end of ``path``, from the nearest open one down; those
    above the deepest ``_HELD_LEVELS`` are closed again as soon as the next one is open.

    False, with the reason recorded, when one of them cannot be opened or is no longer the
    directory the walk left there (only a tree that changes under the harvest can do that).
    """
    base = max(i for i, level in enumerate(path) if level.src >= 0)
    held_from = len(path) - _HELD_LEVELS
    reason = ""
    for i in range(base + 1, len(path)):
        parent, level = path[i - 1], path[i]
        try:
            level.src = os.open(level.name, _O_DIR, dir_fd=parent.src)
            level.dst = os.open(level.name, _O_DIR, dir_fd=parent.dst)
        except OSError as exc:
            reason = f"cannot reopen: {exc.strerror}"
            break
        if base < i - 1 < held_from:
            _close(parent)
        st = os.fstat(level.src)
        if (st.st_dev, st.st_ino) != level.ident:
            reason = "changed while it was copied"
            break
    if not reason:
        return True
    out.skipped.append((path[-1].shown.rstrip("/"), reason))
    for level in path[base + 1:]:
        _close(level)
    return False


def _harvest_dir(level: _Level, depth: int, out: Harvest, max_bytes: int, device: int) -> list[str]:
    """Copy the regular files of one directory; return its subdirectories to walk, the first one last."""
    try:
        names = sorted(os.listdir(level.src))
    except OSError as exc:
        out.skipped.append((level.shown.rstrip("/") or ".", f"cannot list: {exc.strerror}"))
        return []
    subdirs: list[str] = []
    for name in names:
        shown = f"{level.shown}{_shown(name)}"
        try:
            st = os.stat(name, dir_fd=level.src, follow_symlinks=False)
        except OSError as exc:
            out.skipped.append((shown, f"stat failed: {exc.strerror}"))
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth >= _MAX_DEPTH:
                out.skipped.append((shown, f"deeper than {_MAX_DEPTH} directories"))
            else:
                subdirs.append(name)
        elif stat.S_ISLNK(st.st_mode):
            out.skipped.append((shown, "symbolic link"))
        elif not stat.S_ISREG(st.st_mode):
            out.skipped.append((shown, "not a regular file"))
        elif st.st_nlink != 1 and st.st_dev != device:
            # On a private tmpfs every link is the box's own (a link to a host file would cross
            # filesystems: EXDEV); anywhere else a second link may be a host file's.
            out.skipped.append((shown, "hard link"))
        elif out.bytes_copied + st.st_size > max_bytes:
            out.skipped.append((shown, "over the harvest size bound"))
        else:
            _copy_file(level.src, level.dst, name, shown, out, st.st_mode)
    subdirs.reverse()
    return subdirs


def _copy_file(src_dir: int, dst_dir: int, name: str, shown: str, out: Harvest, mode: int) -> None:
    try:
        src = os.open(name, _O_FILE, dir_fd=src_dir)
    except OSError as exc:
        # ELOOP: the entry became a link (cannot happen once the box is dead, but be sure).
        out.skipped.append((shown, "symbolic link" if exc.errno == errno.ELOOP else f"open failed: {exc.strerror}"))
        return
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            out.skipped.append((shown, "not a regular file"))
            return
        try:
            # Execute bits survive (a script the box wrote stays runnable); set-id bits never do.
            dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o644 | (mode & 0o111), dir_fd=dst_dir)
        except OSError as exc:
            out.skipped.append((shown, f"cannot create: {exc.strerror}"))
            return
        try:
            while chunk := os.read(src, _COPY_CHUNK):
                os.write(dst, chunk)
                out.bytes_copied += len(chunk)
        finally:
            os.close(dst)
        out.copied.append(shown)
    finally:
        os.close(src)


def remove_dir(path: Path) -> None:
    """Unmount and remove a scratch mount point (a no-op if it is already gone)."""
    with contextlib.suppress(FileNotFoundError):
        unmount(path)
        os.rmdir(path)


def sweep(boxes_dir: Path) -> int:
    """Unmount and remove scratch directories of boxes whose farmd is gone."""
    removed = 0
    try:
        entries = list(boxes_dir.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if owner_alive(entry.name):
            continue
        with contextlib.suppress(OSError):
            remove_dir(entry)
            removed += 1
    return removed
