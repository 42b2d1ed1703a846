"""Probe: reach the host's listeners from inside the box.

argv[1] is JSON: {"tcp": [[host, port], ...], "udp": [[host, port], ...],
"abstract_stream": [name, ...], "abstract_dgram": [name, ...]} (abstract names
without their leading NUL). Prints JSON: one [kind, target, outcome] per attempt,
where outcome is "connected", "sent" or the errno name of the failure, plus the
box's network interfaces and what a DNS query to public resolvers does.
"""

import errno
import json
import socket
import sys

targets = json.loads(sys.argv[1])
attempts = []


def outcome(exc):
    return errno.errorcode.get(exc.errno, str(exc)) if exc.errno else type(exc).__name__


for host, port in targets["tcp"]:
    try:
        with socket.create_connection((host, port), timeout=2):
            attempts.append(["tcp", f"{host} {port}", "connected"])
    except OSError as exc:
        attempts.append(["tcp", f"{host} {port}", outcome(exc)])
for host, port in targets["udp"]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(b"ping from the box", (host, port))
            attempts.append(["udp", f"{host} {port}", "sent"])
        except OSError as exc:
            attempts.append(["udp", f"{host} {port}", outcome(exc)])
for name in targets["abstract_stream"]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect("\0" + name)
            s.sendall(b"hello from the box")
            attempts.append(["abstract_stream", name, "connected"])
        except OSError as exc:
            attempts.append(["abstract_stream", name, outcome(exc)])
for name in targets["abstract_dgram"]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(b"hello from the box", "\0" + name)
            attempts.append(["abstract_dgram", name, "sent"])
        except OSError as exc:
            attempts.append(["abstract_dgram", name, outcome(exc)])
dns = []
query = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")  # A example.com
for resolver in ("8.8.8.8", "1.1.1.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1)
        try:
            s.sendto(query, (resolver, 53))
            s.recv(512)
            dns.append([resolver, "answered"])
        except OSError as exc:
            dns.append([resolver, outcome(exc)])
with open("/proc/net/dev") as fh:  # if_nameindex() would need netlink, which the box may not open
    interfaces = [line.split(":")[0].strip() for line in fh.readlines()[2:]]
print(json.dumps({"attempts": attempts, "interfaces": interfaces, "dns": dns}))
