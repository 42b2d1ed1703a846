"""``farmd``: the daemon's command line."""

from __future__ import annotations

import os
from pathlib import Path

import click

from farmd import __version__
from farmd.cli.common import EXIT_USAGE, fail, run_async
from farmd.config import Config, load, read_token_file
from farmd.errors import ConfigError, ForcedStop
from farmd.logs import setup_logging

EXIT_FORCED = 130
"""A second signal: the shell's code for "killed by SIGINT", as Ctrl-C twice is."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="farmd")
def cli() -> None:
    """farmd: one node of a farm."""


@cli.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Data directory (default ./farm-data).")
@click.option("--store", metavar="URL", envvar="FARM_STORE",
              help="The store on a PostgreSQL server, postgresql://USER@HOST/DB (or FARM_STORE); default: SQLite "
                   "in the data directory, which still holds the secret, logs and runfile.")
@click.option("--listen", metavar="HOST:PORT", help="gRPC address (default 127.0.0.1:7431; port 0: any).")
@click.option("--workers", type=click.IntRange(min=0), help="Rollout workers (default: one per core; 0: none).")
@click.option("--token", envvar="FARM_TOKEN", help="Shared secret every call must carry (or FARM_TOKEN); with --join, "
              "the node's credential. Prefer --token-file: a command line is visible to every user.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), envvar="FARM_TOKEN_FILE",
              help="Read --token from this file (or FARM_TOKEN_FILE).")
@click.option("--join", metavar="HOST:PORT[,HOST:PORT...]",
              help="Run the worker role only, for the coordinator at HOST:PORT (several: one farm's coordinators on "
                   "one PostgreSQL store, whichever serves).")
@click.option("--node-name", metavar="NAME", help="This node's name in the fleet (default: the host name).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Serve TLS with this PEM certificate (chain); with --tls-key. With --join: the certificate "
                   "this node shows its coordinator (its common name is the node's name).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The PEM private key of --tls-cert.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Require every caller's client certificate to be signed by this PEM CA (mutual TLS). With "
                   "--join: the CA the coordinator's certificate is checked against.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="farm.toml: [farm], [sandbox], [scheduler], [taskbank], [endpoints.NAME], [tls] and "
              "[[credentials]] settings.")
@click.option("--metrics", "metrics_listen", metavar="HOST:PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any).")
@click.option("--http", "http_listen", metavar="HOST:PORT",
              help="Serve the web console at http://HOST:PORT/ (port 0: any): the farm, trajectories, training and "
                   "intake, under the same credentials and roles as the gRPC API. Off unless given.")
@click.option("--atropos", "atropos_listen", metavar="HOST:PORT",
              help="Serve Atropos's HTTP API (atroposlib 0.4.0's paths and shapes) at http://HOST:PORT/ (port 0: "
                   "any): its environments push scored groups and its trainers take batches, durably. Off unless "
                   "given.")
@click.option("--sandbox-fusion", "sandbox_fusion_listen", metavar="HOST:PORT",
              help="Serve SandboxFusion's HTTP API (/run_code, as its sandbox-fusion client calls it) at "
                   "http://HOST:PORT/ (port 0: any): each call runs in a farm box. Off unless given.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="json: one object per line, for log pipelines.")
def serve(data_dir: Path | None, store: str | None, listen: str | None, workers: int | None, token: str | None,
          token_file: Path | None, join: str | None, node_name: str | None,
          tls_cert: Path | None, tls_key: Path | None, tls_ca: Path | None,
          config_path: Path | None, metrics_listen: str | None, http_listen: str | None, atropos_listen: str | None,
          sandbox_fusion_listen: str | None, log_level: str | None,
          log_format: str | None) -> None:
    """Run this node: the gRPC API and, unless --workers 0, boxes for untrusted code. With --join, the
    worker role only: rollouts for the coordinator at HOST:PORT."""
    try:
        if token_file is not None:
            token = read_token_file(token_file)
        config = load(config_path, data_dir=data_dir, store=store, listen=listen, workers=workers, token=token, join=join,
                      node_name=node_name,
                      tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                      metrics_listen=metrics_listen, http_listen=http_listen, atropos_listen=atropos_listen,
                      sandbox_fusion_listen=sandbox_fusion_listen, log_level=log_level,
                      log_format=log_format)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    setup_logging(config.log_level, config.log_format)
    run_async(_serve(config))


async def _serve(config: Config) -> None:
    from farmd.daemon import serve as serve_forever

    try:
        await serve_forever(config)
    except ForcedStop:
        # Here, inside the loop, not after it: closing the loop would wait for the rollouts, threads
        # and boxes the cut-short shutdown left behind, which a second signal says not to wait for.
        os._exit(EXIT_FORCED)


def main() -> None:
    cli()
