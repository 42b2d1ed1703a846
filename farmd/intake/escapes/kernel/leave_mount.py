"""The numpy-only (kernel) payload: escape leave-mount."""

from farmd.intake.escapes.given import COMMANDS, LEFT_CGROUP, LEFT_MOUNT
from farmd.intake.escapes.kernel.prelude import guard, libc, run, say

# -- the payload: the box is given this file from the line below on --

def mounts():
    lib = libc()
    for d in ('/tmp', '/dev/shm', ''):
        target = (d + '/' + LEFT_MOUNT).encode()
        say('mkdir', lib.mkdir(target, 493), 'mount', lib.mount(b'tmpfs', target, b'tmpfs', 0, b'size=1m'))
    say('unshare', lib.unshare(0x10000000 | 0x20000))
    for root in ('/sys/fs/cgroup', '/sys/fs/cgroup/pids', '/sys/fs/cgroup/unified', '/sys/fs/cgroup/memory'):
        say('cgroup', root, lib.mkdir((root + '/' + LEFT_CGROUP).encode(), 493))


def main():
    guard('mounts', mounts)
    guard('system', run, COMMANDS)
