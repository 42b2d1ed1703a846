"""farm-client is its own distribution: built from a fresh checkout, it imports and works without farmd."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs first in the child, as on a machine where only some packages are installed: with "only", any
# import outside the standard library and the names given raises; with "without", the names given raise.
# A dotted name allows that subpackage alone (google.protobuf, not the rest of the google namespace).
BLOCKER = """
import sys
class Installed:
    def __init__(self, mode, *names):
        self.only, self.names = mode == "only", names
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if self.only:
            allowed = top in sys.stdlib_module_names or any(
                name == n or name.startswith(n + ".") or n.startswith(name + ".") for n in self.names)
        else:
            allowed = top not in self.names
        if not allowed:
            raise ImportError(f"{name} is not installed here")
        return None
sys.meta_path.insert(0, Installed(*sys.argv[1:]))
"""

# What farm-client declares (grpcio, protobuf, googleapis-common-protos) and what they pull in, and the wheel's own packages.
CLIENT_ONLY = ("only", "farm_client", "farm", "grpc", "google.protobuf", "google.rpc", "google.type",
               "typing_extensions")

WITHOUT_TORCH = """
import json, sys
import farm_client, farm_client.client
from farm.v1 import farm_pb2, trajectory_pb2
from farm_client.convert import from_message
from farm_client.record import Trajectory
from farm_client.sequences import token_rows

message = trajectory_pb2.Trajectory(id=7, group_id=2, reward=1.0, env="e", agent="a")
turn = message.turns.add(prompt_token_ids=[1, 2], token_ids=[3], logprobs=[-0.5], has_logprobs=True)
record = from_message(message, Trajectory)
FarmClient = farm_client.FarmClient
FarmClient("127.0.0.1:1").close()
errors = []
for load in (lambda: __import__("farm_client.tensors"), lambda: farm_client.FarmDataset):
    try:
        load()
    except ImportError as exc:
        errors.append(str(exc))
print(json.dumps({"files": [farm_client.__file__, farm_pb2.__file__], "rows": token_rows(record)[0].input_ids,
                  "errors": errors, "loaded": sorted(m for m in ("farmd", "torch") if m in sys.modules)}))
"""

WITH_TORCH = """
import json
import farm_client.tensors as tensors
from farm_client.record import Trajectory, Turn
t = Trajectory(id=1, group_id=1, env="e", env_version="1", seed=0, difficulty=1, agent="a", policy_version=0,
               reward=1.0, passed=True, status="ok", reasons=[], flags=[], verifier_version="v",
               turns=[Turn(prompt_token_ids=[5, 6], token_ids=[7], logprobs=[-0.25], has_logprobs=True)])
batch = tensors.collate([t])
print(json.dumps({"file": tensors.__file__, "ids": batch.input_ids.tolist(), "mask": batch.loss_mask.tolist()}))
"""


def _child(site: Path, code: str, *installed: str) -> str:
    proc = subprocess.run([sys.executable, "-c", BLOCKER + code, *installed], capture_output=True, text=True,
                          timeout=60, cwd=site, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the checkout holding no generated code (as a fresh clone has none)."""
    tmp = tmp_path_factory.mktemp("client-build")
    clients = tmp / "repo" / "clients"
    clients.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(ROOT / "clients" / name, clients / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "clients" / "farm_client", clients / "farm_client", ignore=ignore)
    shutil.copytree(ROOT / "protos", tmp / "repo" / "protos", ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "--disable-pip-version-check", "-q", str(clients), "-w", str(tmp / "dist")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (built,) = (tmp / "dist").glob("farm_client-*.whl")
    return built


def test_the_wheel_holds_the_client_and_its_protos_and_declares_only_grpc_and_protobufs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        pb2 = zf.read("farm/v1/farm_pb2.py").decode()
        grpc_code = zf.read("farm/v1/farm_pb2_grpc.py").decode()
    assert {"farm_client/tensors.py", "farm_client/py.typed", "farm/v1/trajectory_pb2.py",
            "farm/v1/farm_pb2_grpc.py", "farm/__init__.py", "farm/v1/__init__.py"} <= names
    assert not any(n.startswith("farmd") for n in names)
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
    assert sorted(r.split(";")[0].strip() for r in requires) == [
        "googleapis-common-protos>=1.76.0", "grpcio>=1.85.1", "protobuf<8,>=7.35.1", "torch"]
    assert not any(n.startswith("google/") for n in names), "google.rpc and google.type: googleapis-common-protos'"
    assert 'extra == "torch"' in next(r for r in requires if r.startswith("torch"))
    # The generated code refuses a runtime older than its generator: the floors must be those versions.
    protobuf = re.search(r"Protobuf Python Version: (\S+)", pb2)
    grpc_version = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", grpc_code)
    assert protobuf and grpc_version
    assert f"protobuf<8,>={protobuf.group(1)}" in requires and f"grpcio>={grpc_version.group(1)}" in requires


def test_the_client_imports_from_the_wheel_with_only_grpcio_and_protobufs(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)

    out = json.loads(_child(site, WITHOUT_TORCH, *CLIENT_ONLY))
    assert all(Path(f).is_relative_to(site) for f in out["files"]), out["files"]
    assert out["rows"] == [1, 2, 3] and out["loaded"] == []
    assert len(out["errors"]) == 2 and all("farm-client[torch]" in e for e in out["errors"]), out["errors"]

    # With torch installed (and still no farmd), the tensors come from the wheel's module.
    out = json.loads(_child(site, WITH_TORCH, "without", "farmd"))
    assert Path(out["file"]).is_relative_to(site)
    assert out["ids"] == [[5, 6, 7]] and out["mask"] == [[0.0, 0.0, 1.0]]
