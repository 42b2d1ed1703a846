"""The Python payload: escape reach-farmd."""

import os

from farmd.intake.escapes.given import DATA_DIR, NAME, NONCE, PORTS
from farmd.intake.escapes.python.prelude import left, read, say

# -- the payload: the box is given this file from the line below on --

HOSTS = ('127.0.0.1', '::1', 'localhost', '10.0.2.2', '172.17.0.1', '192.168.0.1', '192.168.1.1', '10.0.0.1',
         '169.254.169.254')
SOCKET_DIRS = ('/run', '/var/run', '/run/farm', '/run/user', '/tmp', '/dev', '/dev/shm', '/box/..')


def hello():
    return ('farm-redteam %s %s\n' % (NAME, NONCE)).encode() + b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'


def routed():
    # The gateways and destinations of the routing table, then the addresses this host calls local.
    found = []
    for line in (read('/proc/net/route', 65536) or b'').decode(errors='replace').splitlines()[1:]:
        for col in line.split()[1:3]:
            try:
                raw = bytes.fromhex(col)[::-1]
            except ValueError:
                continue
            if len(raw) == 4 and any(raw):
                found.append('.'.join(str(b) for b in raw))
    lines = (read('/proc/net/fib_trie', 1 << 20) or b'').decode(errors='replace').splitlines()
    for prev, line in zip(lines, lines[1:]):
        if 'LOCAL' in line and '|--' in prev:
            found.append(prev.split('|--')[-1].strip())
    return found


def tcp(host, port):
    import socket
    try:
        with socket.create_connection((host, port), timeout=max(0.01, min(0.2, left()))) as s:
            s.sendall(hello())
            say('connected', host, port)
    except OSError as exc:
        say('no connection', host, port, type(exc).__name__)
    try:
        family = socket.AF_INET6 if ':' in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.sendto(hello(), (host, port))
    except OSError:
        pass


def sockets():
    import stat
    found = []
    for line in (read('/proc/net/unix', 1 << 20) or b'').decode(errors='replace').splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and cols[-1].startswith('@'):
            found.append('\0' + cols[-1][1:])
    for d in SOCKET_DIRS + ((DATA_DIR,) if DATA_DIR else ()):
        for root, dirs, files in os.walk(d):
            if left() <= 0.5:
                return found
            if root.count('/') - d.count('/') >= 2:
                dirs[:] = []
            for name in files:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        found.append(path)
                except OSError:
                    pass
    return found


def unix(path):
    import socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(max(0.01, min(0.2, left())))
            s.connect(path)
            s.sendall(hello())
            say('connected', repr(path))
    except OSError as exc:
        say('no connection', repr(path), type(exc).__name__)


def main():
    hosts = list(dict.fromkeys(list(HOSTS) + routed()))
    for port in PORTS:
        for host in hosts:
            if left() <= 0.8:  # the rest is the unix sockets'
                break
            tcp(host, port)
    found = sockets()
    say('unix sockets', len(found))
    for path in found:
        if left() <= 0:
            return
        unix(path)
