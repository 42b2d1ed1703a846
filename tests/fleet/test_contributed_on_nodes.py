"""An approved contributed environment runs on joined nodes: a coordinator with no workers checks the
submission in boxes of its own, and a node fetches the approved package (checked against its digest) the
first time one of its jobs comes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.intake.contrib_example import EXAMPLE

pytestmark = [pytest.mark.sandbox]


def test_a_node_runs_an_approved_contributed_version_it_fetched(tmp_path: Path, running_farm, worker_node  # type: ignore[no-untyped-def]
                                                                ) -> None:
    config = tmp_path / "farm.toml"
    config.write_text("[intake]\nseeds = [2, 2, 2]\nattack_budget = [2, 2, 2]\ntier2_tasks = 1\n")
    farm = running_farm("--workers", "0", "--config", str(config))
    node = worker_node(farm.addr, "far")
    sub = json.loads(farm.farmctl("submit", str(EXAMPLE), "--contributor", "ada", "--wait", "--json").stdout)
    assert sub["state"] == "in_review", sub
    farm.farmctl("review", "approve", str(sub["id"]), "--note", "ok")
    run = json.loads(farm.farmctl("run", "--env", sub["env"], "--agent", "reference", "--rollouts", "3", "--wait",
                                  "--json").stdout)
    assert run["passed"] == 3, (run, node.text()[-2000:])
    rows = json.loads(farm.farmctl("trajectories", "list", "--env", sub["env"], "--json").stdout)
    assert {r["node"] for r in rows} == {"far"}
    assert "fetched contrib:word-count@1.0.0" in node.text()
