"""Probe: look everywhere a box could find what its host process (farmctl) holds.

argv[1] is a descriptor number that farmctl inherited from its caller. Prints JSON:
this process's environment and open descriptors, every visible process's environ,
cmdline and descriptor targets, and what using the inherited descriptor number does.
"""

import errno
import json
import os
import sys


def read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError as exc:
        return f"<{errno.errorcode.get(exc.errno)}>"


def fd_targets(pid):
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError as exc:
        return f"<{errno.errorcode.get(exc.errno)}>"
    for name in names:
        try:
            out[name] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError as exc:
            out[name] = f"<{errno.errorcode.get(exc.errno)}>"
    return out


own_fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
inherited = int(sys.argv[1])
try:
    os.fstat(inherited)
    inherited_state = "open: " + os.read(inherited, 4096).decode(errors="replace")
except OSError as exc:
    inherited_state = errno.errorcode.get(exc.errno)
procs = {}
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    procs[pid] = {"environ": read(f"/proc/{pid}/environ"), "cmdline": read(f"/proc/{pid}/cmdline"),
                  "fds": fd_targets(pid)}
print(json.dumps({"environ": dict(os.environ), "own_fds": own_fds, "inherited": inherited_state,
                  "procs": procs}))
