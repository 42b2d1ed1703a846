"""``farmctl``: the operator's command line."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from farmd import __version__
from farmd.cli.catalog_cmd import agents, envs
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
from farmd.cli.env_cmd import audit, task_group, verify
from farmd.cli.export_cmd import export
from farmd.cli.intake_cmd import (
    bounty_group,
    contributor_group,
    funnel,
    quarantine,
    review_group,
    submission_group,
    submit,
)
from farmd.cli.redteam_cmd import redteam
from farmd.cli.remote_cmd import rescore, run, runs_group, status, trajectories_group
from farmd.cli.sandbox_cmd import doctor, sandbox_group
from farmd.cli.token_cmd import token_group
from farmd.config import DEFAULT_LISTEN, load, read_token_file
from farmd.errors import ConfigError

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="farmctl")
@click.option("--addr", default=None, metavar="HOST[:PORT]",
              help=f"farmd to talk to (default {DEFAULT_LISTEN}; a HOST alone: port {DEFAULT_PORT}).")
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


cli.add_command(sandbox_group)
cli.add_command(doctor)
cli.add_command(status)
cli.add_command(run)
cli.add_command(runs_group)
cli.add_command(trajectories_group)
cli.add_command(export)
cli.add_command(rescore)
cli.add_command(task_group)
cli.add_command(verify)
cli.add_command(audit)
cli.add_command(envs)
cli.add_command(agents)
cli.add_command(token_group)
cli.add_command(submit)
cli.add_command(submission_group)
cli.add_command(review_group)
cli.add_command(quarantine)
cli.add_command(bounty_group)
cli.add_command(contributor_group)
cli.add_command(funnel)
cli.add_command(redteam)


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
