"""The seccomp filter every box runs under, as data, and its compilation to BPF.

The filter allows by default and denies what code-running tasks never need: the
kernel surfaces behind most container escapes (namespaces, mounts, keyrings, BPF,
perf, io_uring, userfaultfd, ptrace), anything that changes the host (clock,
modules, swap, reboot), raw and netlink sockets, and TIOCSTI. It also closes what
reaches past the box through what every box shares: watches on the read-only host
directories (a covert channel between boxes), the shared page cache, the host's
disks (sync, fsync), the host's modprobe (sockets of protocols built as modules),
and the core-dump helper (RLIMIT_CORE, fixed at 1 by the box's init). Syscalls of
any other ABI (i386 via int 0x80, x32) kill the process: a filter written for one
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

from farmd.errors import SeccompUnavailable

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
# The protocols the kernel has built in for the stream and datagram sockets of AF_INET and
# AF_INET6, as (type, protocol) pairs; 0 picks the default. Anything else sends the kernel
# looking for a module: it runs modprobe on the host, as root, outside the box's cgroup.
_INET_FAMILIES = (2, 10)
_SOCK_STREAM, _SOCK_DGRAM = 1, 2
_IPPROTO_TCP, _IPPROTO_UDP = 6, 17
_NON_BUILTIN_SOCK_TYPES = {4: "SOCK_RDM", 5: "SOCK_SEQPACKET", 6: "SOCK_DCCP"}
_F_NOTIFY = 1026
_RWF_NOWAIT = 0x8
_POSIX_FADV_DONTNEED = 4
_MS_SYNC = 4
_RLIMIT_CORE = 4
_BOX_INIT_PID = 1
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
    """Fail ``syscall`` with ``errno_value`` when every check in ``when`` holds (always, if empty).

    An ``errno_value`` of 0 makes the call return 0 without reaching the kernel: for calls
    that have nothing to do for the box and something to do to the host.
    """

    syscall: str
    errno_value: int
    why: str
    when: tuple[ArgCheck, ...] = ()


def _deny_all(names: tuple[str, ...], why: str, err: int = errno.EPERM) -> list[DenyRule]:
    return [DenyRule(n, err, why) for n in names]


def _int_is(index: int, value: int) -> ArgCheck:
    """The argument, as the C ``int`` the kernel reads (upper 32 bits ignored), equals ``value``."""
    return ArgCheck(index, "masked_eq", value, _INT_MASK)


def _outside(index: int, allowed: tuple[int, int]) -> list[tuple[ArgCheck, ...]]:
    """Checks, one rule each, that together hold for every value of the argument but the two in
    ``allowed`` (0 and one more, ascending). libseccomp takes one comparison per argument per rule,
    so a range is a run of aligned blocks: ``(arg & ~(size-1)) == start``."""
    low, high = allowed
    assert low == 0 < high
    checks: list[tuple[ArgCheck, ...]] = [(ArgCheck(index, "gt", high),)]
    start = 1
    while start < high:
        size = 1
        while start % (size * 2) == 0 and start + size * 2 <= high:
            size *= 2
        checks.append((ArgCheck(index, "masked_eq", start, ~(size - 1) & (2**64 - 1)),))
        start += size
    return checks


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
            "open_by_handle_at", "name_to_handle_at", "vm86", "vm86old",
            "mbind", "set_mempolicy", "migrate_pages", "move_pages", "memfd_secret",
        ),
        "host administration and known escape primitives",
    )
    rules += _shared_inode_rules()
    rules += _whole_host_rules()
    rules += _core_limit_rules()
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
    rules += _module_loading_socket_rules()
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


def _shared_inode_rules() -> list[DenyRule]:
    """Every box reads the same host files (/usr, bound read-only): what one box does to them, another
    must not be able to observe, or two attempts have a channel no bound or namespace sees."""
    # ENOSYS and EINVAL are what a kernel built without inotify or dnotify answers: programs
    # that watch files fall back to polling, which sees only changes, and nothing shared changes.
    rules = _deny_all(("inotify_init", "inotify_init1", "inotify_add_watch"),
                      "inotify reports other boxes' opens and reads of the files every box shares",
                      errno.ENOSYS)
    rules += _deny_all(("fanotify_init", "fanotify_mark"),
                       "fanotify reports other boxes' opens and reads of the files every box shares")
    rules.append(DenyRule("fcntl", errno.EINVAL,
                          "F_NOTIFY (dnotify) signals other boxes' reads in a shared directory",
                          (_int_is(1, _F_NOTIFY),)))
    rules += _deny_all(("cachestat",), "whether a shared file is in the page cache says what another box read")
    for call in ("preadv2", "pwritev2"):
        # EOPNOTSUPP is what files that cannot do RWF_NOWAIT answer; callers retry without it.
        rules.append(DenyRule(call, errno.EOPNOTSUPP,
                              "RWF_NOWAIT fails exactly when a shared file is not cached: a probe of other boxes' reads",
                              (ArgCheck(5, "masked_eq", _RWF_NOWAIT, _RWF_NOWAIT),)))
    # A hint with nothing to do in the box (tmpfs pages are the box's own memory) and
    # something to do to every other box: empty the page cache of a shared file.
    rules.append(DenyRule("fadvise64", 0, "DONTNEED drops a shared file's pages from the page cache",
                          (_int_is(3, _POSIX_FADV_DONTNEED),)))
    return rules


def _whole_host_rules() -> list[DenyRule]:
    """Flushes. Every filesystem a box can write is a tmpfs, where they have nothing to do, so they
    succeed without reaching the kernel: what they would reach is the host's own filesystems (sync
    writes back all of them, syncfs the one holding /usr; fsync, fdatasync and msync on a read-only
    host file still cost a journal commit and a disk cache flush each), once per call, as often as a
    box likes. Failing them instead would break programs that flush their own files before exit."""
    why = "flushes the host's filesystems and disk caches; the box's own are all tmpfs"
    rules = _deny_all(("sync", "syncfs", "fsync", "fdatasync"), why, 0)
    rules.append(DenyRule("msync", 0, why, (ArgCheck(2, "masked_eq", _MS_SYNC, _MS_SYNC),)))
    return rules


def _core_limit_rules() -> list[DenyRule]:
    """A crash that dumps core hands the process's memory to the host's core_pattern: a file, or a
    helper the kernel starts on the host as root (apport, systemd-coredump). With RLIMIT_CORE at
    exactly 1 the kernel starts no pipe helper (1 marks a helper's own crash) and writes no core file
    (the limit is under a page). The box's init sets it before the program exists and every box
    process inherits it; setting it to 0, the usual "no core", would start the helper again."""
    why = "RLIMIT_CORE stays at 1, so a crash reaches no host helper and leaves no core file"
    return [
        DenyRule("setrlimit", errno.EPERM, why, (_int_is(0, _RLIMIT_CORE),)),
        # pid 1 is the box's init, which sets the limit once, before anything of the program runs; the
        # program can reach only the init's own limit that way, and the init never crashes (it ignores
        # the box's signals and its memory is out of the program's reach). Reading (no new limit) is free.
        DenyRule("prlimit64", errno.EPERM, why,
                 (ArgCheck(0, "ne", _BOX_INIT_PID), _int_is(1, _RLIMIT_CORE), ArgCheck(2, "ne", 0))),
    ]


def _module_loading_socket_rules() -> list[DenyRule]:
    """Stream and datagram sockets of AF_INET and AF_INET6 with what the kernel has built in (TCP, UDP,
    the default); for any other type or protocol it asks modprobe, on the host, to load one."""
    why = "a type or protocol not built in makes the kernel run modprobe on the host"
    rules: list[DenyRule] = []
    for call in ("socket", "socketpair"):  # socketpair creates its sockets the same way first
        for family in _INET_FAMILIES:
            fam = _int_is(0, family)
            for sock_type, label in _NON_BUILTIN_SOCK_TYPES.items():
                rules.append(DenyRule(call, errno.ESOCKTNOSUPPORT, f"{label}: {why}",
                                      (fam, ArgCheck(1, "masked_eq", sock_type, _SOCK_TYPE_MASK))))
            for sock_type, proto in ((_SOCK_STREAM, _IPPROTO_TCP), (_SOCK_DGRAM, _IPPROTO_UDP)):
                kind = ArgCheck(1, "masked_eq", sock_type, _SOCK_TYPE_MASK)
                for checks in _outside(2, (0, proto)):
                    rules.append(DenyRule(call, errno.EPROTONOSUPPORT, f"protocol: {why}", (fam, kind, *checks)))
    return rules


def denied_syscalls() -> frozenset[str]:
    """Names of syscalls denied outright (no argument condition)."""
    return frozenset(r.syscall for r in deny_rules() if not r.when)


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
