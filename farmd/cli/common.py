"""What every command shares: the context object, JSON output and errors, addresses, running coroutines,
exit codes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from farmd.cli.shown import plain
from farmd.config import DEFAULT_LISTEN, Config
from farmd.errors import ConfigError, FarmError, IsolationUnavailable, JoinRefused, PolicyError, SandboxError

T = TypeVar("T")

# Exit codes a script can rely on.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_ISOLATION = 3
EXIT_INFRA = 4
EXIT_REFUSED = 5
"""farmd serve --join: the coordinator refused this node for good (a supervisor should not restart it)."""

DEFAULT_PORT = int(DEFAULT_LISTEN.rpartition(":")[2])
"""What ``--addr HOST`` means: farm's port, not the 443 grpc would assume."""


@dataclass
class CliState:
    config: Config
    addr: str
    token: str | None
    tls_ca: Path | None = None
    """The CA farmd's certificate is checked against: TLS (None: a plain channel, or FARM_TLS_CA's)."""
    tls_cert: Path | None = None
    """A client certificate (and its key) for a farmd that requires one (None: FARM_TLS_CERT's)."""
    tls_key: Path | None = None


def console() -> Console:
    """stdout for people. Untrusted values go in as ``shown.text(...)``, never inside markup."""
    return Console(stderr=False, highlight=False, soft_wrap=True, emoji=False)


def progress_console() -> Console:
    """stderr, where every progress bar and spinner goes: stdout holds only results, which a script may read."""
    return Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def emit_json(value: Any) -> None:
    """One JSON document on stdout, ASCII-only: valid whatever bytes a program printed or named."""
    sys.stdout.write(json.dumps(value, ensure_ascii=True) + "\n")
    sys.stdout.flush()


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: what the command prints, as JSON; and if it fails, ``{"error": {"code", "message"}}``."""
    return click.option("--json", "as_json", is_flag=True,
                        help='Print JSON; on failure {"error": {"code": ..., "message": ...}}.')(f)


def wants_json() -> bool:
    """Whether the command running was given ``--json`` (so its errors are JSON too)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if "as_json" in ctx.params:
            return bool(ctx.params["as_json"])
        ctx = ctx.parent
    # The command's options are not parsed (one of them is the error): read the command line as given,
    # up to ``--``, after which the words are a boxed program's.
    args = sys.argv[1:]
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def error_kind(exc: BaseException) -> str:
    """A farm error's class, as a script reads it next to gRPC's codes: ConfigError -> CONFIG_ERROR."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(exc).__name__).upper()


def fail(message: str, code: int, *, kind: str = "FAILED") -> NoReturn:
    """Report a failure and exit with ``code``: with ``--json``, ``{"error": {"code": kind, "message"}}`` on
    stdout; else ``message`` on stderr, escaped (it may quote a server's details or a client's names)."""
    if wants_json():
        emit_json({"error": {"code": kind, "message": message}})
    else:
        click.echo(f"error: {plain(message, inline=False)}", err=True)
    sys.exit(code)


def grpc_target(addr: str) -> str:
    """``addr`` as grpc should dial it: a host without a port gets farm's (``DEFAULT_PORT``).

    ``host:port``, ``[v6]:port`` and grpc's own target forms (``dns:///...``, ``unix:...``) pass
    unchanged; a bare IPv6 address is bracketed. Several, joined by commas (one farm's coordinators), each so.
    """
    if "," in addr and not addr.startswith(("unix:", "unix-abstract:", "vsock:", "dns:", "ipv4:", "ipv6:")):
        return ",".join(grpc_target(one.strip()) for one in addr.split(",") if one.strip())
    if addr.startswith(("unix:", "unix-abstract:", "vsock:", "dns:", "ipv4:", "ipv6:")):
        return addr
    if "://" in addr:  # a URL's scheme would be dialled as part of a host name, and fail as a DNS lookup
        raise ConfigError(f"{addr!r}: give HOST[:PORT] (for example 127.0.0.1:{DEFAULT_PORT}), not a URL: farmd "
                          "speaks gRPC on its port, and TLS is --tls-ca CA.pem, not https://")
    if addr.startswith("["):
        host, bracket, rest = addr.partition("]")
        if not bracket:
            raise ConfigError(f"{addr!r}: an IPv6 address is written [ADDR] or [ADDR]:PORT")
        if not rest:
            return f"{addr}:{DEFAULT_PORT}"
        if not (rest.startswith(":") and rest[1:].isdigit()):
            raise ConfigError(f"{addr!r}: expected [ADDR]:PORT")
        return addr
    if addr.count(":") > 1:  # an IPv6 address without brackets cannot carry a port
        return f"[{addr}]:{DEFAULT_PORT}"
    host, colon, port = addr.partition(":")
    if colon and not port.isdigit():
        raise ConfigError(f"{addr!r}: the port must be a number (give HOST or HOST:PORT)")
    # No host is how a listen address says every interface (farm.toml's listen = ":7431"): this one.
    return f"{host or '127.0.0.1'}:{port or DEFAULT_PORT}"


async def _cancel_on_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """SIGTERM cancels the work like Ctrl-C does, so every box is torn down on the way out."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await coro
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop, turning farm's errors into a message and an exit code."""
    import uvloop

    try:
        return uvloop.run(_cancel_on_sigterm(coro))
    except (asyncio.CancelledError, KeyboardInterrupt):
        fail("stopped by a signal; everything it started has been cleaned up", 128 + signal.SIGTERM,
             kind="INTERRUPTED")
    except IsolationUnavailable as exc:
        fail(str(exc), EXIT_NO_ISOLATION, kind=error_kind(exc))
    except JoinRefused as exc:
        fail(str(exc), EXIT_REFUSED, kind=error_kind(exc))
    except (PolicyError, ConfigError) as exc:
        fail(str(exc), EXIT_USAGE, kind=error_kind(exc))
    except SandboxError as exc:
        fail(f"the sandbox failed (an infrastructure failure, not the program's): {exc}", EXIT_INFRA,
             kind=error_kind(exc))
    except FarmError as exc:
        fail(str(exc), EXIT_FAILED, kind=error_kind(exc))
