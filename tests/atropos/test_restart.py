"""What a restart costs: atroposlib's own server against farmd's Atropos API, the same calls to each.

Each gets a trainer's registration, an environment's registration and three pushed groups, one of them
cut into a batch already; each is then stopped and started again. Atropos's comes back empty (no
trainer, no queue, step 0); farmd's comes back as it was.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from farm_client import FarmClient

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


def test_every_push_answered_before_a_kill_9_is_there_after_it(tmp_path: Path) -> None:
    """A push is answered once its group and its farm records are committed: farmd killed (SIGKILL) while an
    environment pushes loses no push it answered, neither from Atropos's queue nor from farm's trajectories."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [FARMD, "serve", "--listen", "127.0.0.1:0", "--workers", "0", "--data", str(tmp_path / "farm"),
           "--atropos", f"127.0.0.1:{port}"]
    proc = started(cmd, url)
    httpx.post(url + "/register", json={**REGISTRATION, "batch_size": 4})
    httpx.get(url + "/batch")
    answered: list[int] = []
    refused: list[str] = []

    def push() -> None:
        with httpx.Client(base_url=url, timeout=10) as client:
            for first in range(1000, 1_000_000, 10):
                sent = group(4, first, advantages=[[0.5] * 3] * 4, inference_logprobs=[[1.0, -0.5, -0.25]] * 4)
                try:
                    reply = client.post("/scored_data", json=sent)
                except httpx.TransportError:
                    return
                if reply.status_code != 200:
                    refused.append(reply.text)
                    return
                answered.append(first)

    pusher = threading.Thread(target=push)
    pusher.start()
    deadline = time.monotonic() + 60
    while len(answered) < 20 and pusher.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.kill()  # SIGKILL while the pusher goes on: a push is cut wherever it is
    pusher.join(30)
    proc.wait(30)
    assert len(answered) >= 20 and not refused, refused
    proc = started(cmd, url)
    try:
        queued: list[int] = []
        while batch := httpx.get(url + "/batch").json()["batch"]:
            queued += [g["tokens"][0][0] for g in batch]
        assert set(answered) <= set(queued), f"{sorted(set(answered) - set(queued))} were answered, then lost"
        with FarmClient(json.loads((tmp_path / "farm" / "farmd.json").read_text())["addr"]) as farm:
            stored = farm.trajectories("atropos", limit=1000, full=True)
        firsts = {t.turns[0].prompt_token_ids[0] for t in stored}
        assert set(answered) <= firsts and len(stored) == 4 * len(queued), "each group's four records, once"
    finally:
        stopped(proc)
