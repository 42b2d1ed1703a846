"""Probe: the calls whose effect reaches past the box to the whole host, and what each returned.

``host_wide.py FILE``: FILE is a host file under the box's read-only /usr that the host holds in its
page cache. Prints one JSON object: name -> [return value, errno name or null]. Flushing calls are run
on descriptors the kernel would refuse (-1, a pipe): a 0 from one of those shows the call never reached
the kernel. Raw syscall numbers are x86_64's.
"""

import ctypes
import errno
import json
import os
import socket
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
results = {}


def call(name, nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *(a if isinstance(a, ctypes._SimpleCData | ctypes.Array) else
                                            ctypes.c_long(a) for a in args))
    results[name] = [ret, errno.errorcode.get(ctypes.get_errno(), "?") if ret < 0 else None]


shared = os.open(sys.argv[1], os.O_RDONLY)
usr = os.open("/usr", os.O_RDONLY | os.O_DIRECTORY)
r, w = os.pipe()
call("sync", 162)
call("syncfs_usr", 306, usr)
call("syncfs_bad_fd", 306, -1)
for _ in range(100):  # each of these would be a journal commit and a cache flush of the host's disk
    call("fsync_usr_file", 74, shared)
    call("fdatasync_usr_file", 75, shared)
call("fsync_pipe", 74, w)
call("fdatasync_pipe", 75, w)
mapped = libc.mmap(None, 4096, 1, 1, shared, 0)  # PROT_READ, MAP_SHARED
call("msync_sync_usr_file", 26, ctypes.c_void_p(mapped), 4096, 4)  # MS_SYNC
call("msync_unmapped", 26, 0, 4096, 4)
call("fadvise_dontneed_usr_file", 221, shared, 0, 0, 4)  # POSIX_FADV_DONTNEED
iov = (ctypes.c_char * 4096)()
vec = (ctypes.c_void_p * 2)(ctypes.addressof(iov), 4096)
call("preadv2_nowait_usr_file", 327, shared, vec, 1, 0, 0, 0x8)  # RWF_NOWAIT
rng = (ctypes.c_uint64 * 2)(0, 0)
stat = (ctypes.c_uint64 * 5)()
call("cachestat_usr_file", 451, shared, rng, stat, 0)
# Sockets whose protocol the kernel would look for in a module (modprobe, run on the host as root).
for family, kind, proto, label in ((2, 1, 132, "inet_stream_sctp"), (10, 1, 132, "inet6_stream_sctp"),
                                   (2, 5, 0, "inet_seqpacket"), (10, 5, 0, "inet6_seqpacket"),
                                   (2, 6, 0, "inet_dccp"), (2, 2, 115, "inet_dgram_l2tp"),
                                   (2, 1, 17, "inet_stream_udp"), (2, 2, 6, "inet_dgram_tcp"),
                                   (2, 1, 256, "inet_stream_smc"), (2, 1, 99, "inet_stream_99"),
                                   (2, 4, 0, "inet_rdm")):
    call(f"socket_{label}", 41, family, kind | 0x80000, proto)
ok = {}
for family, kind, proto in ((socket.AF_INET, socket.SOCK_STREAM, 0), (socket.AF_INET, socket.SOCK_STREAM, 6),
                            (socket.AF_INET, socket.SOCK_DGRAM, 0), (socket.AF_INET, socket.SOCK_DGRAM, 17),
                            (socket.AF_INET6, socket.SOCK_STREAM, 6), (socket.AF_INET6, socket.SOCK_DGRAM, 17),
                            (socket.AF_UNIX, socket.SOCK_STREAM, 0), (socket.AF_UNIX, socket.SOCK_DGRAM, 1)):
    try:
        socket.socket(family, kind, proto).close()
        ok[f"{family}/{kind}/{proto}"] = "made"
    except OSError as exc:
        ok[f"{family}/{kind}/{proto}"] = errno.errorcode.get(exc.errno)
results["ordinary sockets"] = ok
print(json.dumps(results))
