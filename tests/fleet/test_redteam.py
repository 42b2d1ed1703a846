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
    assert sum(r["tried"].startswith("exploit ") for r in rows) == 6
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
