"""Probe: watch a shared read-only directory for other boxes' reads, by every notification API.

``watch.py DIR MARKER``: sets up inotify, fanotify (the unprivileged, FID-reporting kind) and dnotify
watches on DIR for opens and reads, then waits for SIGUSR1 from the host (which meanwhile has another
box read files in DIR), collects whatever events arrived and prints one JSON object: API -> the errno
name of the call that failed, or what arrived (bytes of events; for dnotify, whether its signal came).
MARKER only puts a unique string in argv. Everything is imported before the watches exist: an import
opens files in DIR too.
"""

import ctypes
import errno
import fcntl
import json
import os
import signal
import sys

target = sys.argv[1].encode()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}


def failed(call):
    return errno.errorcode.get(ctypes.get_errno(), "?") + " from " + call


IN_ACCESS, IN_OPEN = 0x1, 0x20
FAN_ACCESS, FAN_OPEN, FAN_EVENT_ON_CHILD = 0x1, 0x20, 0x08000000
FAN_CLASS_NOTIF, FAN_REPORT_FID, FAN_NONBLOCK, FAN_MARK_ADD = 0, 0x200, 0x2, 0x1
F_NOTIFY, DN_ACCESS, DN_MULTISHOT = 1026, 0x1, 0x80000000
AT_FDCWD = -100

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGIO})
watches = {}
fd = libc.inotify_init1(os.O_NONBLOCK)
if fd < 0:
    out["inotify"] = failed("inotify_init1")
elif libc.inotify_add_watch(fd, target, IN_ACCESS | IN_OPEN) < 0:
    out["inotify"] = failed("inotify_add_watch")
else:
    watches["inotify"] = fd
fd = libc.syscall(300, FAN_CLASS_NOTIF | FAN_REPORT_FID | FAN_NONBLOCK, os.O_RDONLY)  # fanotify_init
if fd < 0:
    out["fanotify"] = failed("fanotify_init")
elif libc.syscall(301, fd, FAN_MARK_ADD, ctypes.c_uint64(FAN_ACCESS | FAN_OPEN | FAN_EVENT_ON_CHILD),
                  AT_FDCWD, ctypes.c_char_p(target)) < 0:  # fanotify_mark
    out["fanotify"] = failed("fanotify_mark")
else:
    watches["fanotify"] = fd
dfd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
try:
    fcntl.fcntl(dfd, F_NOTIFY, DN_ACCESS | DN_MULTISHOT)
    watches["dnotify"] = dfd
except OSError as exc:
    out["dnotify"] = errno.errorcode.get(exc.errno, "?") + " from fcntl(F_NOTIFY)"

signal.sigwait({signal.SIGUSR1})  # the host runs the other box meanwhile
for api, fd in watches.items():
    if api == "dnotify":
        out[api] = int(signal.SIGIO in signal.sigpending())
        continue
    seen = 0
    try:
        while True:
            seen += len(os.read(fd, 1 << 16))
    except BlockingIOError:
        pass
    out[api] = seen
print(json.dumps(out), flush=True)
