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
    families = {r.when[0].value for r in rules if r.syscall == "socket" and r.when[0].index == 0
                and r.when[0].op == "masked_eq"}
    assert 16 in families and 17 in families  # AF_NETLINK, AF_PACKET
    assert not {1, 2, 10} & families
    types = {r.when[0].value for r in rules if r.syscall == "socket" and r.when[0].index == 1}
    assert types == {3, 10}  # SOCK_RAW, SOCK_PACKET
    ioctls = {r.when[0].value for r in rules if r.syscall == "ioctl"}
    assert 0x5412 in ioctls  # TIOCSTI
    for r in rules:
        assert r.why and r.errno_value > 0


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
