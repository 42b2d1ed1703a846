"""``farmctl token new``: a fresh token and the ``[[credentials]]`` stanza that lets it in.

farmd keeps only a token's sha256, so the token is shown (or written to ``--out``) once, here, and
the stanza an operator pastes into farm.toml holds the hash alone.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import click

from farmd.cli.common import EXIT_USAGE, emit_json, error_kind, fail, json_option
from farmd.config import ROLES, Credential
from farmd.errors import ConfigError
from farmd.private import FILE_MODE


@click.group("token")
def token_group() -> None:
    """Tokens for farm.toml's [[credentials]]."""


@token_group.command("new")
@click.option("--name", required=True, help="The credential's name: what logs and refusals show.")
@click.option("--role", "roles", required=True, multiple=True, type=click.Choice(sorted(ROLES)),
              help=f"A role it holds (repeat for several): {', '.join(sorted(ROLES))}.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the token to this new file (mode 0600) instead of printing it.")
@json_option
def new(name: str, roles: tuple[str, ...], out: Path | None, as_json: bool) -> None:
    """Make a token; print the [[credentials]] stanza for farm.toml on stdout (so `>> farm.toml` appends it), and
    the token on stderr, or write it to --out."""
    token = secrets.token_urlsafe(32)
    try:
        credential = Credential.from_token(name, frozenset(roles), token)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, kind=error_kind(exc))
    if out is not None:
        _write_new(out, token)
    stanza = toml_stanza(credential)
    if as_json:
        shown: dict[str, Any] = {"name": credential.name, "roles": sorted(credential.roles),
                                 "token_sha256": credential.token_sha256, "toml": stanza}
        emit_json({**shown, "out": str(out)} if out is not None else {**shown, "token": token})
        return
    # The stanza alone on stdout, so `farmctl token new ... >> farm.toml` appends exactly it; what a person reads
    # (the token itself, when not written to --out) on stderr, where a terminal still shows it.
    where = f"token written to {out} (mode 0600)" if out is not None else f"token: {token}"
    click.echo(f"{where}\nfor farm.toml (farmd keeps only the token's sha256), on stdout:", err=True)
    click.echo(stanza, nl=False)


def toml_stanza(credential: Credential) -> str:
    """The ``[[credentials]]`` table for ``credential``: name, roles and the token's sha256."""
    roles = ", ".join(json.dumps(r) for r in sorted(credential.roles))
    return (f"[[credentials]]\nname = {json.dumps(credential.name)}\nroles = [{roles}]\n"
            f"token_sha256 = \"{credential.token_sha256}\"\n")


def _write_new(path: Path, token: str) -> None:
    """``token`` into ``path``, which must not exist: replacing a token file would lock its holder out."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        fail(f"cannot write the token to {path}: {exc.strerror}", EXIT_USAGE, kind="FAILED")
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
