"""The numpy-only (kernel) payload: escape read-other-scratch."""

from farmd.intake.escapes.given import COMMANDS
from farmd.intake.escapes.kernel.prelude import guard, run, slurp

# -- the payload: the box is given this file from the line below on --

def main():
    for pid in range(1, 10):
        for rel in ('cwd/submission.py', 'root/box/submission.py', 'root/tmp/.judge-agent.log', 'environ'):
            guard('read', slurp, '/proc/%d/%s' % (pid, rel))
    for path in ('/run/farm/boxes', '/tmp/farm-shell-0/tree', '/proc/1/root/tmp'):
        guard('read', slurp, path)
    guard('system', run, COMMANDS)
