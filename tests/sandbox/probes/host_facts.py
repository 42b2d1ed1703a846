"""Probe: read each path named on the command line, as a program in a box would, and try to write it.

Prints one JSON object: path -> {"read": hex of what a read returned} for a file, {"list": names} for
a directory, or {"error": errno name}; plus "read-only <path>" -> whether the path sits on a read-only
mount, and "write <path>" -> "written" or the errno name of the failure.
"""

import errno
import json
import os
import sys

out = {}


def err(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))


for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            out[path] = {"list": sorted(os.listdir(path))}
        else:
            with open(path, "rb") as fh:
                out[path] = {"read": fh.read(4096).hex()}
    except OSError as exc:
        out[path] = {"error": err(exc)}
    try:
        out[f"read-only {path}"] = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as exc:
        out[f"read-only {path}"] = err(exc)
    if not os.path.isdir(path):
        try:
            with open(path, "wb") as fh:
                fh.write(b"1\n")
            out[f"write {path}"] = "written"
        except OSError as exc:
            out[f"write {path}"] = err(exc)
print(json.dumps(out))
