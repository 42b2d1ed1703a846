"""Intake through a real farmd, each person with their own credential and farmctl: a bounty is posted and
claimed, the example is submitted and checked, it waits in the review queue, a reviewer approves it,
rollouts run on it like on any environment, and a quarantine later withdraws them from a trainer's
stream, telling it which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from farm_client import FarmClient

from tests.conftest import RunningFarm
from tests.intake.contrib_example import EXAMPLE
from tests.intake.farm_config import intake_farm_toml

pytestmark = [pytest.mark.sandbox]

TOKENS = {"op": "op-token", "ada": "ada-token", "rita": "rita-token", "trainer": "trainer-token"}
ROLES = {"op": "operator", "ada": "contributor", "rita": "reviewer", "trainer": "trainer"}
ENV = "contrib:word-count@1.0.0"


def farm_toml(tmp_path: Path) -> Path:
    return intake_farm_toml(tmp_path / "farm.toml", TOKENS, ROLES)


def as_(farm: RunningFarm, who: str, *args: str, check: bool = True) -> Any:
    proc = farm.farmctl("--token", TOKENS[who], *args, check=check)
    if not check:
        return proc
    return json.loads(proc.stdout) if "--json" in args else proc.stdout.decode()


def test_a_contributed_environment_goes_from_bounty_to_rollouts_to_quarantine(running_farm, tmp_path: Path
                                                                              ) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2", "--config", str(farm_toml(tmp_path)))
    bounty = as_(farm, "op", "bounty", "post", "--domain", "text", "--requirements", "counting tasks", "--payout",
                 "50-100", "--wanted", "2", "--json")
    assert as_(farm, "ada", "bounty", "claim", str(bounty["id"]), "--json")["claimants"] == ["ada"]
    sub = as_(farm, "ada", "submit", str(EXAMPLE), "--bounty", str(bounty["id"]), "--wait", "--json")
    assert sub["state"] == "in_review" and sub["contributor"] == "ada", sub
    assert {c["tier"] for c in sub["costs"]} >= {1, 2} and sub["mutation_share"] == 1.0

    denied = as_(farm, "ada", "review", "approve", str(sub["id"]), "--note", "mine", check=False)
    assert denied.returncode != 0 and b"PERMISSION_DENIED" in denied.stdout + denied.stderr
    queue = as_(farm, "rita", "review", "list", "--json")
    assert [s["id"] for s in queue] == [sub["id"]]
    shown = as_(farm, "rita", "review", "show", str(sub["id"]))
    assert "word-count" in shown and "in_review" in shown.replace(" ", "_")
    approved = as_(farm, "rita", "review", "approve", str(sub["id"]), "--note", "tasks vary; exact verifier",
                   "--json")
    assert approved["state"] == "approved" and approved["reviewer"] == "rita"

    run = as_(farm, "op", "run", "--env", ENV, "--agent", "reference", "--rollouts", "4", "--wait", "--json")
    assert run["passed"] == 4, run
    with FarmClient(farm.addr, token=TOKENS["trainer"]) as trainer:
        first = next(trainer.batches("learner", batch_size=4, envs=[ENV]))
        assert {t.env for t in first.trajectories} == {ENV} and all(t.env_version == "1.0.0" for t in first.trajectories)
        trainer.ack(first)
        taken = {t.id for t in first.trajectories}

        out = as_(farm, "rita", "quarantine", str(sub["id"]), "--reason", "a red team found a hedge that passes",
                  "--json")
        assert out["withdrawn"] == 4 and out["submission"]["state"] == "quarantined"
        refused = as_(farm, "op", "run", "--env", ENV, "--agent", "reference", "--rollouts", "2", check=False)
        assert refused.returncode != 0, "the task bank no longer serves it"
        as_(farm, "op", "run", "--env", "arith", "--agent", "reference", "--rollouts", "2", "--wait")
        told = next(trainer.batches("learner", batch_size=4))
        assert {t.env for t in told.trajectories} == {"arith"}, "withdrawn trajectories never stream again"
        assert {w.trajectory_id for w in told.withdrawn} == taken, "and the trainer is told which it had"
        assert all("hedge" in w.reason for w in told.withdrawn)
        record = trainer.trajectory(min(taken))
        assert any(s.verifier_version.endswith("+quarantined") and s.reward == 0 and set(s.flags) == {"quarantined", "withdrawn"}
                   for s in record.scores)

    ada = as_(farm, "ada", "contributor", "show", "--json")
    assert ada["reputation"] == -10 and ada["total_paid"] == 100.0, ada
    assert [e["delta"] for e in ada["ledger"]] == [-20, 10]
    funnel = as_(farm, "op", "funnel", "--json")
    assert funnel["accepted"] == 1 and funnel["cost_per_accepted"] > 100


def test_on_a_farm_without_credentials_the_review_step_says_how_it_is_tried(running_farm, tmp_path: Path
                                                                            ) -> None:  # type: ignore[no-untyped-def]
    """Without credentials every caller is `anonymous` unless named: reviewing what anonymous submitted is refused
    with the way through, and a named reviewer approves it."""
    config = intake_farm_toml(tmp_path / "farm.toml")
    farm = running_farm("--workers", "2", "--config", str(config))
    sub = json.loads(farm.farmctl("submit", str(EXAMPLE), "--wait", "--json").stdout)
    assert sub["state"] == "in_review" and sub["contributor"] == "anonymous", sub

    denied = farm.farmctl("review", "approve", str(sub["id"]), "--note", "fine", check=False)
    said = (denied.stdout + denied.stderr).decode()
    assert denied.returncode != 0 and "nobody reviews their own submission" in said
    assert "--reviewer NAME" in said and "farmctl token new" in said, said

    approved = json.loads(farm.farmctl("review", "approve", str(sub["id"]), "--note", "fine", "--reviewer", "rita",
                                       "--json").stdout)
    assert (approved["state"], approved["reviewer"]) == ("approved", "rita")
