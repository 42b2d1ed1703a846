"""farm_trainer's command line as a user of farmctl and of TRL expects it: TLS from flags, and the metrics in
TensorBoard beside their JSON lines (``--report-to``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from farm_trainer.metrics import MetricsLog, report_to
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.tlsutil import make_pki

TOKEN = "trainer-tls-token"


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard reads from ``log_dir``: tag -> [(step, value)]."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_each_number_of_a_record_is_a_tensorboard_scalar_at_its_learner_step(tmp_path: Path) -> None:
    with MetricsLog(tmp_path / "metrics.jsonl", ("tensorboard",)) as metrics:
        metrics.write("step", learner_step=3, loss=0.5, pass_rate_by_level={1: 0.25, 2: None}, up_to=7,
                      reached=True, note="words are not scalars")
        metrics.write("step", learner_step=4, loss=0.25, pass_rate_by_level={1: 0.5}, up_to=9)
        metrics.write("eval", learner_step=4, env="arith:heldout", pass_rate=0.75, final=False)
    seen = scalars(tmp_path / "runs")
    assert seen["step/loss"] == [(3, 0.5), (4, 0.25)]
    assert seen["step/pass_rate_by_level/1"] == [(3, 0.25), (4, 0.5)]
    assert seen["eval/arith:heldout/pass_rate"] == [(4, 0.75)]
    assert not any(tag.endswith(("/reached", "/note", "/final", "/time")) for tag in seen), sorted(seen)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["step", "step", "eval"], "the JSON lines are written all the same"


def test_report_to_takes_trls_names() -> None:
    wandb = importlib.util.find_spec("wandb") is not None
    assert report_to("all") == (("tensorboard", "wandb") if wandb else ("tensorboard",))
    assert report_to("none") == report_to("") == ()
    assert report_to("tensorboard, tensorboard") == ("tensorboard",)
    with pytest.raises(ValueError, match="not comet"):
        report_to("tensorboard,comet")
    if not wandb:
        with pytest.raises(ValueError, match="pip install wandb"):
            report_to("wandb")


def trainer(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_trainer", *args], capture_output=True, text=True,
                          timeout=100, env=env, cwd=cwd)


def test_the_trainer_talks_tls_from_its_flags_as_farmctl_does(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    pki = make_pki(tmp_path / "pki")
    farm = running_farm("--workers", "1", "--token", TOKEN, "--tls-cert", str(pki.server_cert),
                        "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    common = ["--addr", farm.addr, "--token-file", str(token_file), "--minutes", "0", "--warmup-target", "0",
              "--eval-seeds", "1", "--json"]

    half = trainer(*common, "--dir", str(tmp_path / "half"), "--tls-ca", str(pki.ca), "--tls-cert",
                   str(pki.client_cert), env=env, cwd=tmp_path)
    assert half.returncode == 2 and "--tls-cert and --tls-key together" in half.stderr, half.stderr

    stranger = trainer(*common, "--dir", str(tmp_path / "stranger"), "--tls-ca", str(pki.ca), env=env, cwd=tmp_path)
    assert stranger.returncode == 1 and "UNAVAILABLE" in stranger.stderr, "no client certificate, no farm"

    done = trainer(*common, "--dir", str(tmp_path / "run"), "--tls-ca", str(pki.ca), "--tls-cert",
                   str(pki.client_cert), "--tls-key", str(pki.client_key), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["policy_version"] >= 1 and summary["last_eval"] is not None
    seen = scalars(tmp_path / "run" / "runs")
    assert "eval/arith:heldout/pass_rate" in seen and "warmup/accuracy" in seen, sorted(seen)
