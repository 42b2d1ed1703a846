"""A network namespace joined to the host by a veth pair, for multi-node tests.

A farmd worker started on the host's loopback would hide every bug that only shows up across
machines (addresses bound to 127.0.0.1, advertised addresses nobody else can dial). Started
through :meth:`Netns.wrap`, it sees only its own ``lo`` and one veth, and reaches the host (the
coordinator) at :attr:`Netns.host_ip`, a non-loopback address.

The host is shared: another farm or another test run may be creating namespaces at the same
time. Names are random, subnets are random and checked against every address and route in use,
and teardown deletes only what this helper created.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

NETNS_DIR = "/run/netns"
"""Where iproute2 keeps named namespaces (its NETNS_RUN_DIR): one nsfs bind mount per name.

Upstream's default is /var/run/netns, Debian builds with /run/netns; /var/run is a symlink to
/run on every current distribution, so both name the same directory."""

# Ranges rarely routed anywhere, in order: 10.200/13, then the benchmarking range (RFC 2544) for
# hosts that route all of the first (a VPN or cloud route covering 10/8). Only /30s are carved
# out: one address for each end.
_POOLS = (ipaddress.IPv4Network("10.200.0.0/13"), ipaddress.IPv4Network("198.18.0.0/15"))
_ATTEMPTS = 16
_IP_TIMEOUT_S = 10.0


class NetnsError(RuntimeError):
    """A namespace could not be set up, or teardown left something behind."""


@functools.cache
def _tool(name: str) -> str:
    """Absolute path of a system tool: a non-root PATH often lacks /usr/sbin, where ``ip`` lives."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        raise NetnsError(f"no `{name}` on PATH or in /usr/sbin, /sbin, /usr/bin, /bin")
    return found


@dataclass(frozen=True)
class Netns:
    """One namespace from :func:`veth_netns`: what a test needs to start a process inside and dial it."""

    name: str
    """The namespace's name under /run/netns, e.g. ``farmt-3f9a1c``."""
    host_ip: str
    """The host end of the veth: what a process inside dials to reach the host."""
    ns_ip: str
    """The namespace end: where the host sees connections from inside come from."""
    host_if: str
    """The veth's host end (``fth-<hex>``); deleting it deletes both ends."""
    ns_if: str
    """The veth's end inside the namespace (``ftn-<hex>``)."""

    @property
    def path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this namespace: only its network changes.

        Not ``ip netns exec``: that also unshares the mount namespace and mounts a fresh sysfs
        over /sys, and the mounts under it go with the old one. /sys/fs/cgroup disappears, and
        farm's sandbox, which bounds each box with cgroups, refuses to start any box in a worker
        run that way. ``nsenter --net`` joins the network namespace and nothing else; the price
        is that /sys/class/net still lists the host's interfaces (netlink, ``ip`` and the socket
        API all see the namespace's own).
        """
        return [_tool("nsenter"), f"--net={self.path}", "--", *argv]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([_tool("ip"), *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = _ip("-j", *args).stdout.strip()
    # Some subcommands (`netns list` with no namespaces) print nothing at all rather than [].
    return json.loads(out) if out else []


def _networks_in_use(skip_if: str | None = None) -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address in or a route to, on any interface but ``skip_if``."""
    nets: list[ipaddress.IPv4Network] = []
    for link in _ip_json("-4", "addr", "show"):
        if link.get("ifname") == skip_if:
            continue
        for addr in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                nets.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "default")
        # A default route overlaps everything and conflicts with nothing: more specific routes win.
        if dst == "default" or route.get("dev") == skip_if:
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(dst, strict=False))
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    in_use = _networks_in_use()
    for pool in _POOLS:
        for _ in range(_ATTEMPTS):
            candidate = ipaddress.IPv4Network(
                (int(pool.network_address) + 4 * secrets.randbelow(pool.num_addresses // 4), 30))
            if not any(candidate.overlaps(net) for net in in_use):
                return candidate
    raise NetnsError(f"no free /30 found in {', '.join(map(str, _POOLS))} ({_ATTEMPTS} tries each)")


def _link_exists(ifname: str) -> bool:
    try:
        socket.if_nametoindex(ifname)
    except OSError:
        return False
    return True


def _delete_name(ns: Netns) -> None:
    if os.path.lexists(ns.path):
        _ip("netns", "del", ns.name, check=False)


def _teardown(ns: Netns) -> list[str]:
    """Delete the veth pair and the namespace's name; what could not be deleted, described.

    Safe to call again: whatever is already gone is skipped. Only for a ``Netns`` whose veth
    this helper created: it deletes whatever link is called ``host_if``.
    """
    # Host end first, and always: it takes the peer with it. `ip netns del` only unmounts and
    # unlinks the name; a process still running inside keeps the namespace alive, and with it
    # the veth pair (host end included) until that process exits. Processes inside are not
    # ours to kill: they belong to whoever started them through wrap().
    if _link_exists(ns.host_if):
        _ip("link", "del", ns.host_if, check=False)
    _delete_name(ns)
    left = []
    if _link_exists(ns.host_if):
        left.append(f"interface {ns.host_if}")
    if os.path.lexists(ns.path):
        left.append(f"namespace {ns.path}")
    return left


def _setup_once(token: str, subnet: ipaddress.IPv4Network) -> Netns | None:
    """One try with one name and one subnet; None when another run got there first."""
    host_addr, ns_addr = subnet.hosts()
    ns = Netns(name=f"farmt-{token}", host_ip=str(host_addr), ns_ip=str(ns_addr),
               host_if=f"fth-{token}", ns_if=f"ftn-{token}")
    # `ip netns add` creates NETNS_DIR if missing and, the first time, bind-mounts it onto
    # itself with shared propagation so the per-name nsfs mounts reach every mount namespace
    # (that mount stays after the last name is gone; it is harmless). A test process inside a
    # private mount namespace would create names nobody else can see, which is fine here.
    # The name file is created O_EXCL: two runs picking the same name cannot both succeed.
    added = _ip("netns", "add", ns.name, check=False)
    if added.returncode != 0:
        if "File exists" in added.stderr:
            return None
        raise NetnsError(f"ip netns add {ns.name} exited {added.returncode}: {added.stderr.strip()}")
    try:
        # The peer is created straight inside the namespace, so its name never has to be free
        # on the host. Interface names are at most 15 bytes (IFNAMSIZ - 1): one more and the
        # kernel answers only "Attribute failed policy validation".
        link = _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if, "netns", ns.name,
                   check=False)
    except BaseException:
        _delete_name(ns)
        raise
    if link.returncode != 0:
        # Only the name is ours: an existing link called host_if belongs to someone else.
        _delete_name(ns)
        if "File exists" in link.stderr:
            return None
        raise NetnsError(f"ip link add {ns.host_if} exited {link.returncode}: {link.stderr.strip()}")
    try:
        _ip("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
        _ip("-n", ns.name, "addr", "add", f"{ns.ns_ip}/30", "dev", ns.ns_if)
        # lo first: a worker inside binds its own listeners on 127.0.0.1. No default route: the
        # namespace only ever talks to host_ip, which the /30 puts on-link.
        _ip("-n", ns.name, "link", "set", "lo", "up")
        _ip("-n", ns.name, "link", "set", ns.ns_if, "up")
        _ip("link", "set", ns.host_if, "up")
        # Picking the subnet and adding it is not atomic: a concurrent run may have added the
        # same /30 in between (the kernel accepts overlapping addresses on different links).
        if any(subnet.overlaps(net) for net in _networks_in_use(skip_if=ns.host_if)):
            _teardown(ns)
            return None
    except BaseException:
        _teardown(ns)
        raise
    return ns


def _setup() -> Netns:
    for _ in range(_ATTEMPTS):
        ns = _setup_once(secrets.token_hex(3), _pick_subnet())
        if ns is not None:
            return ns
    raise NetnsError(f"every name or subnet tried was taken ({_ATTEMPTS} tries)")


@contextlib.contextmanager
def veth_netns() -> Iterator[Netns]:
    """A fresh namespace joined to the host by a veth pair, deleted on exit (also when the body raises).

    Teardown that leaves something behind raises :class:`NetnsError` after a clean body, and
    adds a note to the body's own exception otherwise (a leak must not hide the real failure).
    """
    ns = _setup()
    try:
        yield ns
    except BaseException as exc:
        left = _teardown(ns)
        if left:
            exc.add_note(f"veth_netns teardown left behind: {', '.join(left)}")
        raise
    left = _teardown(ns)
    if left:
        raise NetnsError(f"veth_netns teardown left behind: {', '.join(left)}")


@functools.cache
def netns_unavailable() -> str | None:
    """Why this host cannot give a test its own network namespace, or None when it can.

    Tried for real once per process (about 50 ms): root with ``ip`` installed can still be
    refused inside a container that lacks CAP_SYS_ADMIN or a writable /run.
    """
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    try:
        _tool("ip")
        _tool("nsenter")
        with veth_netns():
            pass
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace joined by a veth pair: {exc}"
    return None
