"""One current verdict per trajectory, in its row, the same for every reader of the store; every verdict it was
given kept in its scores (the first included); a withdrawal current for good; what changed since a mark found in
one range. A real SQLite file, written the ways farmd writes it: a rescore (``add_scores``), a quarantined
environment (``store.intake.quarantine``), a quarantined node (``store.nodes.quarantine``)."""

from __future__ import annotations

import dataclasses
import sqlite3
import zlib
from pathlib import Path

import pytest

from farmd.records import Trajectory, verified_by_node
from farmd.store import Store, TrajectoryFilter
from farmd.store.schema import MIGRATIONS
from tests.store.plans import traced_store, whole_walks
from tests.store.test_activity import attempt, stored

ENV = "contrib:word-count@1.0.0"


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = await Store.open(tmp_path / "farm.db")
    yield s
    await s.close()


def verdicts(ts: list[Trajectory]) -> dict[int, tuple[float, bool, str]]:
    return {t.id: (t.reward, t.passed, t.verifier_version) for t in ts}


async def test_a_rescore_is_every_readers_verdict_and_the_first_stays_in_the_history(store: Store) -> None:
    a, b, c = await stored(store, attempt(env="py-func", reward=1.0), attempt(env="py-func", reward=1.0),
                           attempt(env="py-func", reward=0.0))
    assert await store.verdicts.mark() == 0 and (await store.trajectory(a.id)).verdict_version == 0  # type: ignore[union-attr]
    # A newer verifier finds a's pass was wrong, and c's fail right after all.
    assert await store.add_scores([(a.id, "2", 0.0, False, "ok", ["a stricter check"], ["suspected_hack"]),
                                   (c.id, "2", 1.0, True, "ok", [], [])]) == 2
    listed = await store.trajectories(limit=10)
    assert verdicts(listed) == {a.id: (0.0, False, "2"), b.id: (1.0, True, "1"), c.id: (1.0, True, "2")}
    summaries = await store.trajectories(limit=10, view="summary", newest_first=True)
    assert verdicts(summaries) == verdicts(listed), "summaries read the same row"
    whole = await store.trajectory(a.id)
    assert whole is not None and whole.flags == ["suspected_hack"] and whole.reasons == ["a stricter check"]
    assert [(s.verifier_version, s.reward, s.verdict_version > 0) for s in whole.scores] == [
        ("1", 1.0, False), ("2", 0.0, True)], "the first verdict, then the later one"
    assert whole.verdict_version == whole.scores[-1].verdict_version
    untouched = await store.trajectory(b.id)
    assert untouched is not None and untouched.verdict_version == 0
    assert [(s.verifier_version, s.reward, s.verdict_version) for s in untouched.scores] == [("1", 1.0, 0)]

    # Filters narrow by the verdict shown.
    def ids(ts: list[Trajectory]) -> set[int]:
        return {t.id for t in ts}
    assert ids(await store.trajectories(where=TrajectoryFilter(max_reward=0.5))) == {a.id}
    assert ids(await store.trajectories(where=TrajectoryFilter(min_reward=0.5))) == {b.id, c.id}
    assert ids(await store.trajectories(where=TrajectoryFilter(flag="suspected_hack"))) == {a.id}
    # Pass rates count each by its current verdict.
    (rate,) = await store.pass_rates()
    assert (rate.trajectories, rate.passed) == (3, 2)
    # A version that scored it keeps its score: the same version again changes nothing.
    mark = await store.verdicts.mark()
    assert await store.add_scores([(a.id, "2", 1.0, True, "ok", [], [])]) == 0
    assert await store.verdicts.mark() == mark and (await store.trajectory(a.id)).reward == 0.0  # type: ignore[union-attr]


async def test_a_later_verdict_keeps_what_the_attempt_was_and_replaces_what_was_judged(store: Store) -> None:
    """A red-team attempt re-verified on the coordinator is still a red-team attempt; its old verdict's flags go."""
    (a,) = await stored(store, attempt(env="py-func", reward=0.0, flags=("red_team_escape", "truncated", "timeout")))
    assert await store.add_scores([(a.id, "2", 0.0, False, "ok", ["checked again"], ["sandbox_violation"])]) == 1
    again = await store.trajectory(a.id)
    assert again is not None and sorted(again.flags) == ["red_team_escape", "sandbox_violation", "truncated"]
    assert await store.add_scores([(a.id, "3", 0.0, False, "ok", [], ["truncated"])]) == 1
    third = await store.trajectory(a.id)
    assert third is not None and sorted(third.flags) == ["red_team_escape", "truncated"], "each flag once"


async def test_an_error_is_kept_never_current(store: Store) -> None:
    (a,) = await stored(store, attempt(env="py-func", reward=1.0))
    assert await store.add_scores([(a.id, "3", 0.0, False, "error", ["the verifier crashed"], [])]) == 1
    kept = await store.trajectory(a.id)
    assert kept is not None and (kept.reward, kept.status, kept.verdict_version) == (1.0, "ok", 0)
    assert [s.status for s in kept.scores] == ["ok", "error"]


async def test_pass_rates_read_once_follow_what_is_stored_and_every_later_verdict(store: Store) -> None:
    """Pass rates count what was stored since their last read, and read it all again once a verdict changed."""
    def rates(rs: list) -> dict[str, tuple[int, int, float | None]]:  # type: ignore[type-arg]
        return {r.env: (r.trajectories, r.passed, r.mean_reward) for r in rs}

    a, _ = await stored(store, attempt(env="py-func", reward=1.0), attempt(env="py-func", reward=0.0))
    assert rates(await store.pass_rates()) == {"py-func": (2, 1, 0.5)}
    await stored(store, attempt(env="py-func", reward=1.0), attempt(env=ENV, reward=1.0))
    assert rates(await store.pass_rates()) == {"py-func": (3, 2, 2 / 3), ENV: (1, 1, 1.0)}, "those stored since"
    await store.add_scores([(a.id, "2", 0.0, False, "ok", ["a stricter check"], [])])
    assert rates(await store.pass_rates()) == {"py-func": (3, 1, 1 / 3), ENV: (1, 1, 1.0)}, "a rescore, counted"
    assert await store.intake.quarantine(1, ENV, "a hedge passes") == 1
    assert rates(await store.pass_rates()) == {"py-func": (3, 1, 1 / 3)}, "a withdrawal, counted"
    await stored(store, attempt(env="py-func", reward=0.0))
    assert rates(await store.pass_rates()) == {"py-func": (4, 1, 0.25)}


async def test_a_withdrawal_is_current_for_good_and_listings_leave_it_out_unless_asked(store: Store) -> None:
    made = await stored(store, *(attempt(env=ENV, reward=1.0) for _ in range(3)),
                        attempt(env="py-func", reward=1.0))
    ours, other = made[:3], made[3]
    await store.add_scores([(ours[0].id, "2", 1.0, True, "ok", ["still right"], [])])
    assert await store.intake.quarantine(1, ENV, "a hedge passes") == 3
    for t in ours:
        now = await store.trajectory(t.id)
        assert now is not None and (now.reward, now.passed) == (0.0, False)
        assert set(now.flags) == {"quarantined", "withdrawn"} and now.reasons == ["withdrawn: a hedge passes"]
        assert now.scores[0].verdict_version == 0 and now.scores[0].reward == 1.0, "the first verdict, kept"
        assert now.verdict_version == now.scores[-1].verdict_version > 0
    assert [s.verifier_version for s in (await store.trajectory(ours[0].id)).scores] == ["1", "2", "2+quarantined"]  # type: ignore[union-attr]

    # Absent unless asked for; asked for, shown withdrawn; how many were left out is one count.
    assert {t.id for t in await store.trajectories(withdrawn=False)} == {other.id}
    assert {t.id for t in await store.trajectories()} == {t.id for t in made}
    assert await store.withdrawn_count() == 3 and await store.withdrawn_count(env="py-func") == 0
    assert await store.withdrawn_count(where=TrajectoryFilter(min_reward=0.5)) == 0, "narrowed by the verdict shown"
    assert [r.env for r in await store.pass_rates()] == ["py-func"], "no pass rate counts a withdrawn verdict"

    # Sticky: a later rescore is kept, and never makes it live again; a second quarantine adds nothing.
    assert await store.add_scores([(ours[1].id, "3", 1.0, True, "ok", ["rescored"], [])]) == 1
    again = await store.trajectory(ours[1].id)
    assert again is not None and again.reward == 0.0 and "withdrawn" in again.flags
    assert again.scores[-1].verifier_version == "3" and again.verdict_version != again.scores[-1].verdict_version
    mark = await store.verdicts.mark()
    assert await store.intake.quarantine(1, ENV, "again") == 0 and await store.verdicts.mark() == mark


async def test_a_quarantined_nodes_results_are_withdrawn_the_same_way(store: Store) -> None:
    made = await stored(store, *(dataclasses.replace(attempt(env="py-func"), node="fibber",
                                                     verified_by="node:fibber") for _ in range(2)))
    async with store.db.write() as db:  # stored as its node's word (the store stamps what its lease says)
        await db.execute("UPDATE trajectories SET verified_by='node:fibber'")
    # The coordinator's check disagrees first: its verdict is current, then the quarantine's.
    await store.add_scores([(made[0].id, "1", 0.0, False, "ok", ["verified again on the coordinator"], [])])
    assert (await store.trajectory(made[0].id)).reward == 0.0  # type: ignore[union-attr]
    done = await store.nodes.quarantine("fibber", "it passes wrong answers")
    assert done.withdrawn == 2
    for t in made:
        now = await store.trajectory(t.id)
        assert now is not None and "withdrawn" in now.flags and now.reward == 0.0
        assert (now.scores[0].reward, now.scores[0].verdict_version) == (1.0, 0), "the node's word stays first"
    first = await store.trajectory(made[0].id)
    assert first is not None and [s.reward for s in first.scores] == [1.0, 0.0, 0.0] and len(
        {s.verdict_version for s in first.scores}) == 3, "its word and the coordinator's under one verifier version"
    assert await store.trajectories(withdrawn=False) == []


async def test_a_coordinators_check_gives_its_verdict_confirms_an_agreeing_node_and_records_itself(store: Store) -> None:
    ours = verified_by_node("n1")
    agreed, disagreed, refused = await stored(store, *(dataclasses.replace(attempt(node="n1"), verified_by=ours)
                                                         for _ in range(3)))
    await store.nodes.reverified("n1", "reverify", (agreed.id, "1", 1.0, True, "ok", ["again"], []), "agreed",
                                 "passed", confirm=True)
    await store.nodes.reverified("n1", "reverify", (disagreed.id, "1", 0.0, False, "ok", ["a lie"], []), "disagreed",
                                 "the coordinator's verifier fails it", confirm=False)
    a, d = await store.trajectory(agreed.id), await store.trajectory(disagreed.id)
    assert a is not None and (a.verified_by, a.reward, a.reasons) == ("coordinator", 1.0, ["again"])
    assert d is not None and (d.verified_by, d.reward, d.passed) == (ours, 0.0, False), "a disagreement is not confirmed"
    assert [(s.reward, s.verdict_version > 0) for s in d.scores] == [(1.0, False), (0.0, True)]
    checks = {c.job_id: (c.kind, c.outcome, c.detail) for c in await store.nodes.checks("n1")}
    assert checks == {agreed.id: ("reverify", "agreed", "passed"),
                      disagreed.id: ("reverify", "disagreed", "the coordinator's verifier fails it")}
    # A verdict out of its domain is never given; the check is still recorded, and nothing else is confirmed.
    await store.nodes.reverified("n1", "reverify", (refused.id, "1", float("nan"), True, "ok", [], []),
                                 "inconclusive", "no verdict", confirm=False)
    r = await store.trajectory(refused.id)
    assert r is not None and (r.verified_by, r.reward, len(r.scores)) == (ours, 1.0, 1)
    assert {c.job_id: c.outcome for c in await store.nodes.checks("n1")}[refused.id] == "inconclusive"


async def test_giving_a_verdict_searches_the_new_scores_and_never_reads_every_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement of ``give`` is planned as searches by key, never a walk of the whole scores table or the
    whole trajectories table: the tables only grow, and the writer is held while it runs (before, making the newest
    score current walked every score ever given)."""
    async with traced_store(tmp_path / "farm.db", monkeypatch) as (store, seen):
        a, b = await stored(store, attempt(), attempt())
        assert await store.add_scores([(a.id, "2", 0.0, False, "ok", [], [])]) == 1  # scores to search among
        del seen[:]
        assert await store.add_scores([(b.id, "2", 0.0, False, "ok", ["again"], [])]) == 1
        given = list(seen)
        again = await store.trajectory(b.id)
        assert again is not None and (again.reward, again.reasons) == (0.0, ["again"])
    assert any("INSERT INTO scores" in sql for sql in given)
    assert not whole_walks(tmp_path / "farm.db", given, {"scores", "trajectories", "s", "t", "n"})


async def test_what_changed_since_a_mark_and_what_each_held_then(store: Store) -> None:
    a, b, c = await stored(store, attempt(env=ENV), attempt(env="py-func"), attempt(env="py-func"))
    assert await store.verdicts.changed(0, 10) == []
    await store.add_scores([(b.id, "2", 0.0, False, "ok", ["wrong after all"], [])])
    mark = await store.verdicts.mark()
    assert mark > 0
    await store.intake.quarantine(1, ENV, "hacked")
    await store.add_scores([(b.id, "3", 1.0, True, "ok", ["right again"], []), (c.id, "3", 1.0, True, "ok", [], [])])

    everything = await store.verdicts.changed(0, 10)
    assert [ch.trajectory_id for ch in everything] == [a.id, b.id, c.id], "in the order they last changed"
    since = await store.verdicts.changed(mark, 10)
    assert {ch.trajectory_id for ch in since} == {a.id, b.id, c.id}
    by_id = {ch.trajectory_id: ch for ch in since}
    assert by_id[a.id].withdrawn and by_id[a.id].withdrawal_reason == "hacked" and by_id[a.id].current is not None
    assert by_id[a.id].current.reward == 0.0 and by_id[a.id].scores[0].verdict_version == 0
    assert not by_id[b.id].withdrawn and [s.verifier_version for s in by_id[b.id].scores] == ["1", "2", "3"]
    # Paged by verdict version: the next page starts after the last one seen.
    first_page = await store.verdicts.changed(0, 1)
    assert [ch.trajectory_id for ch in await store.verdicts.changed(first_page[-1].verdict_version, 10)] == [b.id, c.id]

    held = await store.verdicts.at([a.id, b.id, c.id], mark)
    assert (held[a.id].reward, held[a.id].verdict_version) == (1.0, 0), "a was not yet withdrawn"
    assert (held[b.id].reward, held[b.id].verifier_version) == (0.0, "2"), "b's first rescore was current"
    assert (held[c.id].reward, held[c.id].verdict_version) == (1.0, 0)
    assert await store.verdicts.at([a.id, b.id, c.id], await store.verdicts.mark()) == {}, "nothing changed since now"

    # The task bank reads finished groups as of its mark.
    then = {g.id: g.rewards for g in await store.finished_groups(0, 10, as_of=mark)}
    now = {g.id: g.rewards for g in await store.finished_groups(0, 10)}
    assert (then[b.group_id], now[b.group_id]) == ([0.0], [1.0])
    assert (then[a.group_id], now[a.group_id]) == ([1.0], []), "a withdrawn verdict counts for nothing"


async def test_the_console_plots_count_current_verdicts_and_no_withdrawn_one(store: Store) -> None:
    made = await stored(store, *(attempt(env=ENV, reward=1.0) for _ in range(2)),
                        attempt(env="arith", reward=1.0), attempt(env="arith", reward=1.0))
    await store.add_scores([(made[2].id, "2", 0.0, False, "ok", [], ["timeout"])])
    await store.intake.quarantine(1, ENV, "hacked")
    buckets = {b.env: b for b in await store.activity.buckets(0.0, 1e12)}
    assert set(buckets) == {"arith"} and (buckets["arith"].trajectories, buckets["arith"].passed) == (2, 1)
    assert buckets["arith"].flags == {"timeout": 1}
    curve = await store.activity.learning_curve("torch:tiny", None, 10)
    assert sum(p.trajectories for p in curve) == 2 and sum(p.passed for p in curve) == 1


async def test_an_unreadable_record_is_still_a_stub_whatever_its_verdicts(store: Store) -> None:
    a, b = await stored(store, attempt(env=ENV), attempt(env=ENV))
    async with store.db.write() as db:
        await db.execute("UPDATE trajectories SET body=? WHERE id=?", (zlib.compress(b"{not json"), a.id))
    await store.add_scores([(a.id, "2", 0.0, False, "ok", [], []), (b.id, "2", 0.0, False, "ok", [], [])])
    stub = await store.trajectory(a.id)
    assert stub is not None and "unreadable" in stub.flags and stub.status == "error" and stub.verdict_version > 0
    assert all(s.verdict_version or s.reward == 1.0 for s in stub.scores), "its history, never a made-up verdict"
    await store.intake.quarantine(1, ENV, "hacked")
    listed = await store.trajectories(limit=10)
    assert [t.id for t in listed] == [a.id, b.id] and "unreadable" in listed[0].flags
    assert await store.trajectories(withdrawn=False) == []
    assert {c.trajectory_id for c in await store.verdicts.changed(0, 10)} == {a.id, b.id}


@pytest.mark.sqlite_only
def test_an_older_stores_later_scores_and_withdrawals_become_current_verdicts(tmp_path: Path) -> None:
    """A data dir of schema 13 (scores keyed by verifier version, the first verdict in the row for ever) migrates:
    each trajectory's newest score is its current verdict, a withdrawal stays current after a later rescore, and
    the first verdict is in its history."""
    import asyncio

    path = tmp_path / "farm.db"
    with sqlite3.connect(path) as db:
        for version in range(13):
            db.executescript(f"BEGIN; {MIGRATIONS[version]}; PRAGMA user_version={version + 1}; COMMIT;")
        db.execute("INSERT INTO groups(id, env, seed, difficulty, agent, size, source, created_at, done_seq, done_total) "
                   "VALUES (1, 'py-func', 5, 2, 'reference', 3, 'request', 1.0, 1, 3)")
        for tid in (1, 2, 3):
            db.execute("INSERT INTO jobs(id, group_id, env, seed, difficulty, agent, state, source, created_at, "
                       "updated_at) VALUES (?, 1, 'py-func', 5, 2, 'reference', 'done', 'request', 1.0, 1.0)", (tid,))
            db.execute("INSERT INTO trajectories(id, seq, group_id, env, env_version, seed, difficulty, agent, "
                       "policy_version, reward, passed, status, reasons, flags, verifier_version, body, node, "
                       "finished_at) VALUES (?, ?, 1, 'py-func', '1', 5, 2, 'reference', 0, 1.0, 1, 'ok', '[\"first\"]', "
                       "'[]', '1', ?, 'n', 10.0)", (tid, tid, zlib.compress(b'{"v": 2}')))
        scores = [(1, "2", 0.0, 0, "ok", '["rescored"]', "[]", 20.0),
                  (2, "1+quarantined", 0.0, 0, "ok", '["withdrawn: x"]', '["quarantined", "withdrawn"]', 20.0),
                  (2, "3", 1.0, 1, "ok", '["after"]', "[]", 30.0)]
        db.executemany("INSERT INTO scores VALUES (?,?,?,?,?,?,?,?)", scores)
        db.execute("INSERT INTO withdrawals(trajectory_id, env, reason, at) VALUES (2, 'py-func', 'x', 20.0)")

    async def read() -> None:
        store = await Store.open(path)
        try:
            one, two, three = [await store.trajectory(t) for t in (1, 2, 3)]
            assert one is not None and (one.reward, one.verifier_version, one.reasons) == (0.0, "2", ["rescored"])
            assert [(s.verifier_version, s.verdict_version > 0) for s in one.scores] == [("1", False), ("2", True)]
            assert two is not None and two.reward == 0.0 and "withdrawn" in two.flags, "a withdrawal stays current"
            assert [s.verifier_version for s in two.scores] == ["1", "1+quarantined", "3"]
            assert three is not None and three.verdict_version == 0 and three.reward == 1.0
            assert {c.trajectory_id for c in await store.verdicts.changed(0, 10)} == {1, 2}
            assert [t.id for t in await store.trajectories(withdrawn=False)] == [1, 3]
            # And a new later verdict numbers on past the old ones.
            await store.add_scores([(3, "2", 0.0, False, "ok", [], [])])
            later = await store.trajectory(3)
            assert later is not None and 5 < later.verdict_version <= await store.verdicts.mark(), "2 first + 3 scores"
        finally:
            await store.close()

    asyncio.run(read())
