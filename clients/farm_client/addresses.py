"""One farm reached at several addresses (``"A:7431,B:7431"``): its coordinators, of which one serves at a time.

grpc dials a list of addresses as one channel (``ipv4:A,B``), connecting to the first that answers and to another
when that one goes away; it takes such a list only as IP addresses, so host names are resolved here, once, when
the channel is made. One address is passed on as it is (grpc resolves its name itself, and again on reconnects).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence


def grpc_target(addr: str | Sequence[str]) -> str:
    """The grpc target for ``addr``: one ``HOST:PORT``, or several (a list, or joined by commas)."""
    addrs = [a.strip() for a in (addr.split(",") if isinstance(addr, str) else addr) if a.strip()]
    if not addrs:
        raise ValueError("no address given")
    if len(addrs) == 1:
        return addrs[0]
    found: list[tuple[list[str], list[str]]] = []  # each address's IPv4 and IPv6 forms
    for one in addrs:
        host, sep, port = one.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"{one!r}: each of several addresses is HOST:PORT")
        ips = _resolve(host.strip("[]"), int(port))
        found.append(([f"{ip}:{port}" for family, ip in ips if family == socket.AF_INET],
                      [f"[{ip}]:{port}" for family, ip in ips if family == socket.AF_INET6]))
    # One family for all (a name that has both, such as localhost, goes with the others).
    if all(v4 for v4, _ in found):
        return "ipv4:" + ",".join(dict.fromkeys(a for v4, _ in found for a in v4))
    if all(v6 for _, v6 in found):
        return "ipv6:" + ",".join(dict.fromkeys(a for _, v6 in found for a in v6))
    raise ValueError(f"{addr!r}: grpc dials several addresses of one family only (IPv4 or IPv6), not both")


def _resolve(host: str, port: int) -> list[tuple[int, str]]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return list(dict.fromkeys((int(family), str(sockaddr[0])) for family, _, _, _, sockaddr in found
                                  if family in (socket.AF_INET, socket.AF_INET6)))
    return [(socket.AF_INET if ip.version == 4 else socket.AF_INET6, str(ip))]
