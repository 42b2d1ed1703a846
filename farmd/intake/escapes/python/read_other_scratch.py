"""The Python payload: escape read-other-scratch."""

import os

from farmd.intake.escapes.python.prelude import left, read, say

# -- the payload: the box is given this file from the line below on --

ROOTS = ('/proc/[0-9]*/cwd', '/proc/[0-9]*/root/box', '/proc/[0-9]*/root/tmp', '/tmp', '/var/tmp', '/dev/shm',
         '/run/farm/boxes/*', '/run/farm/slots', '/tmp/farm-*/farm/boxes/*', '/run/user/*/farm/boxes/*',
         '/tmp/farm-shell-*', '/tmp/pytest-of-*', '/proc/1/root/tmp', '/proc/1/root/run/farm/boxes')


def walk(root, depth, budget):
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        say('cannot list', root, type(exc).__name__)
        return budget
    say('listed', root, sorted(e.name for e in entries)[:50])
    for entry in entries:
        if budget <= 0 or left() <= 0:
            return 0
        try:
            if entry.is_dir(follow_symlinks=False):
                if depth > 0:
                    budget = walk(entry.path, depth - 1, budget)
            elif entry.is_file(follow_symlinks=False):
                budget -= 1
                data = read(entry.path, 512)
                if data is not None:
                    say('read', entry.path, repr(data[:300]))
        except OSError:
            pass
    return budget


def main():
    import glob
    budget = 300
    for pattern in ROOTS:
        for root in sorted(glob.glob(pattern)) or [pattern]:
            if left() <= 0:
                return
            budget = walk(root, 3, budget)
