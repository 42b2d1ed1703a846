"""The intake funnel's rows: submissions once per version, an append-only ledger, payouts once, and a
quarantine that withdraws a version's trajectories from every stream and says which."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from farmd.store import Store
from farmd.store.intake import CostRow, FindingRow
from tests.store.test_store import traj

ENV = "contrib:wc@1.0.0"


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await Store.open(tmp_path / "farm.db")
    yield s
    await s.close()


async def _submit(store: Store, version: str = "1.0.0", who: str = "ada") -> int | None:
    return await store.intake.add_submission(contributor=who, name="wc", version=version, domain="text", kind="answer",
                                             levels=3, digest="d" * 64, package=b"tar", bounty_id=0, seeds=6,
                                             attack_budget=16)


async def test_a_version_is_submitted_once_and_its_name_stays_its_first_authors(store: Store) -> None:
    sid = await _submit(store)
    assert sid is not None
    assert await _submit(store) is None
    assert await store.intake.owner_of("wc") == "ada"
    sub = await store.intake.submission(sid)
    assert sub is not None and sub.state == "checking" and sub.env == ENV and sub.rounds == 1
    assert await store.intake.package(sid) == b"tar"


async def test_findings_are_kept_per_round_and_costs_summed_per_tier(store: Store) -> None:
    sid = await _submit(store)
    assert sid is not None
    await store.intake.record_tier(sid, 1, 1, [FindingRow(1, "check_x", "evidence", "fix")],
                                   CostRow(1, box_cpu_s=2.0, box_calls=4), mutants=(5, 4))
    await store.intake.start_round(sid, 6, 16, "again")
    await store.intake.record_tier(sid, 2, 1, [], CostRow(1, box_cpu_s=1.0, box_calls=2))
    sub = await store.intake.submission(sid)
    assert sub is not None and sub.rounds == 2 and sub.findings == []  # the latest round's findings
    assert [(c.tier, c.box_cpu_s, c.box_calls) for c in sub.costs] == [(1, 3.0, 6)]
    assert (sub.mutants, sub.mutants_killed) == (5, 4)
    assert await store.intake.set_state(sid, "in_review", expect=["checking"])
    assert not await store.intake.set_state(sid, "approved", expect=["checking"])


async def test_the_ledger_only_grows_and_a_tank_is_for_good(store: Store) -> None:
    await store.intake.credit("ada", 10, "accepted")
    await store.intake.credit("ada", -1000, "planted", tank=True)
    await store.intake.credit("ada", 10, "accepted again")
    found = await store.intake.contributor("ada")
    assert found is not None and found.tanked and found.reputation == -980
    assert [r.reason for r in await store.intake.ledger("ada")] == ["accepted again", "planted", "accepted"]


async def test_a_submission_is_paid_once(store: Store) -> None:
    bid = await store.intake.add_bounty(domain="text", requirements="r", payout_min=50, payout_max=100, wanted=1,
                                        min_reputation=0, posted_by="op")
    sid = await _submit(store)
    assert sid is not None
    await store.intake.claim(bid, "ada")
    assert await store.intake.pay(sid, bid, "ada", 75.0)
    assert not await store.intake.pay(sid, bid, "ada", 75.0)
    [bounty] = await store.intake.bounties([bid])
    assert bounty.claimants == ["ada"] and bounty.accepted == 1 and bounty.paid == 75.0 and not bounty.open


async def test_a_quarantine_withdraws_trajectories_from_streams_and_cancels_queued_jobs(store: Store) -> None:
    (group,) = await store.enqueue([(ENV, 1, 1, "reference", 2)])
    (other,) = await store.enqueue([("py-func", 1, 2, "reference", 1)])
    (queued,) = await store.enqueue([(ENV, 2, 1, "reference", 1)])
    jobs = await store.lease("w1", 3, 30, policy_version=0)
    ours = [j for j in jobs if j.group_id == group]
    theirs = [j for j in jobs if j.group_id == other]
    await store.complete([("w1", dataclasses.replace(traj(j.id, group), env=ENV)) for j in ours] +
                         [("w1", traj(j.id, other)) for j in theirs])
    sid = await _submit(store)
    assert sid is not None
    withdrawn = await store.intake.quarantine(sid, ENV, "a hedge passes")
    assert withdrawn == 2
    assert await store.intake.quarantine(sid, ENV, "again") == 0  # each told of once
    streamed = await store.trajectories(streamed=True)
    assert {t.env for t in streamed} == {"py-func"}
    assert {t.env for t in await store.trajectories()} == {ENV, "py-func"}  # kept for operators
    assert [g.env for g in await store.finished_groups(0, 10, streamed=True)] == ["py-func"]
    told = await store.intake.withdrawals(0)
    assert sorted(w.trajectory_id for w in told) == sorted(j.id for j in ours)
    assert await store.intake.withdrawals(told[-1].seq) == []
    record = await store.trajectory(ours[0].id)
    assert record is not None
    [score] = [s for s in record.scores if s.verifier_version.endswith("+quarantined")]
    assert score.reward == 0 and not score.passed and "withdrawn" in score.flags
    assert (await store.job_counts()).get("cancelled") == 1
    assert queued not in [g.id for g in await store.finished_groups(0, 10, streamed=True)]



async def test_a_submissions_quarantine_and_its_withdrawals_are_one_step_from_approved_only(store: Store) -> None:
    """With the submission's move: done together (no reader sees it quarantined with its trajectories still served),
    and only from approved; a submission in any other state is left as it is, and nothing is withdrawn."""
    (group,) = await store.enqueue([(ENV, 1, 1, "reference", 1)])
    jobs = await store.lease("w1", 1, 30, policy_version=0)
    await store.complete([("w1", dataclasses.replace(traj(j.id, group), env=ENV)) for j in jobs])
    sid = await _submit(store)
    assert sid is not None
    assert await store.intake.quarantine(sid, ENV, "a hedge passes", detail="quarantined by rita") is None
    sub = await store.intake.submission(sid)
    assert sub is not None and sub.state == "checking"
    assert await store.intake.withdrawals(0) == [] and len(await store.trajectories(streamed=True)) == 1
    assert await store.intake.set_state(sid, "approved")
    assert await store.intake.quarantine(sid, ENV, "a hedge passes", detail="quarantined by rita") == 1
    sub = await store.intake.submission(sid)
    assert sub is not None and (sub.state, sub.detail) == ("quarantined", "quarantined by rita")
    assert await store.intake.quarantine(sid, ENV, "again", detail="quarantined again") is None


async def test_a_rollout_stored_after_its_environment_was_quarantined_is_withdrawn_as_it_lands(store: Store) -> None:
    (group,) = await store.enqueue([(ENV, 1, 1, "reference", 1)])
    [job] = await store.lease("w1", 1, 30, policy_version=0)
    sid = await _submit(store)
    assert sid is not None
    assert await store.intake.quarantine(sid, ENV, "found while it ran") == 0
    assert await store.complete([("w1", dataclasses.replace(traj(job.id, group), env=ENV))]) == [job.id]
    [told] = await store.intake.withdrawals(0)
    assert told.trajectory_id == job.id and told.reason == "found while it ran"
    record = await store.trajectory(job.id)
    assert record is not None and any(s.reward == 0 and "withdrawn" in s.flags for s in record.scores)
    assert await store.trajectories(streamed=True) == []
