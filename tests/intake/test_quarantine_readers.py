"""Issue 24's flow through a real farmd, as a new user meets it: a contributor submits the example environment, a
reviewer approves it, 16 reference rollouts pass, an export is made, and the reviewer quarantines it. Then every
reader shows each of the 16 withdrawn or leaves it out and says so, never live with reward 1: ``farmctl trajectories
list`` and ``show``, ``farmctl export`` in both views and both formats from farmd and from ``--data``, the console's
calls (list, one trajectory, the plots), ``farm_client``'s readers, the pass rates of ``farmctl status``; and
``farmctl withdrawn --since`` says which rows of the export made before the quarantine to drop.

One farm serves the module (the intake checks are most of what it costs); the last test stops it to read its data
directory, so the tests run in file order.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from farm_client import FarmClient

from tests.conftest import RunningFarm
from tests.intake.contrib_example import EXAMPLE
from tests.intake.farm_config import intake_farm_toml

pytestmark = [pytest.mark.sandbox]

TOKENS = {"op": "op-token", "ada": "ada-token", "rita": "rita-token", "trainer": "trainer-token"}
ROLES = {"op": "operator", "ada": "contributor", "rita": "reviewer", "trainer": "trainer"}
ENV = "contrib:word-count@1.0.0"
LIVE = "arith"
REASON = "a red team found a hedge that passes"
VIEWS = [(fmt, view) for fmt in ("jsonl", "parquet") for view in ("record", "flat")]


class Flow:
    """The farm after the flow, and what was made on the way."""

    def __init__(self, farm: RunningFarm, root: Path) -> None:
        self.farm = farm
        self.root = root
        self.ids: list[int] = []
        """The 16 trajectories the quarantine withdrew."""
        self.arith: list[int] = []
        """The live environment's, beside them."""
        self.live: list[int] = []
        """Every trajectory the quarantine left as it was: the live environment's, and the production canaries of
        the contributed one (known-wrong attempts: evidence, never withdrawn, never streamed)."""
        self.before: dict[tuple[str, str], Path] = {}
        """Exports made before the quarantine, by (format, view)."""

    def ctl(self, who: str, *args: str, check: bool = True) -> Any:
        return self.farm.farmctl("--token", TOKENS[who], *args, check=check, env={**os.environ, "COLUMNS": "300"})

    def json(self, who: str, *args: str) -> Any:
        return json.loads(self.ctl(who, *args, "--json").stdout)

    def console(self, method: str, body: dict[str, Any], who: str = "op") -> Any:
        addr = json.loads((self.farm.data_dir / "farmd.json").read_text())["console"]
        reply = httpx.post(f"http://{addr}/api/v1/FarmService/{method}", json=body,
                           headers={"Authorization": f"Bearer {TOKENS[who]}"}, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply.json()


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    root = tmp_path_factory.mktemp("quarantine")
    config = intake_farm_toml(root / "farm.toml", TOKENS, ROLES)
    farm = RunningFarm(root / "data", "--workers", "2", "--http", "127.0.0.1:0", "--config", str(config))
    try:
        f = Flow(farm, root)
        sub = f.json("ada", "submit", str(EXAMPLE), "--wait")
        assert sub["state"] == "in_review", sub
        assert f.json("rita", "review", "approve", str(sub["id"]), "--note", "exact verifier")["state"] == "approved"
        run = f.json("op", "run", "--env", ENV, "--agent", "reference", "--rollouts", "16", "--group-size", "4",
                     "--wait")
        assert run["passed"] == 16, run
        assert f.json("op", "run", "--env", LIVE, "--agent", "reference", "--rollouts", "4", "--wait")["passed"] == 4
        with FarmClient(farm.addr, token=TOKENS["op"]) as client:
            # The farm's own canary groups for the new environment run beside the runs and may land after them:
            # what is listed here must be all that will ever be exported.
            deadline = time.monotonic() + 60
            while (open_jobs := sum(client.status()["queue"][k] for k in ("queued", "leased"))) \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not open_jobs, f"{open_jobs} jobs still open after 60 s"
            listed = client.trajectories(limit=1000)
            f.ids = sorted(t.id for t in listed if t.env == ENV and t.agent == "reference")
            f.arith = sorted(t.id for t in listed if t.env == LIVE)
            f.live = sorted(t.id for t in listed if t.id not in f.ids)
            assert len(f.ids) == 16 and len(f.arith) == 4
            assert all(t.reward == 1.0 for t in listed if t.agent == "reference")
        for fmt, view in VIEWS:
            out = root / "before" / f"{view}.{fmt}"
            f.before[(fmt, view)] = out
            assert f.json("op", "export", "--format", fmt, "--view", view, "--out", str(out))["exported"] == \
                len(f.live) + 16
        out = f.json("rita", "quarantine", str(sub["id"]), "--reason", REASON)
        assert out["withdrawn"] == 16, out
        yield f
    finally:
        farm.stop()


def rows_of(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        return list(pq.read_table(path).to_pylist())
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_withdrawn(row: dict[str, Any] | Any, view: str = "record") -> None:
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    assert (get("reward"), get("passed")) == (0.0, False), row
    if view == "record":
        assert set(get("flags")) == {"quarantined", "withdrawn"} and get("verdict_version") > 0


def test_a_listing_leaves_withdrawn_trajectories_out_says_so_and_shows_them_withdrawn_when_asked(flow: Flow) -> None:
    proc = flow.ctl("op", "trajectories", "list", "--env", ENV, "--agent", "reference", "--json")
    assert json.loads(proc.stdout) == []
    assert b"16 withdrawn trajectories were left out" in proc.stderr
    everything = json.loads(flow.ctl("op", "trajectories", "list", "--limit", "1000", "--json").stdout)
    assert sorted(r["id"] for r in everything) == flow.live
    assert all(r["reward"] == 1.0 for r in everything if r["id"] in flow.arith)
    shown = json.loads(flow.ctl("op", "trajectories", "list", "--env", ENV, "--agent", "reference", "--limit", "100",
                                "--include-withdrawn", "--json").stdout)
    assert sorted(r["id"] for r in shown) == flow.ids
    for r in shown:
        assert_withdrawn(r)
    by_flag = json.loads(flow.ctl("op", "trajectories", "list", "--flag", "withdrawn", "--limit", "1000",
                                  "--json").stdout)
    assert sorted(r["id"] for r in by_flag) == flow.ids, "asking for the flag is asking for them"
    passing = flow.ctl("op", "trajectories", "list", "--env", ENV, "--min-reward", "0.5", "--include-withdrawn",
                       "--json")
    assert json.loads(passing.stdout) == [], "a reward filter reads the verdict shown"
    human = flow.ctl("op", "trajectories", "list", "--env", ENV, "--include-withdrawn").stdout.decode()
    assert "withdrawn" in human and "quarantined" in human


def test_one_trajectory_shows_its_withdrawal_at_the_top_and_its_first_verdict_in_its_scores(flow: Flow) -> None:
    record = flow.json("op", "trajectories", "show", str(flow.ids[0]))
    assert_withdrawn(record)
    assert record["reasons"] == [f"withdrawn: {REASON}"]
    first, *later = record["scores"]
    assert (first["reward"], first["passed"], first["verdict_version"]) == (1.0, True, 0), "the first verdict, kept"
    assert later[-1]["verdict_version"] == record["verdict_version"] and "withdrawn" in later[-1]["flags"]
    human = flow.ctl("op", "trajectories", "show", str(flow.ids[0])).stdout.decode()
    assert "every verdict it was given" in human and "withdrawn" in human and "current" in human


def test_exports_from_farmd_leave_them_out_or_write_them_withdrawn_in_every_view_and_format(flow: Flow) -> None:
    for fmt, view in VIEWS:
        out = flow.root / "after" / f"{view}.{fmt}"
        proc = flow.ctl("op", "export", "--format", fmt, "--view", view, "--out", str(out), "--json")
        summary = json.loads(proc.stdout)
        assert (summary["exported"], summary["withdrawn_left_out"]) == (len(flow.live), 16), summary
        assert b"16 withdrawn trajectories were left out" in proc.stderr
        assert sorted(r["id"] for r in rows_of(out)) == flow.live, (fmt, view)
        manifest = json.loads(Path(summary["manifest"]).read_text())
        assert sorted(i for i, _ in manifest["trajectories"]) == flow.live and manifest["withdrawn_left_out"] == 16

        every = flow.root / "after" / f"all-{view}.{fmt}"
        assert flow.json("op", "export", "--format", fmt, "--view", view, "--out", str(every),
                         "--include-withdrawn")["exported"] == len(flow.live) + 16
        rows = {r["id"]: r for r in rows_of(every)}
        assert sorted(rows) == sorted(flow.ids + flow.live)
        for i in flow.ids:
            assert_withdrawn(rows[i], view)
        assert all(rows[i]["reward"] == 1.0 and rows[i]["passed"] for i in flow.arith)


def test_withdrawn_since_an_export_lists_what_to_drop_from_it(flow: Flow) -> None:
    for (fmt, view), path in flow.before.items():
        report = flow.json("op", "withdrawn", "--since", f"{path}.manifest.json")
        assert (report["exported"], report["withdrawn"], report["rescored"]) == (len(flow.live) + 16, 16, 0), \
            (fmt, view, report)
        entries = {e["id"]: e for e in report["trajectories"]}
        assert sorted(entries) == flow.ids
        for e in entries.values():
            assert e["withdrawn"] and e["changed"] and e["env"] == ENV and e["why"] == REASON
            assert (e["was"]["reward"], e["was"]["passed"], e["was"]["verdict_version"]) == (1.0, True, 0)
            assert (e["now"]["reward"], e["now"]["passed"]) == (0.0, False) and "withdrawn" in e["now"]["flags"]
        exported = {r["id"] for r in rows_of(path)}
        assert set(entries) <= exported, "the rows to drop are rows of that export"
    human = flow.ctl("op", "withdrawn", "--since", f"{flow.before[('jsonl', 'flat')]}.manifest.json").stdout.decode()
    assert "16 were withdrawn and 0 rescored" in human and str(flow.ids[0]) in human
    after = flow.root / "after" / "flat.jsonl.manifest.json"
    assert flow.json("op", "withdrawn", "--since", str(after))["trajectories"] == [], "nothing since the later one"


def test_the_console_lists_shows_and_plots_the_current_verdict(flow: Flow) -> None:
    page = flow.console("ListTrajectories", {"env": ENV, "agent": "reference", "page_size": 100})
    assert page["trajectories"] == [] and int(page["withdrawn_left_out"]) == 16 and int(page["verdict_mark"]) > 0
    shown = flow.console("ListTrajectories", {"env": ENV, "agent": "reference", "page_size": 100,
                                              "include_withdrawn": True})
    assert sorted(int(t["id"]) for t in shown["trajectories"]) == flow.ids
    assert all(t["reward"] == 0 and not t["passed"] and "FLAG_WITHDRAWN" in t["flags"] for t in shown["trajectories"])
    one = flow.console("GetTrajectory", {"id": str(flow.ids[0])})["trajectory"]
    assert one["reward"] == 0 and "FLAG_WITHDRAWN" in one["flags"]
    assert one["scores"][0]["reward"] == 1 and int(one["scores"][0]["verdict_version"]) == 0
    history = flow.console("GetHistory", {"window": "3600s", "buckets": 4})
    plotted = {b["env"] for b in history["activity"]}
    assert LIVE in plotted and ENV not in plotted, "no plot counts a withdrawn verdict as a result"
    rates = {r["env"] for r in flow.console("GetStatus", {})["pass_rates"]}
    assert LIVE in rates and ENV not in rates


def test_farm_clients_readers_and_the_pass_rates_agree(flow: Flow) -> None:
    with FarmClient(flow.farm.addr, token=TOKENS["trainer"]) as client:
        listing = client.trajectories(ENV, limit=100, agent="reference")
        assert list(listing) == [] and listing.withdrawn_left_out == 16
        pages = list(client.trajectory_pages(ENV, include_withdrawn=True, full=True, agent="reference"))
        records = [t for page in pages for t in page]
        assert sorted(t.id for t in records) == flow.ids
        for t in records:
            assert_withdrawn(t)
            assert t.scores[0].reward == 1.0 and t.scores[0].verdict_version == 0
        one = client.trajectory(flow.ids[-1])
        assert_withdrawn(one)
        changes = list(client.verdict_changes(0))
        assert sorted(c.trajectory_id for c in changes) == flow.ids and all(c.withdrawn for c in changes)
        assert all(c.current is not None and c.current.reward == 0.0 and c.verdict(0).reward == 1.0  # type: ignore[union-attr]
                   for c in changes)
        # A trainer's stream (and so FarmDataset, which reads it) carries none of them.
        batch = next(iter(client.batches("learner", 64)))
        assert sorted(t.id for t in batch.trajectories) == flow.arith
        rates = {r["env"] for r in client.status()["pass_rates"]}
        assert rates == {LIVE}, "a withdrawn verdict is in no pass rate"


def test_a_stopped_farms_data_dir_exports_and_answers_the_same(flow: Flow) -> None:
    """Last: it stops the farm."""
    served = flow.root / "after" / "record.jsonl"
    report = {(fmt, view): flow.json("op", "withdrawn", "--since", f"{path}.manifest.json")
              for (fmt, view), path in flow.before.items()}
    assert flow.farm.stop() == 0
    data = str(flow.farm.data_dir)
    for fmt, view in VIEWS:
        out = flow.root / "data" / f"{view}.{fmt}"
        proc = flow.ctl("op", "export", "--format", fmt, "--view", view, "--out", str(out), "--data", data,
                        "--json")
        assert json.loads(proc.stdout)["withdrawn_left_out"] == 16
        assert b"16 withdrawn trajectories were left out" in proc.stderr
        assert sorted(r["id"] for r in rows_of(out)) == flow.live
        every = flow.root / "data" / f"all-{view}.{fmt}"
        flow.ctl("op", "export", "--format", fmt, "--view", view, "--out", str(every), "--data", data,
                 "--include-withdrawn")
        rows = {r["id"]: r for r in rows_of(every)}
        for i in flow.ids:
            assert_withdrawn(rows[i], view)
    assert (flow.root / "data" / "record.jsonl").read_text() == served.read_text(), "the data dir holds what farmd served"
    for (fmt, view), path in flow.before.items():
        assert flow.json("op", "withdrawn", "--since", f"{path}.manifest.json", "--data", data) == report[(fmt, view)]
