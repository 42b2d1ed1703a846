"""What every command shares: the context object, JSON output, running coroutines, exit codes."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from farmd.cli.shown import plain
from farmd.config import Config
from farmd.errors import ConfigError, FarmError, IsolationUnavailable, PolicyError, SandboxError

T = TypeVar("T")

# Exit codes a script can rely on.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_ISOLATION = 3
EXIT_INFRA = 4


@dataclass
class CliState:
    config: Config
    addr: str
    token: str | None


def console() -> Console:
    """stdout for people. Untrusted values go in as ``shown.text(...)``, never inside markup."""
    return Console(stderr=False, highlight=False, soft_wrap=True, emoji=False)


def emit_json(value: Any) -> None:
    """One JSON document on stdout, ASCII-only: valid whatever bytes a program printed or named."""
    sys.stdout.write(json.dumps(value, ensure_ascii=True) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int) -> NoReturn:
    """Print ``message`` (escaped: it may quote a server's details or a client's names) and exit."""
    click.echo(f"error: {plain(message, inline=False)}", err=True)
    sys.exit(code)


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
        fail("stopped by a signal; everything it started has been cleaned up", 128 + signal.SIGTERM)
    except IsolationUnavailable as exc:
        fail(str(exc), EXIT_NO_ISOLATION)
    except (PolicyError, ConfigError) as exc:
        fail(str(exc), EXIT_USAGE)
    except SandboxError as exc:
        fail(f"the sandbox failed (an infrastructure failure, not the program's): {exc}", EXIT_INFRA)
    except FarmError as exc:
        fail(str(exc), EXIT_FAILED)
