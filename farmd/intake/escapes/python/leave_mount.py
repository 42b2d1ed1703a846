"""The Python payload: escape leave-mount."""

import os
import time

from farmd.intake.escapes.given import LEFT_CGROUP, LEFT_MOUNT
from farmd.intake.escapes.python.prelude import guard, left, read, say

# -- the payload: the box is given this file from the line below on --

MS_BIND, MS_REC, MS_SHARED = 4096, 16384, 1 << 20
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000


def libc():
    import ctypes
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return lib, ctypes


def mount(lib, ctypes, tag, source, target, fstype, flags, data):
    rc = lib.mount(source, target.encode(), fstype, flags, data)
    say(tag, 'mount', source, target, fstype, 'mounted' if rc == 0 else os.strerror(ctypes.get_errno()))
    return rc == 0


def mounts(tag):
    lib, ctypes = libc()
    # Shared propagation first: a mount made below would then reach wherever / came from.
    mount(lib, ctypes, tag, None, '/', None, MS_SHARED | MS_REC, None)
    for d in ('/tmp', '/dev/shm', '/', os.path.dirname(os.getcwd()), '/proc/1/root/tmp'):
        target = os.path.join(d, LEFT_MOUNT)
        try:
            os.mkdir(target)
        except OSError:
            pass
        mount(lib, ctypes, tag, b'tmpfs', target, b'tmpfs', 0, b'size=1m')
        mount(lib, ctypes, tag, b'/', target, None, MS_BIND | MS_REC, None)


def unshared():
    lib, ctypes = libc()
    uid, gid = os.getuid(), os.getgid()
    if lib.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        say('unshare', os.strerror(ctypes.get_errno()))
    for path, text in (('/proc/self/setgroups', 'deny'), ('/proc/self/uid_map', '0 %d 1' % uid),
                       ('/proc/self/gid_map', '0 %d 1' % gid)):
        try:
            with open(path, 'w') as fh:
                fh.write(text)
        except OSError:
            pass
    mounts('unshared')


def cgroups():
    import glob
    lib, ctypes = libc()
    roots = ['/sys/fs/cgroup'] + glob.glob('/sys/fs/cgroup/*')
    for line in (read('/proc/self/cgroup') or b'').decode(errors='replace').splitlines():
        path = line.split(':', 2)[-1]
        roots += [r + path for r in ['/sys/fs/cgroup'] + glob.glob('/sys/fs/cgroup/*')]
    own = os.path.join('/tmp', LEFT_MOUNT + '-cg')
    for fstype, data in ((b'cgroup2', None), (b'cgroup', b'pids')):
        try:
            os.mkdir(own)
        except OSError:
            pass
        if mount(lib, ctypes, 'box', fstype, own, fstype, 0, data):
            roots.append(own)
    for root in roots:
        path = os.path.join(root, LEFT_CGROUP)
        try:
            os.mkdir(path)
            say('made cgroup', path)
        except OSError as exc:
            say('cannot make cgroup', path, type(exc).__name__)


def main():
    guard(mounts, 'box')
    guard(cgroups)
    pid = os.fork()
    if pid == 0:
        try:
            guard(unshared)
        finally:
            os._exit(0)
    while left() > 0 and os.waitpid(pid, os.WNOHANG)[0] == 0:
        time.sleep(0.01)
