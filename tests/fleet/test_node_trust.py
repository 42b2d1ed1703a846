"""A node reports results; it does not decide what is true. A real coordinator (``--workers 0``, its own few boxes
for checks) and nodes that joined it: real ``farmd serve --join`` processes for honest nodes, and for lying ones a
node credential speaking ``NodeService.Work`` itself (``RawNode``), which can send any record at all.

- A result is bound to its lease: a record naming another environment, agent, seed, group, level or policy
  version is refused, never stored, counted against the node, and its job runs again; enough of them quarantine it.
- A verdict is checked, not believed: a node that reports a wrong answer as a pass (``farmctl verify`` scores it 0)
  is caught by re-verification and quarantined, and what of its results the coordinator had not confirmed is
  withdrawn from the streams (consumers are told); a restart keeps it out, an operator lets it back.
- Canaries reach every node unannounced, honest nodes pass them and nothing of them reaches a listing, a stream
  or a pass rate; a node that answers its jobs with answers its agent never gave is caught by one even though every
  verdict it reports is right.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm_client import FarmClient
from grpc_status import rpc_status

from farmd.envs import get
from tests.fleet.rawnode import RawNode, record
from tests.fleet.test_fleet import finished, wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

CHAIN = "rg:chain_sum"
WRONG = "<answer>-99999</answer>"
"""No chain sum of level 1 comes to this: ``farmctl verify`` scores it 0."""


def coordinator_toml(tmp_path: Path, **scheduler: Any) -> str:
    settings = {"lease_s": 60, "node_lost_s": 60, "reverify_first": 4, "reverify_share": 0.01,
                "canary_first_within": 1000, "canary_share": 0.005, **scheduler}
    path = tmp_path / "coordinator.toml"
    path.write_text("[scheduler]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return str(path)


def reference_final(env: str, seed: int, difficulty: int) -> str:
    environment = get(env)
    return environment.reference(environment.generate(seed, difficulty)).final


def node_row(client: FarmClient, name: str) -> dict[str, Any] | None:
    return next((n for n in client.status()["nodes"] if n["name"] == name), None)


def lease_all(node: RawNode, want: int, timeout_s: float = 30) -> list[Any]:
    jobs: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(jobs) < want and time.monotonic() < deadline:
        jobs += node.lease(want - len(jobs))
    assert len(jobs) >= want, f"leased {len(jobs)} of {want}"
    return jobs


def refusal(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    return exc.code(), str(status.details) if status is not None else ""


def test_a_result_under_another_identity_is_refused_counted_and_runs_again(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "0", "--config", coordinator_toml(tmp_path, node_refusals_quarantine=6))
    with FarmClient(farm.addr) as client:
        client.run(CHAIN, "reference", group_size=1, difficulty=1, seeds=range(8))
        other = client.run("rg:basic_arithmetic", "random", group_size=1, difficulty=2, seeds=[5])
        node = RawNode(farm.addr, "liar")
        jobs = {j.id: j for j in lease_all(node, 9)}
        chain = [j for j in jobs.values() if j.env == CHAIN]
        foreign = next(j for j in jobs.values() if j.group_id == other["group_ids"][0])
        honest = chain[0]
        lies = {  # one lie per identity field: each a record some other job's lease would have
            chain[1].id: {"env": "rg:basic_arithmetic"},
            chain[2].id: {"agent": "random"},
            chain[3].id: {"group_id": foreign.group_id, "seed": foreign.seed},
            chain[4].id: {"policy_version": 3},
            chain[5].id: {"difficulty": 2},
        }
        records = [record(honest, reference_final(CHAIN, honest.seed, 1), passed=True, reward=1.0,
                          verified_by="coordinator", node="someone-else")]
        records += [record(jobs[i], WRONG, passed=False, reward=0.0, **lie) for i, lie in lies.items()]
        reply = node.report(records)
        assert list(reply.stored) == [honest.id]
        assert sorted(reply.handled) == sorted([honest.id, *lies]), "refused ones are handled: the node drops them"
        reasons = {r.job_id: r.reason for r in reply.refused}
        assert sorted(reasons) == sorted(lies)
        for job_id, lie in lies.items():
            assert all(name in reasons[job_id] for name in lie), reasons[job_id]
        # Stored under its lease's identity, as the node's own word: whatever its record claimed of itself.
        stored = client.trajectory(honest.id)
        assert (stored.env, stored.seed, stored.agent, stored.node, stored.verified_by) == (
            CHAIN, honest.seed, "reference", "liar", "node:liar")
        for job_id in lies:
            with pytest.raises(grpc.RpcError) as missing:
                client.trajectory(job_id)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert all(t.env == CHAIN for page in client.trajectory_pages(CHAIN) for t in page)
        assert list(client.trajectory_pages("rg:basic_arithmetic")) in ([], [[]])
        row = node_row(client, "liar")
        assert row is not None and (row["state"], row["refused"]) == ("connected", len(lies))
        # Refused jobs went back to the queue at once, and run again (here, leased to the same node).
        again = {j.id for j in lease_all(node, len(lies))}
        assert set(lies) <= again
        # One more: past the bound, the node is quarantined and its stream ends.
        with pytest.raises(grpc.RpcError) as ended:
            node.report([record(jobs[chain[6].id], WRONG, passed=False, reward=0.0, seed=12345)])
        code, _ = refusal(ended.value)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "quarantined" in (ended.value.details() or "")
        row = node_row(client, "liar")
        assert row is not None and row["state"] == "quarantined" and "identities" in row["quarantine_reason"]
        # Kept in the store, its one stored result withdrawn: it was only ever its word.
        assert "withdrawn" in client.trajectory(honest.id).scores[-1].flags
    assert "results_refused" in farm.log.read_text() or "disagree with their leases" in farm.log.read_text()


def test_a_node_passing_wrong_answers_is_quarantined_its_unconfirmed_results_withdrawn(  # type: ignore[no-untyped-def]
        tmp_path: Path, running_farm) -> None:
    toml = coordinator_toml(tmp_path)
    farm = running_farm("--workers", "0", "--config", toml)
    with FarmClient(farm.addr) as client:
        client.run(CHAIN, "reference", group_size=1, difficulty=1, seeds=range(16))
        node = RawNode(farm.addr, "fibber")
        jobs = sorted(lease_all(node, 16), key=lambda j: j.id)
        # Honest at first: the coordinator checks a new node's first results, finds them right and says so.
        honest = jobs[:3]
        node.report([record(j, reference_final(CHAIN, j.seed, 1), passed=True, reward=1.0) for j in honest])
        wait_for(lambda: all(client.trajectory(j.id).verified_by == "coordinator" for j in honest), 60,
                 "the first results confirmed")
        # Then wrong answers reported as passes: the first is still one of its first, and is checked.
        lies = jobs[3:12]
        reply = node.report([record(j, WRONG, passed=True, reward=1.0) for j in lies])
        assert sorted(reply.stored) == sorted(j.id for j in lies), "stored at once: checks never hold up intake"
        wait_for(lambda: (node_row(client, "fibber") or {}).get("state") == "quarantined", 60, "the quarantine")
        with pytest.raises(grpc.RpcError) as ended:
            node.lease()
        assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "quarantined" in (ended.value.details() or "")

        # farmctl verify scores the answer it passed 0.
        answer = tmp_path / "answer.txt"
        answer.write_text(WRONG)
        verdict = json.loads(farm.farmctl("verify", "--env", CHAIN, "--seed", str(lies[0].seed), "--difficulty", "1",
                                          "--submission", str(answer), "--data", str(tmp_path / "verify")).stdout)
        assert (verdict["reward"], verdict["passed"]) == (0.0, False)

        row = node_row(client, "fibber")
        assert row is not None and row["disagreed"] >= 1 and "disagrees with the coordinator" in row["quarantine_reason"]
        # Its current verdict, the one every reader shows, is the withdrawal (issue 24: it was the node's pass, kept
        # as the top level for ever); the node's word stays in the history as the first verdict, nothing overwritten.
        checked = client.trajectory(lies[0].id)
        assert (checked.reward, checked.passed, checked.verified_by) == (0.0, False, "node:fibber")
        assert set(checked.flags) == {"quarantined", "withdrawn"}
        assert checked.verdict_version == checked.scores[-1].verdict_version > 0
        first = checked.scores[0]
        assert (first.reward, first.passed, first.verdict_version) == (1.0, True, 0), "the node's word, kept first"
        theirs = [s for s in checked.scores if "coordinator" in " ".join(s.reasons)]
        assert theirs and (theirs[0].reward, theirs[0].passed) == (0.0, False), "the coordinator's verdict, added"
        for j in lies:
            assert "withdrawn" in client.trajectory(j.id).scores[-1].flags
        for j in honest:
            kept = client.trajectory(j.id)
            assert kept.verified_by == "coordinator" and not any("withdrawn" in s.flags for s in kept.scores)

        # A trainer's stream carries the confirmed ones only, and is told of every withdrawn one.
        batch = next(iter(client.batches("trainer", 64, envs=[CHAIN])))
        assert sorted(t.id for t in batch.trajectories) == sorted(j.id for j in honest)
        assert sorted(w.trajectory_id for w in batch.withdrawn) == sorted(j.id for j in lies)
        groups = next(iter(client.batches("grouped", 64, whole_groups=True, envs=[CHAIN])))
        assert sorted(t.id for t in groups.trajectories) == sorted(j.id for j in honest)
        # Its leases went back to the queue: the run goes on without it.
        assert client.get_run(1)["state"] == "running" and client.status()["queue"]["queued"] == 4
    assert "ERROR farmd.nodes: node fibber quarantined: its result for job" in farm.log.read_text()

    # A restart keeps it out; only an operator lets it back.
    farm.stop()
    farm = running_farm("--workers", "0", "--config", toml, data_dir=farm.data_dir)
    with pytest.raises(grpc.RpcError) as refused:
        RawNode(farm.addr, "fibber")
    code, details = refusal(refused.value)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "NODE_QUARANTINED" in details
    shown = farm.farmctl("status").stdout.decode()
    assert "quarantined" in shown and "fibber" in shown and "farmctl nodes clear fibber" in shown
    cleared = json.loads(farm.farmctl("nodes", "clear", "fibber", "--json").stdout)
    assert cleared["cleared"] and "disagrees" in cleared["reason"]
    assert farm.farmctl("nodes", "clear", "fibber", check=False).returncode != 0, "not quarantined now"
    back = RawNode(farm.addr, "fibber")
    assert back.welcome.name == "fibber"
    back.close()


def test_a_node_that_answers_for_its_agent_is_caught_by_a_canary(tmp_path: Path, running_farm) -> None:  # type: ignore[no-untyped-def]
    """Every verdict it reports is right (it judges its own answers honestly), so re-verification agrees; but its
    answers are not its agent's (the reference's where ``random`` was leased): a canary knows."""
    farm = running_farm("--workers", "0", "--config", coordinator_toml(tmp_path, canary_first_within=1))
    env = get(CHAIN)
    with FarmClient(farm.addr) as client:
        client.run(CHAIN, "random", group_size=2, difficulty=1, seeds=range(12))
        node = RawNode(farm.addr, "mimic")
        deadline = time.monotonic() + 60
        reported = []
        with pytest.raises(grpc.RpcError) as ended:
            while time.monotonic() < deadline:
                for job in node.lease(8):
                    task = env.generate(job.seed, job.difficulty)
                    final = env.reference(task).final
                    verdict = env.judge(task, final)
                    node.report([record(job, final, passed=verdict.passed, reward=verdict.reward)])
                    reported.append(job.id)
        assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED
        row = node_row(client, "mimic")
        assert row is not None and row["state"] == "quarantined" and row["canaries"] >= 1
        assert "canary" in row["quarantine_reason"] and "final answer" in row["quarantine_reason"]
        # What re-verification confirmed of it is withdrawn too: a verdict was checked, not who made the attempt.
        assert [t for page in client.trajectory_pages(CHAIN) for t in page] == [], "withdrawn: listed only when asked"
        stored = [t for page in client.trajectory_pages(CHAIN, include_withdrawn=True) for t in page]
        assert stored and all(t.node == "mimic" and "withdrawn" in t.flags and t.reward == 0 for t in stored)
        for t in stored:
            # The current verdict, not the last score listed: a recheck of the node's pass that was under way when
            # the canary failed still lands (kept, as every verdict is), but never becomes current once withdrawn.
            again = client.trajectory(t.id)
            current = next(s for s in again.scores if s.verdict_version == again.verdict_version)
            assert "withdrawn" in again.flags and again.reward == 0 and "withdrawn" in current.flags, t.id
        assert len(stored) == 24 < len(reported), "the run's results are stored; its canary's, reported too, are not"


def test_canaries_reach_every_node_honest_ones_pass_and_nothing_of_them_is_served(  # type: ignore[no-untyped-def]
        tmp_path: Path, running_farm, worker_node) -> None:
    farm = running_farm("--workers", "0", "--config",
                        coordinator_toml(tmp_path, canary_first_within=1, reverify_share=0.25))
    for name in ("alpha", "beta"):
        worker_node(farm.addr, name, workers=2)
    with FarmClient(farm.addr) as client:
        runs = [client.run(CHAIN, "random", group_size=4, difficulty=1, seeds=range(8)),
                client.run("py-func", "reference", 8, group_size=4)]
        for run in runs:
            done = wait_for(lambda run=run: finished(client, run["id"]), 180, "the runs")
            assert done["state"] == "succeeded", done
        rows = wait_for(lambda: (lambda r: r if all(r[n]["canaries"] >= 1 and r[n]["checked"] >= 4 for n in r) else None)(
            {n["name"]: n for n in client.status()["nodes"]}), 120, "a canary and the first checks of every node")
        for name, row in rows.items():
            assert (row["state"], row["disagreed"], row["refused"]) == ("connected", 0, 0), (name, row)
        # Canaries are nobody's data: not listed, not streamed, not in pass rates; the runs' rollouts are.
        listed = {env: [t for page in client.trajectory_pages(env) for t in page] for env in (CHAIN, "py-func")}
        assert (len(listed[CHAIN]), len(listed["py-func"])) == (32, 8)
        assert {t.run_id for ts in listed.values() for t in ts} == {r["id"] for r in runs}
        assert {t.verified_by for ts in listed.values() for t in ts} <= {"node:alpha", "node:beta", "coordinator"}
        assert "coordinator" in {t.verified_by for ts in listed.values() for t in ts}
        rates = {r["env"]: r["trajectories"] for r in client.status()["pass_rates"]}
        assert rates == {CHAIN: 32, "py-func": 8}
        batch = next(iter(client.batches("trainer", 256)))
        assert len(batch.trajectories) == 40 and not batch.withdrawn
    assert "quarantined" not in farm.log.read_text()
