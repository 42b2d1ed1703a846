"""Install the box's extra packages into a directory: ``python -m farmd.sandbox.boxsite DIR``.

The box runs the host's /usr/bin/python3, not farm's virtualenv, so what it imports must be
built for that interpreter. numpy is there for agent code; ``verifiers`` (and everything it
needs) for verifiers environments, whose ``load_environment``, parser and reward functions run
in boxes (``farmd.intake.env_runner``), never in farmd. When the box's Python version matches
farm's own, farm's installed copies are linked (no download); otherwise pip fetches wheels for
the box's version.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from farmd.sandbox.config import SandboxConfig
from farmd.sandbox.runtime import SITE_STAMP

_PACKAGES = ("numpy",)
_WITH_DEPENDENCIES = ("verifiers",)
"""Installed with their whole dependency closure (as the venv resolved it) under ``DIR/site-packages``: a
verifiers environment's module imports ``verifiers``, which imports ``datasets``, ``openai``, ``pydantic``...
The directory is named so because dill (which ``datasets`` fingerprints every dataset with) tells a library's
modules from the user's by a path holding "site-packages": elsewhere it pickles pyarrow's types by value and
``Dataset.from_list`` fails."""
LIBRARIES = "site-packages"


def _box_python_version(python: Path) -> str:
    out = subprocess.run([str(python), "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True, env={})
    return out.stdout.strip()


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``roots`` need, by normalised name: their requirements without extras,
    whose markers hold here, followed through what is installed."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment: dict[str, str] = {**{k: str(v) for k, v in default_environment().items()}, "extra": ""}
    found: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if _key(name) in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[_key(name)] = dist
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate(environment):
                todo.append(req.name)
    return found


def _entries(dist: metadata.Distribution) -> set[str]:
    """The top-level names a distribution installed into site-packages (its modules, its .dist-info)."""
    tops = set()
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(".pth"):
            tops.add(parts[0])
    return tops


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def install(target: Path, python: Path) -> str:
    import numpy

    box_version = _box_python_version(python)
    own_version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    wanted = {"": closure(_PACKAGES), LIBRARIES: closure(_WITH_DEPENDENCIES)}
    if box_version == own_version:
        site = Path(numpy.__file__).parent.parent
        for sub, dists in wanted.items():
            (tmp / sub).mkdir(exist_ok=True)
            for dist in dists.values():
                for entry in sorted(_entries(dist)):
                    src, dst = site / entry, tmp / sub / entry
                    if not src.exists() or dst.exists():
                        continue
                    if src.is_dir():  # hard links: the closure is a few hundred MB, and read-only in the box
                        shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
                    else:
                        _link_or_copy(str(src), str(dst))
        how = f"linked numpy {numpy.__version__}, and {len(wanted[LIBRARIES])} distributions for " \
              f"{', '.join(_WITH_DEPENDENCIES)} under {LIBRARIES}/ (Python {own_version})"
    else:
        for sub, dists in wanted.items():
            pins = sorted(f"{dist.metadata['Name']}=={dist.version}" for dist in dists.values())
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                 "--python-version", box_version, "--target", str(tmp / sub), *pins],
                check=True,
            )
        how = f"installed numpy and {len(wanted[LIBRARIES])} distributions for the box's Python {box_version}"
    # A new value each build: the sandbox names the runtime it copies this site into by it (runtime.SITE_STAMP).
    (tmp / SITE_STAMP).write_text(f"{secrets.token_hex(16)}\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return how


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target", type=Path)
    parser.add_argument("--python", type=Path, default=SandboxConfig().box_python)
    args = parser.parse_args()
    if not args.python.exists():
        sys.exit(f"{args.python} does not exist: boxes need a system Python (apt-get install python3)")
    print(f"box-site: {install(args.target, args.python)} into {args.target}")


if __name__ == "__main__":
    main()
