"""The numpy-only (kernel) payload: escape reach-farmd."""

import numpy as np

from farmd.intake.escapes.given import COMMANDS, NONCE, PORTS
from farmd.intake.escapes.kernel.prelude import guard, run

# -- the payload: the box is given this file from the line below on --

def main():
    for port in PORTS:
        for host in ('127.0.0.1', 'localhost', '10.0.2.2', '172.17.0.1'):
            guard('fetch', np.genfromtxt, 'http://%s:%d/farm-redteam-%s' % (host, port, NONCE))
    guard('system', run, COMMANDS)
