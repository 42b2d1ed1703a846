"""The seccomp filter every box runs under, as data, and its compilation to BPF.

The filter allows by default and denies what code-running tasks never need: the
kernel surfaces behind most container escapes (namespaces, mounts, keyrings, BPF,
perf, io_uring, userfaultfd, ptrace), anything that changes the host (clock,
modules, swap, reboot), raw and netlink sockets, and TIOCSTI. Syscalls of any
other ABI (i386 via int 0x80, x32) kill the process: a filter written for one
ABI says nothing about another.

``deny_rules()`` is pure and unit-tested; ``compile_bpf()`` hands the rules to
libseccomp once and returns the program bwrap loads with ``--seccomp FD``.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from dataclasses import dataclass

# clone(2) flags that would make a new namespace; bwrap's --disable-userns already
# stops user namespaces, this stops the rest without needing a capability check.
_CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
_ALLOWED_SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6 (and the box has no network)
_HIGHEST_SOCKET_FAMILY = 46  # AF_MAX on 6.x kernels; anything above is denied by a range rule
_SOCK_TYPE_MASK = 0xF
_SOCK_RAW = 3
_SOCK_PACKET = 10
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_PERSONALITY_FLAGS = {
    0x0040000: "ADDR_NO_RANDOMIZE",
    0x0200000: "ADDR_COMPAT_LAYOUT",
    0x0400000: "READ_IMPLIES_EXEC",
    0x0100000: "MMAP_PAGE_ZERO",
}
_INT_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class ArgCheck:
    """One comparison of a syscall argument: ``(arg & mask) <op> value``."""

    index: int
    op: str  # "eq", "ne", "gt", "ge", "masked_eq"
    value: int
    mask: int = 0


@dataclass(frozen=True, slots=True)
class DenyRule:
    """Fail ``syscall`` with ``errno_value`` when every check in ``when`` holds (always, if empty)."""

    syscall: str
    errno_value: int
    why: str
    when: tuple[ArgCheck, ...] = ()


def _deny_all(names: tuple[str, ...], why: str, err: int = errno.EPERM) -> list[DenyRule]:
    return [DenyRule(n, err, why) for n in names]


def deny_rules() -> tuple[DenyRule, ...]:
    """Every rule of the box filter, in the order they are added. Pure."""
    rules: list[DenyRule] = []
    rules += _deny_all(
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
        "reading or steering another process",
    )
    rules += _deny_all(
        (
            "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
            "move_mount", "open_tree", "mount_setattr", "open_tree_attr",
        ),
        "changing the mount table, old or new mount API",
    )
    rules += _deny_all(("unshare", "setns"), "entering or making namespaces")
    rules += _deny_all(("keyctl", "add_key", "request_key"), "kernel keyrings")
    rules += _deny_all(("bpf",), "eBPF programs and maps")
    rules += _deny_all(("perf_event_open",), "perf events")
    rules += _deny_all(("io_uring_setup", "io_uring_enter", "io_uring_register"), "io_uring")
    rules += _deny_all(("userfaultfd",), "userfaultfd (a staple of kernel exploits)")
    rules += _deny_all(
        (
            "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
            "create_module", "query_module", "get_kernel_syms",
        ),
        "kernels and kernel modules",
    )
    rules += _deny_all(("reboot",), "rebooting the host")
    rules += _deny_all(("swapon", "swapoff"), "swap")
    rules += _deny_all(
        ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime"), "setting clocks"
    )
    rules += _deny_all(
        (
            "acct", "quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl", "syslog", "vhangup",
            "iopl", "ioperm", "uselib", "ustat", "sysfs", "_sysctl", "sethostname", "setdomainname",
            "fanotify_init", "open_by_handle_at", "name_to_handle_at", "vm86", "vm86old",
            "mbind", "set_mempolicy", "migrate_pages", "move_pages", "memfd_secret",
        ),
        "host administration and known escape primitives",
    )
    # clone3 passes its flags in memory where a filter cannot look: ENOSYS makes
    # glibc fall back to clone(2), whose flags the rules below can check.
    rules.append(DenyRule("clone3", errno.ENOSYS, "flags not inspectable; libc falls back to clone"))
    for name, flag in _CLONE_NAMESPACE_FLAGS.items():
        rules.append(
            DenyRule("clone", errno.EPERM, f"clone with {name}", (ArgCheck(0, "masked_eq", flag, flag),))
        )
    # Sockets: only unix and inet families, and no raw or packet sockets within them.
    for call in ("socket", "socketpair"):
        for family in range(_HIGHEST_SOCKET_FAMILY + 1):
            if family not in _ALLOWED_SOCKET_FAMILIES:
                rules.append(
                    DenyRule(call, errno.EAFNOSUPPORT, f"socket family {family}",
                             (ArgCheck(0, "masked_eq", family, _INT_MASK),))
                )
        rules.append(
            DenyRule(call, errno.EAFNOSUPPORT, "unknown socket families",
                     (ArgCheck(0, "gt", _HIGHEST_SOCKET_FAMILY),))
        )
        for sock_type, label in ((_SOCK_RAW, "SOCK_RAW"), (_SOCK_PACKET, "SOCK_PACKET")):
            rules.append(
                DenyRule(call, errno.EPERM, label,
                         (ArgCheck(1, "masked_eq", sock_type, _SOCK_TYPE_MASK),))
            )
    for request, label in ((_TIOCSTI, "TIOCSTI"), (_TIOCLINUX, "TIOCLINUX")):
        rules.append(
            DenyRule("ioctl", errno.EPERM, f"{label}: pushing input into a terminal",
                     (ArgCheck(1, "masked_eq", request, _INT_MASK),))
        )
    # personality: the execution-domain flags that weaken the process (no ASLR,
    # executable data, a mappable page zero) are exploit aids, never program needs.
    # libseccomp allows one comparison per argument, so the query form
    # personality(0xffffffff) is denied too: a lost answer, never a lost program.
    for flag, label in _PERSONALITY_FLAGS.items():
        rules.append(
            DenyRule("personality", errno.EPERM, f"personality {label}",
                     (ArgCheck(0, "masked_eq", flag, flag),))
        )
    return tuple(rules)


def denied_syscalls() -> frozenset[str]:
    """Names of syscalls denied outright (no argument condition)."""
    return frozenset(r.syscall for r in deny_rules() if not r.when)


class SeccompUnavailable(RuntimeError):
    pass


@functools.cache
def compile_bpf() -> bytes:
    """The filter as a classic BPF program for the native architecture.

    Syscall names this architecture does not have are skipped: they cannot be
    called, so there is nothing to deny.
    """
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # libseccomp missing or unloadable
        raise SeccompUnavailable(f"libseccomp could not be loaded: {exc}") from exc

    ops = {"eq": sc.EQ, "ne": sc.NE, "gt": sc.GT, "ge": sc.GE, "masked_eq": sc.MASKED_EQ}
    filt = sc.SyscallFilter(sc.ALLOW)
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    # bwrap sets no_new_privs itself; the filter must still load if it did not.
    filt.set_attr(sc.Attr.CTL_NNP, 1)
    for rule in deny_rules():
        try:
            number = sc.resolve_syscall(sc.Arch.NATIVE, rule.syscall)
        except (ValueError, OSError):
            continue
        if number < 0:
            continue
        args = []
        for check in rule.when:
            if check.op == "masked_eq":
                args.append(sc.Arg(check.index, ops["masked_eq"], check.mask, check.value))
            else:
                args.append(sc.Arg(check.index, ops[check.op], check.value))
        filt.add_rule(sc.ERRNO(rule.errno_value), number, *args)
    with tempfile.TemporaryFile() as fh:
        filt.export_bpf(fh)
        fh.seek(0)
        program = fh.read()
    if not program or len(program) % 8:
        raise SeccompUnavailable("libseccomp produced an empty or malformed BPF program")
    return program


def bpf_fd() -> int:
    """A fresh, readable fd holding the BPF program, for bwrap's ``--seccomp``.

    Each box needs its own fd: bwrap reads from the current offset.
    """
    program = compile_bpf()
    fd = os.memfd_create("farm-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
