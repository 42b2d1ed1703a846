"""The Python payload: helpers every payload starts with."""

from farmd.intake.escapes.given import BUDGET_S, NAME

# -- the payload: the box is given this file from the line below on --

import os, sys, time
END = time.monotonic() + BUDGET_S


def left():
    return END - time.monotonic()


def say(*parts):
    try:
        print('farm-redteam', NAME, *parts, flush=True)
    except BaseException:
        pass


def guard(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:
        say('stopped', getattr(fn, '__name__', '?'), type(exc).__name__, str(exc)[:200])
        return None


def read(path, size=4096):
    try:
        with open(path, 'rb') as fh:
            return fh.read(size)
    except (OSError, ValueError):
        return None


def main():
    pass


def on_call():
    pass
