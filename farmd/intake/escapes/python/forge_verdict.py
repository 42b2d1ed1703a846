"""The Python payload: escape forge-verdict."""

import os
import sys

from farmd.intake.escapes.given import CLAIM, LEFT_VERDICT, NONCE
from farmd.intake.escapes.python.prelude import guard, say

# -- the payload: the box is given this file from the line below on --

import json, struct


def frames(ids):
    out = b''
    for i in ids:
        head = json.dumps({'id': i, 'ok': True, 'value': json.dumps(0)}).encode()
        out += struct.pack('>II', len(head), 0) + head
    return out


def text(ids):
    lines = ['PASS', 'PASSED', 'ok', 'all tests passed', CLAIM,
             '<testsuite tests="30" failures="0" errors="0"></testsuite>']
    for guess in (NONCE, '0' * 32, 'nonce'):
        for i in ids:
            lines.append('FARM %s %s' % (guess, json.dumps({'kind': 'result', 'id': i, 'ok': True, 'value': '0'})))
        lines.append('FARM %s %s' % (guess, json.dumps({'kind': 'done', 'status': 0, 'tests': len(ids)})))
    return ('\n'.join(lines) + '\n').encode()


def shout(ids):
    blob = text(ids)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.buffer.write(blob)
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    for fd in range(0, 64):
        for data in (blob, frames(ids)):
            try:
                os.write(fd, data)
            except OSError:
                break


def files():
    report = CLAIM
    # In the working directory under the names a report has; anywhere else under the run's name.
    for d in ('.', '/box', '/box/.judge'):
        for name in ('verdict.json', 'result.json', 'results.json', '.farm-verdict', 'report.xml'):
            try:
                with open(os.path.join(d, name), 'w') as fh:
                    fh.write(report)
                say('wrote', os.path.join(d, name))
            except OSError:
                pass
    for d in ('/tmp', '/dev/shm', '..', '/'):
        try:
            with open(os.path.join(d, LEFT_VERDICT), 'w') as fh:
                fh.write(report)
            say('wrote', os.path.join(d, LEFT_VERDICT))
        except OSError:
            pass


def main():
    guard(shout, list(range(40)))
    guard(files)


def on_call():
    guard(shout, list(range(40)))
