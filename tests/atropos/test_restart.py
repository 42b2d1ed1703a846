"""What a restart costs: atroposlib's own server against farmd's Atropos API, the same calls to each.

Each gets a trainer's registration, an environment's registration and three pushed groups, one of them
cut into a batch already; each is then stopped and started again. Atropos's comes back empty (no
trainer, no queue, step 0); farmd's comes back as it was.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.api.test_atropos import REGISTRATION, group
from tests.conftest import FARMD

pytestmark = [pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def started(cmd: list[str], url: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{cmd[0]} exited {proc.returncode}"
        try:
            if httpx.get(url + "/info").status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{cmd} did not answer within 60 s")


def stopped(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(30)


def fill(url: str) -> dict[str, object]:
    httpx.post(url + "/register", json={**REGISTRATION, "batch_size": 4})
    httpx.get(url + "/batch")  # the trainer has started: environments may register
    httpx.post(url + "/register-env", json={"max_token_length": 64, "desired_name": "e", "weight": 1.0,
                                            "group_size": 4})
    for first in (100, 200, 300):
        httpx.post(url + "/scored_data", json=group(4, first, env_id=0))
    httpx.get(url + "/batch")
    return {path: httpx.get(url + path).json() for path in ("/status", "/info", "/wandb_info")}


def test_atropos_loses_its_queue_on_a_restart_and_farmd_keeps_it(tmp_path: Path) -> None:
    pytest.importorskip("atroposlib", reason="atroposlib==0.4.0 comes with the dev extra (make setup)")
    port = free_port()
    atropos = [sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)]
    farm = [FARMD, "serve", "--listen", "127.0.0.1:0", "--workers", "0", "--data", str(tmp_path / "farm"),
            "--atropos", f"127.0.0.1:{port}"]
    before, after = {}, {}
    for name, cmd in (("atropos", atropos), ("farmd", farm)):
        url = f"http://127.0.0.1:{port}"
        proc = started(cmd, url)
        before[name] = fill(url)
        stopped(proc)
        proc = started(cmd, url)
        after[name] = {path: httpx.get(url + path).json() for path in ("/status", "/info", "/wandb_info")}
        after[name]["/batch"] = httpx.get(url + "/batch").json()
        stopped(proc)

    assert before["atropos"] == before["farmd"], "the same calls get the same answers"
    assert before["farmd"]["/status"] == {"current_step": 3, "queue_size": 0}
    lost = after["atropos"]
    assert lost["/status"] == {"current_step": 0, "queue_size": 0} and lost["/info"]["batch_size"] == -1
    assert lost["/batch"]["batch"] == [], "Atropos forgot its trainer and the two batches it had cut"
    kept = after["farmd"]
    assert kept["/status"] == before["farmd"]["/status"] and kept["/info"] == before["farmd"]["/info"]
    assert [g["tokens"][0][0] for g in kept["/batch"]["batch"]] == [200], "the next batch it had cut"
