"""farmctl for scripts: ``--json`` on every command that prints something to read, errors as JSON
too, addresses without a port, and ``run --wait`` failing fast or failing loudly."""

from __future__ import annotations

import json
import time
from typing import Any

import click
import pytest
from farm_client import FarmClient

from farmd.cli.common import DEFAULT_PORT, grpc_target
from farmd.cli.farmctl import cli
from farmd.errors import ConfigError
from tests.conftest import farmctl

HUMAN_ONLY = {"sandbox demo"}
"""Commands that print only for a person (a demonstration): nothing there for a script to read."""


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # farmctl's own commands are loaded when asked for
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


def error_of(proc: Any) -> dict[str, str]:
    """The one JSON document a failed ``--json`` command printed: ``{"error": {"code", "message"}}``."""
    assert proc.returncode != 0, proc.stdout
    doc = json.loads(proc.stdout)
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}, doc
    return dict(doc["error"])


def test_every_command_a_script_reads_takes_json() -> None:
    commands = _commands(cli)
    assert {"status", "run", "envs", "agents", "trajectories list", "sandbox run"} <= set(commands)
    missing = [name for name, command in commands.items()
               if name not in HUMAN_ONLY and "as_json" not in {p.name for p in command.params}]
    assert not missing, f"no --json on: {missing}"


def test_addresses_without_a_port_mean_farms_port() -> None:
    assert grpc_target("localhost") == f"localhost:{DEFAULT_PORT}" and DEFAULT_PORT == 7431
    assert grpc_target("farm.example") == "farm.example:7431"
    assert grpc_target("10.0.0.7:9000") == "10.0.0.7:9000"
    assert grpc_target("[::1]:9000") == "[::1]:9000"
    assert grpc_target("[::1]") == "[::1]:7431"
    assert grpc_target("::1") == "[::1]:7431"
    assert grpc_target(":7000") == "127.0.0.1:7000", "a listen address's every interface: this host"
    assert grpc_target("dns:///farm.example:7431") == "dns:///farm.example:7431"
    for bad in ("host:http", "host:", "[::1]x", "[::1"):
        with pytest.raises(ConfigError):
            grpc_target(bad)


def test_local_errors_are_json_with_json() -> None:
    # A host alone dials farm's port (nothing listens on this loopback address), not 443.
    down = error_of(farmctl("--addr", "127.0.0.3", "status", "--json", check=False))
    assert down["code"] == "UNAVAILABLE" and "127.0.0.3:7431" in down["message"]
    usage = farmctl("run", "--env", "py-func", "--json", check=False)
    assert usage.returncode == 2 and error_of(usage)["code"] == "USAGE_ERROR"
    assert "--agent" in error_of(usage)["message"]
    bad_addr = farmctl("--addr", "host:http", "envs", "--json", check=False)
    assert bad_addr.returncode == 2 and error_of(bad_addr) == {
        "code": "CONFIG_ERROR", "message": "'host:http': the port must be a number (give HOST or HOST:PORT)"}
    task = farmctl("task", "show", "--env", "nope", "--seed", "1", "--json", check=False)
    assert error_of(task)["code"] == "USAGE_ERROR" and "nope" in error_of(task)["message"]
    boxed = farmctl("sandbox", "run", "--json", "--wall-time", "-1", "--", "true", check=False)
    assert boxed.returncode == 2 and error_of(boxed)["code"] == "USAGE_ERROR"
    # Without --json: a line on stderr for a person, nothing on stdout.
    plain = farmctl("--addr", "127.0.0.3", "status", check=False)
    assert plain.returncode == 1 and not plain.stdout and b"UNAVAILABLE" in plain.stderr


def test_farmd_errors_are_json_and_run_wait_refuses_a_farm_without_workers(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", listen="[::1]:0")
    assert farm.addr.startswith("[::1]:")
    refused = error_of(farm.farmctl("run", "--env", "nope", "--agent", "reference", "--rollouts", "1", "--json",
                                    check=False))
    assert refused["code"] == "INVALID_ARGUMENT" and "nope" in refused["message"]
    started = time.monotonic()
    waited = farm.farmctl("run", "--env", "py-func", "--agent", "reference", "--rollouts", "2", "--wait", "--json",
                          check=False)
    assert time.monotonic() - started < 30, "it fails at once, not when a timeout runs out"
    assert waited.returncode == 1
    assert error_of(waited)["code"] == "FAILED_PRECONDITION" and "no rollout workers" in error_of(waited)["message"]
    said = farm.farmctl("run", "--env", "py-func", "--agent", "reference", "--rollouts", "2", "--wait", check=False)
    assert said.returncode == 1 and b"no rollout workers" in said.stderr and not said.stdout
    with FarmClient(farm.addr) as client:
        assert client.status()["queue"]["queued"] == 0, "nothing was queued for nobody to run"
    queued = json.loads(farm.farmctl("run", "--env", "py-func", "--agent", "reference", "--rollouts", "2",
                                     "--json").stdout)
    assert queued["jobs"] == 2 and queued["state"] == "running", "without --wait a coordinator still queues"
