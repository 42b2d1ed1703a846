"""A short red-team pass through a live farm with two nodes: exploits and escapes run as ordinary
rollouts, leased to both nodes, boxed, verified and stored; every one is held, the host is clean after, and
the attempts are stored flagged, out of the pass rates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox]


def test_a_red_team_pass_through_two_nodes_is_held(tmp_path: Path, running_farm, worker_node  # type: ignore[no-untyped-def]
                                                   ) -> None:
    farm = running_farm("--workers", "0")
    worker_node(farm.addr, "left")
    worker_node(farm.addr, "right")
    done = farm.farmctl("redteam", "--env", "py-func", "--env", "arith", "--exploits", "3", "--data",
                        str(farm.data_dir), "--json", timeout=300)
    report = json.loads(done.stdout)
    rows = report["attempts"]
    assert report["host"] == [], report["host"]
    assert report["summary"]["breached"] == 0 and report["summary"]["failed"] == 0, rows
    assert report["summary"]["attempts"] == report["summary"]["held"] == len(rows)
    escapes = [r for r in rows if r["tried"].startswith("escape ")]
    assert escapes and all(r["env"] == "py-func" and "red_team_escape" in r["flags"] for r in escapes), \
        "escapes run where code runs, and only there"
    # Each of the 3 exploits at each family of tasks: py-func's three argument types, arith's one.
    exploits = [r for r in rows if r["tried"].startswith("exploit ")]
    assert len(exploits) == 3 * 3 + 3
    assert {r["family"] for r in exploits if r["env"] == "py-func"} == {"ints in", "int in", "str in"}
    assert len(report["cells"]) == len(rows) and report["summary"]["breached_cells"] == 0
    assert all(r["reward"] == 0 for r in rows)
    assert {r["node"] for r in rows} == {"left", "right"}, "leased to both nodes like any rollout"

    human = farm.farmctl("redteam", "--env", "arith", "--exploits", "2", "--no-escapes").stdout.decode()
    assert human.strip().endswith("2 attempts, 2 held, 0 breached")
    status = json.loads(farm.farmctl("status", "--json").stdout)
    assert not [p for p in status["pass_rates"] if p["env"] in ("py-func", "arith")], \
        "red-team attempts never count toward pass rates"
    stored = json.loads(farm.farmctl("trajectories", "list", "--env", "arith", "--json").stdout)
    assert stored and all(t["agent"].startswith("redteam:exploit:") and "red_team_exploit" in t["flags"]
                          for t in stored)


def test_too_many_steps_meets_every_shell_family_and_is_held(running_farm) -> None:  # type: ignore[no-untyped-def]
    """The red team's own step-budget exploit at every shell family (not at one family a random seed drew):
    each held, scored 0 and flagged ``rule_broken``. (That the seeds are the same every run is the plan's test.)"""
    farm = running_farm()
    report = json.loads(farm.farmctl("redteam", "--env", "shell", "--exploit", "too-many-steps", "--no-escapes",
                                     "--json", timeout=300).stdout)
    rows = report["attempts"]
    assert report["summary"]["breached"] == 0 and report["summary"]["failed"] == 0, rows
    assert {r["family"] for r in rows} == {"find-token", "count-lines", "csv-sum", "move-files", "distinct-words",
                                           "edit-config", "log-fields"}
    assert len(rows) == len(report["cells"]) == 7 and {r["tried"] for r in rows} == {"exploit too-many-steps"}
    assert all(r["reward"] == 0 and "rule_broken" in r["flags"] and "red_team_exploit" in r["flags"] for r in rows)
