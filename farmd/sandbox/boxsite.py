"""Install the box's extra packages (numpy) into a directory: ``python -m farmd.sandbox.boxsite DIR``.

The box runs the host's /usr/bin/python3, not farm's virtualenv, so numpy must be
built for that interpreter. When its version matches farm's own Python, farm's
numpy is copied (no download); otherwise pip fetches a wheel for the box's version.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from farmd.sandbox.config import SandboxConfig

_PACKAGES = ("numpy",)


def _box_python_version(python: Path) -> str:
    out = subprocess.run([str(python), "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True, env={})
    return out.stdout.strip()


def install(target: Path, python: Path) -> str:
    import numpy

    box_version = _box_python_version(python)
    own_version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if box_version == own_version:
        site = Path(numpy.__file__).parent.parent
        for entry in site.iterdir():
            if entry.name == "numpy" or entry.name.startswith(("numpy.libs", "numpy-")):
                if entry.is_dir():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, tmp / entry.name)
        how = f"copied numpy {numpy.__version__} (Python {own_version})"
    else:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", box_version, "--target", str(tmp), f"numpy=={numpy.__version__}"],
            check=True,
        )
        how = f"installed numpy {numpy.__version__} for the box's Python {box_version}"
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
