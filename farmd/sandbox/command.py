"""Policy + host layout -> the bwrap command line of one box. Pure: no I/O, no state.

Everything that names a host path travels in the ``--args FD`` payload, never on
bwrap's argv: a box can read its pid 1's /proc/1/cmdline, and the host's paths
are none of its business. The argv that stays visible is ``<run dir>/runtime/
bwrap-<hash> --args N -- /opt/farm/bin/python3 -I -S -B -c <boot> FD FD``: farm's run
directory (which /proc/1/exe and mountinfo show anyway), the box's own runtime
and its init.
"""

from __future__ import annotations

from dataclasses import dataclass

from farmd.sandbox.policy import SandboxPolicy

BOX_WORKDIR = "/box"
"""The box's writable scratch directory: its working directory and $HOME."""
BOX_RUNTIME = "/opt/farm"
"""farm's read-only runtime in the box: the init's interpreter and extra site-packages."""
BOX_SITE = f"{BOX_RUNTIME}/site"
"""Read-only site-packages of the box's Python runtime (numpy)."""
BOX_INIT_PYTHON = f"{BOX_RUNTIME}/bin/python3"
"""The box's init runs on an execute-only copy of the box's Python: exec'ing a file it cannot read
makes the init non-dumpable, so no process of the box can open /proc/<init>/mem and rewrite the
report of how the program ended."""
BOX_UID = 1000
BOX_GID = 1000
BOX_HOSTNAME = "box"
BOX_PATH = "/usr/bin:/bin"
BOX_PYTHON = "/usr/bin/python3"
DEV_NODES = (("null", "/dev/null"), ("zero", "/dev/zero"), ("urandom", "/dev/urandom"))
"""(name in the box's /dev, host device) pairs."""
DEV_LINKS = (("random", "urandom"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))
_DEV_TMPFS_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HostLayout:
    """The host paths a box is assembled from (see ``runtime.prepare_layout``)."""

    bwrap: str
    """The bwrap binary, at a path the unprivileged slot uid can execute."""
    ro_binds: tuple[tuple[str, str], ...]
    """(host path, box path) pairs bound read-only, in order."""
    symlinks: tuple[tuple[str, str], ...]
    """(target, box path) pairs, e.g. ("usr/bin", "/bin") on merged-/usr hosts."""
    etc_dir: str
    """A synthetic /etc: farm's passwd, group, hosts, hostname, nsswitch.conf, and copies of the
    host's ld.so.cache and alternatives; nothing else of the host's."""
    runtime_dir: str
    """Host directory bound at BOX_RUNTIME: bin/python3 (execute-only) and site/ (numpy)."""
    proc_masks: tuple[tuple[str, str], ...] = ()
    """(host path, box path) pairs bound read-only over the box's /proc: empty files and directories
    over what shows the host, a neutral boot id (``procfs.masks``)."""
    python: str = BOX_PYTHON
    """The box's Python for programs, as seen inside the box."""
    setpriv: str | None = "/usr/bin/setpriv"
    """util-linux setpriv, to start bwrap as the slot uid; None when the spawning thread switches
    its own ids (``creds.py``) or farmd is not root."""


@dataclass(frozen=True, slots=True)
class BoxFds:
    """Descriptor numbers, as bwrap will see them, of the channels a box is started with."""

    info: int
    """bwrap writes the host pid of the box's pid 1 here, before running anything (-1: none)."""
    block: int
    """bwrap waits for a byte here before starting the box's init: time to join the cgroup (-1: none)."""
    seccomp: int
    """The BPF program from ``seccomp.compile_bpf``."""
    control: int
    """The box init's end of the control socket (requests in, status out)."""


def bwrap_args(policy: SandboxPolicy, layout: HostLayout, scratch_dir: str, fds: BoxFds) -> list[str]:
    """The options for bwrap's ``--args`` payload. The command itself is ``stub_argv``."""
    args: list[str] = [
        # Every namespace. --unshare-user is explicit because --disable-userns needs it.
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--uid", str(BOX_UID), "--gid", str(BOX_GID),
        "--hostname", BOX_HOSTNAME,
        # If farmd dies, so does the box; a fresh session keeps TIOCSTI off any terminal.
        "--die-with-parent", "--new-session",
        # farm's init is the box's pid 1, not bwrap's: bwrap keeps its own processes
        # dumpable, so a pid 1 of bwrap's is one whose memory the program could rewrite.
        # As pid 1, the init also cannot be signalled from inside the box at all.
        "--as-pid-1",
        "--cap-drop", "ALL",
    ]
    for host, box in layout.ro_binds:
        args += ["--ro-bind", host, box]
    for target, box in layout.symlinks:
        args += ["--symlink", target, box]
    args += ["--ro-bind", layout.etc_dir, "/etc"]
    args += ["--ro-bind", layout.runtime_dir, BOX_RUNTIME]
    args += ["--proc", "/proc"]
    for host, box in layout.proc_masks:
        args += ["--ro-bind", host, box]
    # All of /proc read-only: the box never writes there (its stdio reopened through
    # /proc/self/fd lands on the pipe's own mount), and /proc/sys, sysrq-trigger and
    # /proc/<pid>/mem are then out of reach whatever a permission check would say.
    args += ["--remount-ro", "/proc"]
    # A minimal /dev, smaller than bwrap's --dev (no tty, pts or full): every bind
    # costs bwrap a pass over the mount table.
    args += ["--perms", "0755", "--size", str(_DEV_TMPFS_BYTES), "--tmpfs", "/dev"]
    for node, host in DEV_NODES:
        args += ["--dev-bind", host, f"/dev/{node}"]
    for link, target in DEV_LINKS:
        args += ["--symlink", target, f"/dev/{link}"]
    args += [
        "--perms", "1777", "--size", str(policy.shm_mb * 1024 * 1024), "--tmpfs", "/dev/shm",
        "--perms", "1777", "--size", str(policy.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
        "--bind", scratch_dir, BOX_WORKDIR,
        "--chdir", BOX_WORKDIR,
        "--remount-ro", "/",
    ]
    for name, value in sorted(box_env(policy).items()):
        args += ["--setenv", name, value]
    args += ["--seccomp", str(fds.seccomp)]
    if fds.info >= 0:
        args += ["--info-fd", str(fds.info)]
    if fds.block >= 0:
        args += ["--block-fd", str(fds.block)]
    return args


def box_env(policy: SandboxPolicy) -> dict[str, str]:
    """The whole environment of a program in the box. Nothing comes from farmd's own."""
    env = {
        "PATH": BOX_PATH,
        "HOME": BOX_WORKDIR,
        "PWD": BOX_WORKDIR,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONPATH": BOX_SITE,
        "PYTHONDONTWRITEBYTECODE": "1",
        # BLAS thread pools sized to the box, not to the host's core count.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    env.update(dict(policy.env))
    return env


def args_payload(args: list[str]) -> bytes:
    """NUL-separated, as ``bwrap --args FD`` reads them."""
    for a in args:
        if "\0" in a:
            raise ValueError(f"bwrap argument holds a NUL byte: {a!r}")
    return b"".join(a.encode() + b"\0" for a in args)


def init_argv(code_fd: int, ctrl_fd: int) -> list[str]:
    """The box's init: its execute-only Python, loading the precompiled ``stub.py`` from ``code_fd``."""
    boot = "import marshal,os,sys;exec(marshal.loads(os.read(int(sys.argv[1]),1<<22)))"
    return [BOX_INIT_PYTHON, "-I", "-S", "-B", "-c", boot, str(code_fd), str(ctrl_fd)]


def launch_argv(layout: HostLayout, uid: int, gid: int, args_fd: int, code_fd: int, ctrl_fd: int) -> list[str]:
    """How farmd starts a box: bwrap, behind setpriv (drop to the slot uid, no groups) when the
    layout names it. Otherwise the spawning thread already runs as the slot uid, or farmd is not root."""
    bwrap = [layout.bwrap, "--args", str(args_fd), "--", *init_argv(code_fd, ctrl_fd)]
    if layout.setpriv is None:
        return bwrap
    return [layout.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *bwrap]
