"""An operator's own verifiers environments, served as ``vf:NAME`` (farm.toml's ``[verifiers]``: NAME = path).

The directory holds a verifiers package (``read_verifiers_package``: a module defining ``load_environment``,
or a manifest saying ``form = "verifiers"``). It is served as an approved contributed version is
(``ContributedEnvironment``): its ``load_environment``, dataset, parser and reward functions run only in
boxes, one fresh box a call, never in farmd. What the operator skips is intake's review, not the boxes: the
operator vouches for the package, the box still holds it.
"""

from __future__ import annotations

from pathlib import Path

from farmd.envs.catalog import VERIFIERS_PREFIX
from farmd.intake.package import read_verifiers_package
from farmd.intake.served import ContributedEnvironment


def local_environment(name: str, path: Path) -> ContributedEnvironment:
    """The verifiers package at ``path`` as ``vf:NAME``. Blocking (reads files): call it in a thread.
    Raises ``PackageError`` saying what to fix."""
    return ContributedEnvironment(read_verifiers_package(path, name), name=f"{VERIFIERS_PREFIX}{name}")
