"""The numpy-only (kernel) payload: escape leave-files."""

import numpy as np

from farmd.intake.escapes.given import COMMANDS, DATA_DIR, LEFT_FILE, NONCE
from farmd.intake.escapes.kernel.prelude import guard, run

# -- the payload: the box is given this file from the line below on --

def main():
    dirs = ['/tmp', '/var/tmp', '/dev/shm', '..', '/', '/run/farm', '/proc/1/root/tmp', '/proc/1/cwd']
    for d in dirs + ([DATA_DIR] if DATA_DIR else []):
        guard('tofile', np.frombuffer(NONCE.encode(), dtype=np.uint8).tofile, d + '/' + LEFT_FILE)
        guard('save', np.save, d + '/' + LEFT_FILE + '.npy', np.zeros(1))
    guard('system', run, COMMANDS)
