"""A node's name is its credential's: real worker nodes (``farmd serve --join``) under two node credentials. A
node killed mid-run leaves its name and its leases to itself: another credential's node that says hello under
that name is refused for good (exit 5, told whose the name is), and the dead node's leases stay put until it
comes back or is lost, never requeued by an impostor's ``recover``."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
from farm_client import FarmClient

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

TOKENS = {"rack-a": "rack-a-token-0123456789", "rack-b": "rack-b-token-0123456789", "ops": "ops-token-0123456789"}


def config(tmp_path: Path) -> str:
    roles = {"rack-a": "node", "rack-b": "node", "ops": "operator"}
    path = tmp_path / "farm.toml"
    path.write_text("\n".join(f'[[credentials]]\nname = "{name}"\nroles = ["{roles[name]}"]\n'
                              f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
                              for name, token in TOKENS.items()))
    return str(path)


def token_file(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.token"
    path.write_text(TOKENS[name] + "\n")
    path.chmod(0o600)
    return str(path)


def test_another_credentials_node_cannot_take_a_dead_nodes_name(tmp_path: Path, running_farm,  # type: ignore[no-untyped-def]
                                                                 worker_node) -> None:
    farm = running_farm("--workers", "0", "--config", config(tmp_path))
    holder = worker_node(farm.addr, "gpu-1", "--token-file", token_file(tmp_path, "rack-a"), workers=2)
    with FarmClient(farm.addr, token=TOKENS["ops"]) as ops:
        ops.run("py-func", "reference", 40, group_size=4)
        deadline = time.monotonic() + 60
        while not ops.status()["nodes"][0]["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        # Frozen, then killed: it dies holding leases, which stay its own while it is only disconnected.
        os.kill(holder.proc.pid, signal.SIGSTOP)
        holder.stop(sig=signal.SIGKILL)
        while [n["state"] for n in ops.status()["nodes"]] != ["disconnected"] and time.monotonic() < deadline:
            time.sleep(0.1)
        held = ops.status()["queue"]["leased"]
        assert held >= 1 and [n["state"] for n in ops.status()["nodes"]] == ["disconnected"]
        impostor = worker_node(farm.addr, "gpu-1", "--token-file", token_file(tmp_path, "rack-b"), wait=False)
        assert impostor.exited() == 5, impostor.text()[-2000:]
        assert "node name 'gpu-1' belongs to credential 'rack-a', not to credential 'rack-b'" in impostor.text()
        assert "(PERMISSION_DENIED)" in impostor.text()
        assert ops.status()["queue"]["leased"] == held, "the dead node's leases were not requeued by another's recover"
        assert [n["state"] for n in ops.status()["nodes"]] == ["disconnected"]
        # Its own credential's node takes its name back (its restart requeues what it held, as before).
        worker_node(farm.addr, "gpu-1", "--token-file", token_file(tmp_path, "rack-a"))
        assert [(n["name"], n["state"]) for n in ops.status()["nodes"]] == [("gpu-1", "connected")]
    assert "credential 'rack-b' was refused node name 'gpu-1'" in farm.log.read_text()
