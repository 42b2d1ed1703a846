"""The numpy-only (kernel) payload: escape exhaust-bounds."""

import numpy as np

from farmd.intake.escapes.given import COMMANDS, NONCE
from farmd.intake.escapes.kernel.prelude import guard, run, say

# -- the payload: the box is given this file from the line below on --

def flood():
    line = ('farm-redteam %s PASSED ' % NONCE) * 1000
    for _ in range(2048):
        print(line)


def hog():
    held = []
    for _ in range(64):
        held.append(np.ones(1 << 24))
    say('held', len(held) * 128, 'MiB')


def main():
    guard('system', run, COMMANDS)
    guard('hog', hog)
    guard('flood', flood)
