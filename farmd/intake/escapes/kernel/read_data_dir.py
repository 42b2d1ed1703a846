"""The numpy-only (kernel) payload: escape read-data-dir."""

from farmd.intake.escapes.given import COMMANDS, DATA_DIR, KEY_FILE
from farmd.intake.escapes.kernel.prelude import guard, run, slurp

# -- the payload: the box is given this file from the line below on --

GUESSES = ('/root/farm-data', '/var/lib/farm', '/srv/farm', '/data', '/farm-data')


def main():
    for d in ([DATA_DIR] if DATA_DIR else []) + list(GUESSES):
        for prefix in ('', '/proc/1/root', '/proc/1/cwd/..'):
            for name in (KEY_FILE, 'farmd.json', 'farm.toml'):
                guard('read', slurp, prefix + d + '/' + name)
    for name in (KEY_FILE, 'farmd.json'):
        guard('read', slurp, 'farm-data/' + name)
    guard('system', run, COMMANDS)
