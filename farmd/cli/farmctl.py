"""``farmctl``: the operator's command line."""

from __future__ import annotations

from pathlib import Path

import click

from farmd import __version__
from farmd.cli.common import EXIT_USAGE, CliState, fail
from farmd.cli.env_cmd import audit, task_group, verify
from farmd.cli.remote_cmd import export, rescore, run, status, trajectories_group
from farmd.cli.sandbox_cmd import doctor, sandbox_group
from farmd.config import DEFAULT_LISTEN, load
from farmd.errors import ConfigError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="farmctl")
@click.option("--addr", default=None, metavar="HOST:PORT", help=f"farmd to talk to (default {DEFAULT_LISTEN}).")
@click.option("--token", default=None, envvar="FARM_TOKEN", help="Shared secret (or FARM_TOKEN).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="farm.toml: [farm], [sandbox], [scheduler] and [endpoints.NAME] settings.")
@click.pass_context
def cli(ctx: click.Context, addr: str | None, token: str | None, config_path: Path | None) -> None:
    """farm: an RL environment farm. Local commands run here; the rest talk to farmd over gRPC."""
    try:
        config = load(config_path, token=token)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    ctx.obj = CliState(config=config, addr=addr or config.listen, token=config.token)


cli.add_command(sandbox_group)
cli.add_command(doctor)
cli.add_command(status)
cli.add_command(run)
cli.add_command(trajectories_group)
cli.add_command(export)
cli.add_command(rescore)
cli.add_command(task_group)
cli.add_command(verify)
cli.add_command(audit)


def main() -> None:
    cli()
