"""The numpy-only (kernel) payload: escape signal-host."""

from farmd.intake.escapes.given import COMMANDS
from farmd.intake.escapes.kernel.prelude import guard, libc, run, say

# -- the payload: the box is given this file from the line below on --

def main():
    pass


def on_call():
    lib = libc()
    me = lib.getpid()
    for pid in range(1, 32768):
        if pid != me and lib.kill(pid, 0) == 0:
            say('signalled', pid, lib.kill(pid, 9))
    say('kill(-1)', lib.kill(-1, 9))
    guard('system', run, COMMANDS)
