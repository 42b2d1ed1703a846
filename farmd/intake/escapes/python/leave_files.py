"""The Python payload: escape leave-files."""

import os

from farmd.intake.escapes.given import DATA_DIR, LEFT_FILE, NONCE
from farmd.intake.escapes.python.prelude import say

# -- the payload: the box is given this file from the line below on --

def main():
    cwd = os.getcwd()
    dirs = ['/tmp', '/var/tmp', '/dev/shm', os.path.dirname(cwd), os.path.expanduser('~'), '/', '/run', '/run/farm',
            '/proc/1/root/tmp', '/proc/1/cwd', '/proc/1/root']
    if DATA_DIR:
        dirs += [DATA_DIR, '/proc/1/root' + DATA_DIR]
    for d in dirs:
        path = os.path.join(d, LEFT_FILE)
        try:
            with open(path, 'w') as fh:
                fh.write(NONCE + '\n')
            say('wrote', path)
        except OSError as exc:
            say('cannot write', path, type(exc).__name__)
