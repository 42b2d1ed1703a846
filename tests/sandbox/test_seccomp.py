"""The seccomp filter as data, and its compilation by libseccomp."""

from __future__ import annotations

import errno

from farmd.sandbox import seccomp


def test_denies_what_code_running_tasks_never_need() -> None:
    denied = seccomp.denied_syscalls()
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "mount", "fsopen", "move_mount", "open_tree",
                 "unshare", "setns", "keyctl", "add_key", "bpf", "perf_event_open", "io_uring_setup",
                 "userfaultfd", "kexec_load", "init_module", "finit_module", "reboot", "swapon",
                 "clock_settime", "settimeofday", "pidfd_getfd", "open_by_handle_at"):
        assert name in denied, name
    for common in ("read", "write", "openat", "clone", "execve", "mmap", "socket", "futex"):
        assert common not in denied, common


def test_conditional_rules() -> None:
    rules = seccomp.deny_rules()
    clone3 = [r for r in rules if r.syscall == "clone3"]
    assert clone3 and clone3[0].errno_value == errno.ENOSYS  # so libc falls back to clone(2)
    clone_flags = {r.when[0].value for r in rules if r.syscall == "clone"}
    assert 0x10000000 in clone_flags and 0x40000000 in clone_flags  # NEWUSER, NEWNET
    families = {r.when[0].value for r in rules if r.syscall == "socket" and len(r.when) == 1
                and r.when[0].index == 0 and r.when[0].op == "masked_eq"}
    assert 16 in families and 17 in families  # AF_NETLINK, AF_PACKET
    assert not {1, 2, 10} & families
    types = {r.when[0].value for r in rules if r.syscall == "socket" and r.when[0].index == 1}
    assert types == {3, 10}  # SOCK_RAW, SOCK_PACKET
    ioctls = {r.when[0].value for r in rules if r.syscall == "ioctl"}
    assert 0x5412 in ioctls  # TIOCSTI
    for r in rules:
        assert r.why and r.errno_value >= 0
    # 0: the call returns 0 without reaching the kernel. Only flushes and a cache hint do that.
    assert {r.syscall for r in rules if r.errno_value == 0} == {"sync", "syncfs", "fsync", "fdatasync", "msync",
                                                               "fadvise64"}


def test_compiles_to_bpf() -> None:
    program = seccomp.compile_bpf()
    assert len(program) % 8 == 0 and len(program) // 8 > 50
    assert seccomp.compile_bpf() is program  # compiled once per process
    fd = seccomp.bpf_fd()
    try:
        import os

        assert os.read(fd, len(program) + 1) == program
    finally:
        os.close(fd)


def _answer(syscall: str, *args: int) -> int | None:
    """What the filter's rules answer for ``syscall(*args)``: an errno (0: success without the kernel),
    or None when no rule matches and the call goes through. Evaluates the rules as data."""
    def holds(check: seccomp.ArgCheck) -> bool:
        arg = args[check.index] & (2**64 - 1)
        if check.op == "masked_eq":
            return arg & check.mask == check.value
        return {"eq": arg == check.value, "ne": arg != check.value, "gt": arg > check.value,
                "ge": arg >= check.value}[check.op]

    answers = {r.errno_value for r in seccomp.deny_rules() if r.syscall == syscall and all(map(holds, r.when))}
    assert len(answers) <= 1, f"{syscall}{args} matches rules with different answers: {answers}"
    return answers.pop() if answers else None


def test_notification_apis_on_shared_files_are_denied() -> None:
    """inotify, fanotify and dnotify on the read-only directories every box shares report other boxes'
    reads; cachestat and RWF_NOWAIT reads say whether a shared file is cached, fadvise drops it."""
    assert _answer("inotify_init") == errno.ENOSYS
    assert _answer("inotify_init1", 0) == errno.ENOSYS
    assert _answer("inotify_add_watch", 3, 0, 1) == errno.ENOSYS
    assert _answer("fanotify_init", 0x200, 0) == errno.EPERM
    assert _answer("fanotify_mark", 3, 1, 1, -100, 0) == errno.EPERM
    assert _answer("fcntl", 3, 1026, 1) == errno.EINVAL  # F_NOTIFY
    assert _answer("fcntl", 3, 1026 | (1 << 32), 1) == errno.EINVAL  # the kernel reads an int
    for cmd in (1, 2, 3, 4, 5, 6, 7, 1030, 1031):  # F_GETFD ... F_SETLKW, F_DUPFD_CLOEXEC
        assert _answer("fcntl", 3, cmd, 0) is None, cmd
    assert _answer("cachestat", 3, 0, 0, 0) == errno.EPERM
    for call in ("preadv2", "pwritev2"):
        assert _answer(call, 3, 0, 1, 0, 0, 0x8) == errno.EOPNOTSUPP  # RWF_NOWAIT
        assert _answer(call, 3, 0, 1, 0, 0, 0x8 | 0x10) == errno.EOPNOTSUPP
        assert _answer(call, 3, 0, 1, 0, 0, 0x10) is None  # RWF_APPEND
    assert _answer("fadvise64", 3, 0, 0, 4) == 0  # POSIX_FADV_DONTNEED: a hint, ignored
    assert _answer("fadvise64", 3, 0, 0, 3) is None  # WILLNEED


def test_whole_host_flushes_succeed_without_reaching_the_kernel() -> None:
    """Every filesystem a box can write is a tmpfs, where flushing does nothing: the calls can only
    reach the host's disks (sync: all of them; fsync on a host file: a journal commit and a cache flush)."""
    for call in ("sync", "syncfs", "fsync", "fdatasync"):
        assert _answer(call, 3) == 0, call
    assert _answer("msync", 0, 4096, 4) == 0  # MS_SYNC
    assert _answer("msync", 0, 4096, 4 | 2) == 0  # MS_SYNC | MS_INVALIDATE
    assert _answer("msync", 0, 4096, 1) is None  # MS_ASYNC does nothing anyway
    assert _answer("sync_file_range", 3, 0, 0, 2) is None  # never flushes a disk cache


def test_core_limit_is_fixed_once_by_the_init() -> None:
    """RLIMIT_CORE (4) cannot be set by any box process but pid 1, the box's init, which sets it to 1
    before the program exists; every process may read it."""
    assert _answer("setrlimit", 4, 0x1000) == errno.EPERM
    assert _answer("setrlimit", 4 | (1 << 32), 0x1000) == errno.EPERM
    assert _answer("setrlimit", 7, 0x1000) is None  # RLIMIT_NOFILE
    for pid in (0, 2, 77, 1 | (1 << 32)):
        assert _answer("prlimit64", pid, 4, 0x1000, 0) == errno.EPERM, pid
    assert _answer("prlimit64", 1, 4, 0x1000, 0) is None  # the init
    assert _answer("prlimit64", 0, 4, 0, 0x1000) is None  # reading
    assert _answer("prlimit64", 0, 7, 0x1000, 0) is None  # another limit


def test_protocols_the_kernel_would_load_a_module_for_are_denied() -> None:
    """socket(AF_INET/AF_INET6, ...) with a type or protocol the kernel does not have built in makes it
    run modprobe on the host, as root, outside the box's cgroup. Only TCP and UDP are left."""
    stream, dgram, cloexec, nonblock = 1, 2, 0x80000, 0x800
    for call in ("socket", "socketpair"):  # socketpair creates its two sockets the same way first
        for family in (2, 10):
            for kind, proto in ((stream, 0), (stream, 6), (dgram, 0), (dgram, 17), (stream | cloexec, 6),
                                (dgram | nonblock | cloexec, 17)):
                assert _answer(call, family, kind, proto) is None, (call, family, kind, proto)
            for kind, proto in ((stream, 132), (stream, 17), (dgram, 6), (dgram, 115), (stream, 256),
                                (stream, 262), (stream, 99), (stream, 1), (dgram, 1), (dgram, 58), (dgram, 136),
                                (dgram, 16), (stream | cloexec, 132), (stream, 6 | (1 << 32))):
                assert _answer(call, family, kind, proto) == errno.EPROTONOSUPPORT, (call, family, kind, proto)
            for kind in (4, 5, 6):  # SOCK_RDM, SOCK_SEQPACKET, SOCK_DCCP
                assert _answer(call, family, kind, 0) == errno.ESOCKTNOSUPPORT, (call, family, kind)
        assert _answer(call, 1, stream, 0) is None and _answer(call, 1, dgram, 1) is None  # AF_UNIX
