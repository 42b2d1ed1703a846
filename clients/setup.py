"""Build step of farm-client: generate the ``farm`` protobuf package from the .proto files into the build.

The generated code is never committed (clients/farm/ is git-ignored and made by ``make protos`` for the
dev install), so the wheel makes its own from ``../protos`` (a checkout) or ``protos/`` (an sdist, which
carries a copy). Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_DIRS = (HERE / "protos", HERE.parent / "protos")


def _protos() -> Path:
    for root in PROTO_DIRS:
        if (root / "farm" / "v1").is_dir():
            return root
    raise SystemExit(f"farm-client: no farm/v1/*.proto under {' or '.join(map(str, PROTO_DIRS))}: build it "
                     "from a checkout of the farm repository")


class BuildWithProtos(build_py):
    """build_py, then ``grpc_tools.protoc`` over farm/v1/*.proto into the build directory."""

    def run(self) -> None:
        super().run()
        from grpc_tools import protoc

        root = _protos()
        out = Path(self.build_lib)
        sources = sorted(str(p.relative_to(root)) for p in (root / "farm" / "v1").glob("*.proto"))
        include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
        args = ["grpc_tools.protoc", f"-I{root}", f"-I{include}", f"--python_out={out}",
                f"--grpc_python_out={out}", *sources]
        if protoc.main(args) != 0:
            raise SystemExit(f"farm-client: protoc failed on {sources} in {root}")
        for package in (out / "farm", out / "farm" / "v1"):
            (package / "__init__.py").touch()
        print(f"farm-client: generated farm.v1 from {len(sources)} files in {root}", file=sys.stderr)


class SdistWithProtos(sdist):
    """An sdist carries the .proto files it is built from (they live outside clients/ in a checkout)."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        root = _protos()
        target = Path(base_dir) / "protos"
        if root != target.resolve():
            for package in ("farm", "google"):  # google/rpc/status.proto, google/type/money.proto: imported
                shutil.copytree(root / package, target / package, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithProtos, "sdist": SdistWithProtos})
