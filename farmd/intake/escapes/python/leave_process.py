"""The Python payload: escape leave-process."""

import os
import sys

from farmd.intake.escapes.given import LEFT_PROC
from farmd.intake.escapes.python.prelude import say

# -- the payload: the box is given this file from the line below on --

CGROUP_PROCS = ('/sys/fs/cgroup/cgroup.procs', '/sys/fs/cgroup/unified/cgroup.procs', '/sys/fs/cgroup/pids/cgroup.procs',
                '/sys/fs/cgroup/memory/cgroup.procs', '/sys/fs/cgroup/systemd/cgroup.procs',
                '/sys/fs/cgroup/freezer/cgroup.procs', '/proc/1/root/sys/fs/cgroup/cgroup.procs')


def daemon():
    import signal
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    # Out of the box's cgroup, the box's teardown would not find it.
    for path in CGROUP_PROCS:
        try:
            with open(path, 'w') as fh:
                fh.write(str(os.getpid()))
            say('moved into', path)
        except OSError:
            pass
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for exe in ('/usr/bin/sleep', '/bin/sleep'):
        try:
            os.execv(exe, [LEFT_PROC, '600'])
        except OSError:
            pass
    os.execv(sys.executable, [LEFT_PROC, '-c', 'import time; time.sleep(600)'])


def main():
    pid = os.fork()
    if pid == 0:
        try:
            daemon()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    say('left a daemon named', LEFT_PROC)
