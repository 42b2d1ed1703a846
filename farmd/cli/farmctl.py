"""``farmctl``: the operator's command line."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from farmd import __version__
from farmd.cli.common import (
    DEFAULT_PORT,
    EXIT_FAILED,
    EXIT_USAGE,
    CliState,
    emit_json,
    error_kind,
    fail,
    grpc_target,
    wants_json,
)
from farmd.cli.lazy import LazyGroup
from farmd.config import DEFAULT_LISTEN, load, read_token_file
from farmd.errors import ConfigError

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


_COMMANDS = {
    "sandbox": "farmd.cli.sandbox_cmd:sandbox_group", "doctor": "farmd.cli.sandbox_cmd:doctor",
    "status": "farmd.cli.remote_cmd:status", "run": "farmd.cli.remote_cmd:run", "runs": "farmd.cli.remote_cmd:runs_group",
    "trajectories": "farmd.cli.remote_cmd:trajectories_group", "rescore": "farmd.cli.remote_cmd:rescore",
    "export": "farmd.cli.export_cmd:export", "withdrawn": "farmd.cli.export_cmd:withdrawn", "task": "farmd.cli.env_cmd:task_group", "verify": "farmd.cli.env_cmd:verify",
    "audit": "farmd.cli.env_cmd:audit", "envs": "farmd.cli.catalog_cmd:envs", "agents": "farmd.cli.catalog_cmd:agents",
    "token": "farmd.cli.token_cmd:token_group", "submit": "farmd.cli.intake_cmd:submit",
    "submission": "farmd.cli.intake_cmd:submission_group", "review": "farmd.cli.intake_cmd:review_group",
    "quarantine": "farmd.cli.intake_cmd:quarantine", "bounty": "farmd.cli.intake_cmd:bounty_group",
    "contributor": "farmd.cli.intake_cmd:contributor_group", "funnel": "farmd.cli.intake_cmd:funnel",
    "redteam": "farmd.cli.redteam_cmd:redteam", "names": "farmd.cli.names_cmd:names_group",
    "nodes": "farmd.cli.nodes_cmd:nodes_group", "policy": "farmd.cli.policy_cmd:policy_group",
}
"""Each command and where it lives: imported only when it runs."""


@click.group(cls=LazyGroup, lazy=_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="farmctl")
@click.option("--addr", default=None, metavar="HOST[:PORT]",
              help=f"farmd to talk to (default {DEFAULT_LISTEN}; a HOST alone: port {DEFAULT_PORT}; several, "
                   "joined by commas: one farm's coordinators, whichever serves).")
@click.option("--token", default=None, envvar="FARM_TOKEN", help="The token calls carry (or FARM_TOKEN).")
@click.option("--token-file", type=_FILE, envvar="FARM_TOKEN_FILE",
              help="A file holding the token (or FARM_TOKEN_FILE).")
@click.option("--tls-ca", type=_FILE, envvar="FARM_TLS_CA",
              help="Talk TLS, trusting farmd's certificate if this PEM CA signed it (or FARM_TLS_CA).")
@click.option("--tls-cert", type=_FILE, envvar="FARM_TLS_CERT",
              help="A PEM client certificate, for a farmd started with --tls-ca (or FARM_TLS_CERT).")
@click.option("--tls-key", type=_FILE, envvar="FARM_TLS_KEY", help="The key of --tls-cert (or FARM_TLS_KEY).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="farm.toml: [farm], [sandbox], [scheduler] and [endpoints.NAME] settings.")
@click.pass_context
def cli(ctx: click.Context, addr: str | None, token: str | None, token_file: Path | None, tls_ca: Path | None,
        tls_cert: Path | None, tls_key: Path | None, config_path: Path | None) -> None:
    """farm: an RL environment farm. Local commands run here; the rest talk to farmd over gRPC."""
    try:
        # farmd's [[credentials]] are not this client's: its token is --token's or farm.toml's [farm] token.
        config = load(config_path, read_credentials=False)
        target = grpc_target(addr or config.listen)
        token = _token(token, token_file) or config.token
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("a client certificate goes with its key: give --tls-cert and --tls-key together")
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, kind=error_kind(exc))
    ctx.obj = CliState(config=config, addr=target, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)


def _token(token: str | None, token_file: Path | None) -> str | None:
    """The token given, or read from ``token_file``; both given is a usage error."""
    if token_file is None:
        return token
    if token:
        raise ConfigError("give the token once: --token (FARM_TOKEN) or --token-file (FARM_TOKEN_FILE)")
    return read_token_file(token_file)


def main() -> None:
    """Run farmctl; with ``--json``, a bad command line is reported as JSON too."""
    try:
        code = cli.main(prog_name="farmctl", standalone_mode=False)
    except click.UsageError as exc:
        _refuse(exc, "USAGE_ERROR")
    except click.ClickException as exc:
        _refuse(exc, "FAILED")
    except click.Abort:
        fail("interrupted", EXIT_FAILED, kind="INTERRUPTED")
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        # The reader went away (``farmctl ... | head``): nothing left to say, and nowhere to say it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_FAILED)
    sys.exit(code if isinstance(code, int) else 0)


def _refuse(exc: click.ClickException, kind: str) -> NoReturn:
    if wants_json():
        emit_json({"error": {"code": kind, "message": exc.format_message()}})
    else:
        exc.show()
    sys.exit(exc.exit_code)
