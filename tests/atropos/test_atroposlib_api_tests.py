"""atroposlib's own API tests, run from the installed package (0.4.0, the dev extra), against farmd.

They launch their server as ``python -m atroposlib.cli.run_api --host localhost --port 8000`` and call
``http://localhost:8000``. Two things change, neither in atroposlib: that launch starts ``farmd serve
--atropos localhost:8000`` instead (``shim/sitecustomize.py``, on PYTHONPATH), and the whole run is in a
network namespace of its own, so the port they insist on is free whatever else this host runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FARMD

pytestmark = [pytest.mark.slow]

SUITES = ("atroposlib.tests.test_api_legacy", "atroposlib.tests.test_api_messages_handling")


def test_atroposlib_api_tests_pass_against_farmd(tmp_path: Path) -> None:
    pytest.importorskip("atroposlib", reason="atroposlib==0.4.0 comes with the dev extra (make setup)")
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.fail("atroposlib's tests insist on localhost:8000: they run in a network namespace of their own, "
                    "which needs root, unshare and ip")
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")  # atroposlib's tests under their own defaults, not farm's (warnings as errors)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).with_name("shim")), "FARM_ATROPOS_DATA": str(tmp_path),
           "FARM_ATROPOS_FARMD": FARMD}
    run = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, "-m", "pytest",
         "-q", "-p", "no:cacheprovider", "-c", str(ini), "--rootdir", str(tmp_path), "--pyargs", *SUITES],
        cwd=tmp_path, env=env, capture_output=True, timeout=600)
    out = run.stdout.decode(errors="replace")
    assert run.returncode == 0, out[-6000:] + run.stderr.decode(errors="replace")[-2000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) == 29 and " failed" not in out and " skipped" not in out, out[-2000:]
    assert any(p.name.startswith("farmd-") for p in tmp_path.iterdir()), "the servers they launched were farmd"
