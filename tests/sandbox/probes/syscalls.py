"""Probe: call every kernel surface the box's seccomp filter must deny, and report what came back.

Prints one JSON object: name -> [return value, errno name or null]. A denied call
returns -1 with the filter's errno; a return of 0 (or any non-negative value) means
the call went through. Raw syscall numbers are x86_64's.
"""

import ctypes
import errno
import json
import os
import socket

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}


def call(name, nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *(a if isinstance(a, ctypes._SimpleCData | ctypes.Array) else
                                            ctypes.c_long(a) for a in args))
    err = ctypes.get_errno()
    if ret == 0 and name.startswith("clone"):
        os._exit(0)  # the child of a clone that should never have happened
    results[name] = [ret, errno.errorcode.get(err, str(err)) if ret < 0 else None]


def s(text):
    return ctypes.c_char_p(text.encode())


buf = ctypes.create_string_buffer(4096)
self_net = os.open("/proc/self/ns/net", os.O_RDONLY)
init_pidfd = os.pidfd_open(2)
now = ctypes.create_string_buffer(16)
libc.clock_gettime(0, now)

call("ptrace_attach_1", 101, 16, 1, 0, 0)
call("ptrace_attach_2", 101, 16, 2, 0, 0)
call("ptrace_traceme", 101, 0, 0, 0, 0)
call("process_vm_readv", 310, 2, buf, 1, buf, 1, 0)
call("process_vm_writev", 311, 2, buf, 1, buf, 1, 0)
call("kcmp", 312, 1, 2, 0, 0, 0)
call("pidfd_getfd", 438, init_pidfd, 0, 0)
call("mount_tmpfs", 165, s("tmpfs"), s("/tmp"), s("tmpfs"), 0, 0)
call("mount_bind_root", 165, s("/"), s("/box"), 0, 0x1000 | 0x4000, 0)  # MS_BIND|MS_REC
call("umount2", 166, s("/box"), 2)
call("pivot_root", 155, s("/box"), s("/box"))
call("chroot", 161, s("/box"))
call("open_tree", 428, -100, s("/"), 1)  # OPEN_TREE_CLONE
call("move_mount", 429, -1, s(""), -100, s("/box"), 0)
call("fsopen", 430, s("tmpfs"), 0)
call("fsconfig", 431, -1, 0, 0, 0, 0)
call("fsmount", 432, -1, 0, 0)
call("fspick", 433, -100, s("/"), 0)
call("mount_setattr", 442, -100, s("/"), 0, buf, 32)
call("unshare_user", 272, 0x10000000)
call("unshare_mount", 272, 0x00020000)
call("unshare_net", 272, 0x40000000)
call("unshare_pid", 272, 0x20000000)
call("setns_net", 308, self_net, 0)
call("keyctl_get_session", 250, 0, -3, 1)
call("add_key", 248, s("user"), s("farm"), s("x"), 1, -3)
call("request_key", 249, s("user"), s("farm"), 0, -3)
call("bpf_prog_load", 321, 5, buf, 128)
call("bpf_map_create", 321, 0, buf, 128)
call("perf_event_open", 298, buf, 0, -1, -1, 0)
call("io_uring_setup", 425, 8, buf)
call("io_uring_enter", 426, 0, 0, 0, 0, 0, 0)
call("io_uring_register", 427, 0, 0, 0, 0)
call("userfaultfd", 323, 0)
call("init_module", 175, buf, 16, s(""))
call("finit_module", 313, 0, s(""), 0)
call("delete_module", 176, s("loop"), 0)
call("kexec_load", 246, 0, 0, 0, 0)
call("reboot", 169, 0, 0, 0, 0)
call("swapon", 167, s("/box/swap"), 0)
call("clock_settime", 227, 0, now)
call("settimeofday", 164, 0, 0)
call("syslog_read_all", 103, 3, buf, 4096)
call("sethostname", 170, s("evil"), 4)
call("open_by_handle_at", 304, -100, buf, 0)
call("name_to_handle_at", 303, -100, s("/"), buf, buf, 0)
call("memfd_secret", 447, 0)
call("personality_read_implies_exec", 135, 0x0400000)
call("personality_no_aslr", 135, 0x0040000)
call("clone3", 435, buf, 88)
for flag, label in ((0x10000000, "user"), (0x00020000, "mount"), (0x40000000, "net"), (0x20000000, "pid"),
                    (0x08000000, "ipc"), (0x04000000, "uts"), (0x02000000, "cgroup")):
    call(f"clone_new{label}", 56, flag | 17, 0, 0, 0, 0)  # | SIGCHLD: a fork into a new namespace
for family, kind, label in ((16, 3, "netlink_raw"), (16, 2, "netlink_dgram"), (17, 3, "packet_raw"),
                            (17, 2, "packet_dgram"), (2, 3, "inet_raw"), (10, 3, "inet6_raw"),
                            (2, 10, "inet_packet"), (40, 1, "vsock"), (38, 5, "alg"), (15, 3, "key"),
                            (44, 3, "xdp"), (31, 1, "bluetooth"), (4, 2, "ipx"), (100, 1, "unknown")):
    call(f"socket_{label}", 41, family, kind | 0x80000, 0)  # | SOCK_CLOEXEC
call("socketpair_netlink", 53, 16, 2, 0, buf)
for fd in (0, 1, 2):
    call(f"tiocsti_fd{fd}", 16, fd, 0x5412, s("x"))
try:
    primary, secondary = os.openpty()  # the box may have no /dev/ptmx at all
except OSError:
    secondary = None
if secondary is not None:
    call("tiocsti_pty", 16, secondary, 0x5412, s("x"))
    call("tioclinux_pty", 16, secondary, 0x541C, buf)
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    results["python_netlink_route"] = [0, None]
except OSError as exc:
    results["python_netlink_route"] = [-1, errno.errorcode.get(exc.errno)]
try:
    os.setuid(0)
    results["setuid0"] = [0, None]
except OSError as exc:
    results["setuid0"] = [-1, errno.errorcode.get(exc.errno)]
print(json.dumps(results))
