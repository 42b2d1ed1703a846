"""The funnel end to end on a real store and real boxes: the shipped examples reach the review queue and,
approved, are served; each bad environment of the issue's list is rejected at the tier that should catch
it, with the finding that names what is wrong; reputation, bounties and quarantine follow the rules."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from farmd.errors import Conflict, FailedPrecondition, Forbidden
from farmd.intake import reputation
from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.funnel import Funnel
from farmd.intake.package import Package, pack, read_package
from farmd.intake.settings import IntakeConfig
from farmd.sandbox import Sandbox
from farmd.store import Store
from farmd.store.intake import CostRow
from farmd.taskbank import CHECK_HORIZON, SeedSequence
from farmd.verifier import VerifierKey
from tests.intake import defects
from tests.intake.contrib_example import EXAMPLE, written

pytestmark = [pytest.mark.sandbox]

KEY = VerifierKey(b"funnel-test-key-funnel-test-key!")
RUNNING_MAX = EXAMPLE.parent / "running-max"
CHEAP = IntakeConfig(seeds=(2, 2, 2), attack_budget=(2, 2, 2), tier2_tasks=1, tier2_sample=8)
"""Fewer seeds than a farm asks: the checks are the same, the test is cheaper."""


@dataclass
class Served:
    now: set[str] = field(default_factory=set)
    ever: list[str] = field(default_factory=list)

    async def serve(self, env: str, package: Package) -> None:
        assert package.manifest.env_name in env
        self.now.add(env)
        self.ever.append(env)

    async def unserve(self, env: str) -> None:
        self.now.discard(env)


@dataclass
class Intake:
    funnel: Funnel
    served: Served
    store: Store
    sandbox: Sandbox


@pytest.fixture
async def intake(tmp_path: Path) -> AsyncIterator[Intake]:
    store = await Store.open(tmp_path / "farm.db")
    served = Served()
    async with Sandbox() as sandbox:
        funnel = Funnel(store, sandbox, KEY, CHEAP, serve=served.serve, unserve=served.unserve)
        await funnel.start()
        try:
            yield Intake(funnel, served, store, sandbox)
        finally:
            await funnel.stop()
            await store.close()


def tarball(root: Path, replace: tuple[str, str] | None = None, version: str | None = None,
            levels: int | None = None) -> bytes:
    content = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    if replace is not None:
        source = content["env.py"].decode()
        assert replace[0] in source, replace[0]
        content["env.py"] = source.replace(*replace).encode()
    if version is not None:
        content["farm-env.toml"] = content["farm-env.toml"].replace(b'version = "1.0.0"', f'version = "{version}"'.encode())
    if levels is not None:
        content["farm-env.toml"] = content["farm-env.toml"].replace(b"levels = 3", f"levels = {levels}".encode())
    return pack(content.items())


def word_count(tmp_path: Path, replace: tuple[str, str] | None = None, version: str | None = None) -> bytes:
    return tarball(written(tmp_path / "wc-src"), replace, version)


async def placed(intake: Intake, data: bytes, state: str, who: str = "ada", bounty: int = 0):  # type: ignore[no-untyped-def]
    """A submission put in ``state`` without running its checks (tested elsewhere here): for the flows after."""
    package = read_package(data)
    m = package.manifest
    sid = await intake.store.intake.add_submission(
        contributor=who, name=m.name, version=m.version, domain=m.domain, kind=m.kind, levels=m.levels,
        digest=package.digest, package=data, bounty_id=bounty, seeds=2, attack_budget=2)
    assert sid is not None
    await intake.store.intake.set_state(sid, state, tier=3, decided=state == "approved")
    if state == "approved":
        await intake.served.serve(f"contrib:{m.name}@{m.version}", package)
    return await intake.funnel.submission(sid)


async def checked(intake: Intake, data: bytes, who: str = "ada", bounty: int = 0):  # type: ignore[no-untyped-def]
    sub = await intake.funnel.submit(who, data, bounty)
    await intake.funnel.idle()
    return await intake.funnel.submission(sub.id)


async def test_the_code_example_reaches_review(intake: Intake) -> None:
    """(The answer example's tiers: test_contributed_checks, test_tier2, and through farmd test_intake_farm.)"""
    sub = await checked(intake, tarball(RUNNING_MAX), who="grace")
    assert sub.state == "in_review" and sub.tier == 3, [sub.detail, *[str(x) for x in sub.findings]]
    assert not [x for x in sub.findings if x.blocking]
    assert {c.tier for c in sub.costs} == {1, 2} and all(c.box_cpu_s > 0 and c.box_calls for c in sub.costs)
    assert sub.seeds == CHEAP.seeds[0] and sub.library, "a new contributor gets the most seeds"


async def test_an_approved_version_is_served_and_its_bounty_paid(intake: Intake) -> None:
    f = intake.funnel
    bounty = await f.post_bounty("op", domain="text", requirements="counting tasks", payout_min=50, payout_max=100,
                                 wanted=1, min_reputation=0)
    await f.claim(bounty.id, "ada")
    data = tarball(EXAMPLE)
    sub = await placed(intake, data, "in_review", bounty=bounty.id)
    await intake.store.intake.record_tier(sub.id, 1, 1, [], CostRow(1, box_cpu_s=1.0, box_calls=10), mutants=(4, 3))
    with pytest.raises(Forbidden):
        await f.review(sub.id, "ada", approve=True, note="mine")  # nobody reviews their own
    done = await f.review(sub.id, "rita", approve=True, note="tasks vary; verifier exact", minutes=12)
    assert done.state == "approved" and done.reviewer == "rita"
    assert intake.served.now == {"contrib:word-count@1.0.0"}
    assert [c.review_s for c in done.costs if c.tier == 3] == [720]
    standing = await f.contributor("ada")
    assert standing.row.reputation == reputation.ACCEPTED
    assert standing.row.paid == 87.5, "the floor, and the range times the share of mutants killed"
    [paid] = await f.bounties()
    assert paid.accepted == 1 and not paid.open
    figures = await f.figures()
    assert figures.accepted == 1 and figures.payouts_usd == 87.5
    assert figures.usd_per_accepted == pytest.approx(87.5 + 1 / 3600 * CHEAP.box_cpu_hour_usd + 0.2 * 60)


WORD_COUNT_BAD = {
    "an always-true verifier": (
        ('ok = final.strip() == str(task["hidden"]["count"])', "ok = True"), 1, "check_rejects_wrong"),
    "a generator that repeats one task": (
        ("words = [rng.choice(WORDS) for _ in range(4 + 4 * difficulty)]\n        target = rng.choice(words)",
         "words = WORDS[:4] * difficulty\n        target = words[0]"), 1, "check_seeds_distinct"),
    "a reference that fails": (('return str(task["hidden"]["count"])', 'return "0"'), 1, "check_reference_passes"),
    "a generator that is not deterministic": (
        ("words = [rng.choice(WORDS)", "import random as r\n        words = [r.choice(WORDS)"), 1, "check_generates"),
    "an answer in the public task": (
        ('"public": {"target": target}', '"public": {"target": target, "expected": words.count(target)}'), 1,
        "check_reference_passes"),
    "a verifier that gives credit for hedging": (
        ('ok = final.strip() == str(task["hidden"]["count"])', 'ok = str(task["hidden"]["count"]) in final'), 1,
        "check_rejects_wrong"),
    "a verifier that reads another environment's key": (
        ("words = [rng.choice(WORDS)", "words = [open('/var/lib/farm/verifier.key').read()] + [rng.choice(WORDS)"),
        1, "check_generates"),
}
_RM_VERIFY = RUNNING_MAX / "env.py"
_IN_CHILD = '''        child = subprocess.run([sys.executable, "-I", "-S", "-c", CHECKER], capture_output=True, timeout=1,
                               input=json.dumps({"code": final, "cases": [[xs, running_max(xs)] for xs in cases]}).encode())
        ok = child.stdout.decode().strip().endswith("true")
        return {"reward": float(ok), "passed": ok, "reasons": []}
'''
_CHECKER = '''CHECKER = r"""
import json, sys
request = json.loads(sys.stdin.read())
scope = {}
exec(request["code"], scope)
ok = True
for xs, expected in request["cases"]:
    ok = ok and scope["running_max"](list(xs)) == expected
print("PASS" if ok else "FAIL")
print(json.dumps(ok))
"""
TIMEOUT_S = 1
'''
_VERIFY_START = "    def verify(self, task, final):\n        cases = task[\"hidden\"][\"cases\"]\n"
RUNNING_MAX_BAD = {
    "a verifier that calls the submission's __eq__": (
        (_VERIFY_START, _VERIFY_START + "        try:\n            scope = {}\n            exec(final, scope)\n"
         "            ok = all(scope['running_max'](list(xs)) == running_max(xs) for xs in cases)\n"
         "        except Exception:\n            ok = False\n"
         "        return {'reward': float(ok), 'passed': ok, 'reasons': []}\n"), "always-equal"),
    "a verifier that hands the expected answers into the box": (
        (_VERIFY_START, _VERIFY_START + _IN_CHILD), "walk-frames"),
    "a verifier that parses stdout for PASS": (
        (_VERIFY_START, _VERIFY_START + _IN_CHILD.replace('.strip().endswith("true")', ".count('PASS') > 0")),
        "fake-report-stdout"),
    "a verifier that scores a timeout as a pass": (
        ('return {"reward": 0.0, "passed": False, "reasons": [f"timed out after {TIMEOUT_S} s"]}',
         'return {"reward": 1.0, "passed": True, "reasons": ["slow but fine"]}'), "hang"),
    "a verifier that hard-codes the public examples": (
        (_VERIFY_START, "    def verify(self, task, final):\n        cases = [e['input'][0] for e in "
                        "task['public']['examples']]\n"), "special-case-examples"),
}


@pytest.mark.parametrize("name", list(WORD_COUNT_BAD))
async def test_a_bad_answer_environment_is_rejected_at_tier_1(intake: Intake, tmp_path: Path, name: str) -> None:
    replace, tier, check = WORD_COUNT_BAD[name]
    sub = await checked(intake, word_count(tmp_path, replace))
    assert (sub.state, sub.tier) == ("rejected", tier), sub.detail
    assert check in {x.check for x in sub.findings if x.blocking}, [str(x) for x in sub.findings]
    assert sub.detail.startswith(f"rejected at tier {tier}")
    ledger = (await intake.funnel.contributor("ada")).ledger
    assert [r.delta for r in ledger] == [reputation.REJECTED_TIER1]
    assert not intake.served.ever


@pytest.mark.parametrize("name", list(RUNNING_MAX_BAD))
async def test_a_bad_code_environment_is_rejected_at_tier_2_by_the_exploit_it_allows(intake: Intake, name: str
                                                                                     ) -> None:
    (old, new), exploit = RUNNING_MAX_BAD[name]
    replace = (old, new)
    if "CHECKER" in new:  # the checker program the bad verifier runs, defined beside its own
        source = _RM_VERIFY.read_text().replace(old, new).replace("TIMEOUT_S = 1\n", _CHECKER)
        replace = (_RM_VERIFY.read_text(), source)
    sub = await checked(intake, tarball(RUNNING_MAX, replace, levels=2))  # two levels: the same faults, cheaper
    assert (sub.state, sub.tier) == ("rejected", 2), [sub.detail, *[str(x) for x in sub.findings]]
    blocking = [x for x in sub.findings if x.blocking]
    # A verdict read from what the child prints is forged from the verifier's own runs too (test_probes); and a
    # verifier that checks only the public examples takes a constant function on a task whose examples share one
    # output (tier 2 draws its tasks afresh for each submission): the same fault, found by another probe.
    assert "tier2_exploit" in {x.check for x in blocking} <= {"tier2_exploit", "tier2_forged_output", "tier2_constant"}
    assert any(exploit in x.evidence for x in blocking), [x.evidence for x in blocking]
    assert all("submitted" in x.evidence and "reward" in x.evidence for x in blocking), "the exploit is the evidence"


async def test_an_environment_that_writes_outside_its_box_leaves_nothing_and_is_rejected(intake: Intake,
                                                                                       tmp_path: Path) -> None:
    escape = tmp_path / "escaped"
    sub = await checked(intake, word_count(tmp_path, (
        "words = [rng.choice(WORDS)", f"open({str(escape)!r}, 'w').write('out')\n        words = [rng.choice(WORDS)")))
    assert (sub.state, sub.tier) == ("rejected", 1)
    assert "check_generates" in {x.check for x in sub.findings}
    assert "scan_outside_files" in {x.check for x in sub.findings if not x.blocking}, "the scan noted it too"
    assert not escape.exists()


async def test_a_version_is_checked_once_and_a_name_is_its_authors(intake: Intake, tmp_path: Path) -> None:
    f = intake.funnel
    await placed(intake, tarball(EXAMPLE), "in_review")
    with pytest.raises(Conflict):
        await f.submit("ada", tarball(EXAMPLE))
    with pytest.raises(Forbidden):
        await f.submit("mallory", tarball(EXAMPLE, version="9.9.9"))


async def test_bounties_are_gated_by_reputation(intake: Intake) -> None:
    f = intake.funnel
    rich = await f.post_bounty("op", domain="text", requirements="hard ones", payout_min=200, payout_max=400,
                               wanted=5, min_reputation=0)
    gated = await f.post_bounty("op", domain="text", requirements="for the known", payout_min=10, payout_max=20,
                                wanted=5, min_reputation=15)
    with pytest.raises(Forbidden):  # a new contributor claims low-value bounties only
        await f.claim(rich.id, "newbie")
    with pytest.raises(Forbidden):
        await f.claim(gated.id, "newbie")
    await intake.store.intake.credit("vet", 35, "accepted environments earlier")
    assert "vet" in (await f.claim(rich.id, "vet")).claimants
    assert "vet" in (await f.claim(gated.id, "vet")).claimants
    assert (await f.standing("vet")).name == "trusted" and (await f.standing("newbie")).name == "new"
    with pytest.raises(FailedPrecondition):  # a submission under a bounty it did not claim
        await f.submit("newbie", tarball(EXAMPLE), rich.id)


async def test_a_planted_exploit_tanks_its_author_and_sends_their_other_versions_back(intake: Intake) -> None:
    f = intake.funnel
    first = await placed(intake, tarball(EXAMPLE), "approved")
    second = await placed(intake, tarball(EXAMPLE, version="1.1.0"), "in_review")
    planted = await placed(intake, tarball(EXAMPLE, version="1.2.0"), "in_review")
    await f.review(planted.id, "rita", approve=False, planted=True, note="accepts any answer ending in ' please'")
    standing = await f.contributor("ada")
    assert standing.row.tanked and standing.trust.name == "tanked" and standing.trust.max_payout == 0
    assert standing.ledger[0].reason.endswith("for a planted exploit")
    again = [await f.submission(first.id), await f.submission(second.id)]
    assert all(s.state == "checking" and s.rounds == 2 and s.seeds == CHEAP.seeds[0] for s in again), \
        "back for full review, from tier 1"
    assert "contrib:word-count@1.0.0" not in intake.served.now, "not served while it is reviewed again"
    await intake.store.intake.credit("ada", 5000, "a later good deed")
    assert (await f.standing("ada")).name == "tanked", "for good"


async def test_a_quarantine_stops_serving_and_costs_reputation(intake: Intake) -> None:
    f = intake.funnel
    sub = await placed(intake, tarball(EXAMPLE), "in_review")
    with pytest.raises(FailedPrecondition):
        await f.quarantine(sub.id, "rita", "too early")
    await f.review(sub.id, "rita", approve=True, note="fine")
    assert intake.served.now == {"contrib:word-count@1.0.0"}
    quarantined, withdrawn = await f.quarantine(sub.id, "redteam", "a new exploit earns reward")
    assert quarantined.state == "quarantined" and withdrawn == 0
    assert not intake.served.now
    ledger = (await f.contributor("ada")).ledger
    assert [r.delta for r in ledger] == [reputation.QUARANTINED, reputation.ACCEPTED]
    assert json.dumps(dataclasses.asdict(await f.figures()))


async def test_an_accepted_version_that_serves_soundly_earns_reputation_once(intake: Intake) -> None:
    import dataclasses

    from tests.store.test_store import traj

    f = intake.funnel
    sub = await placed(intake, tarball(EXAMPLE), "in_review")
    await f.review(sub.id, "rita", approve=True, note="fine")
    sound = Funnel(intake.store, None, KEY, dataclasses.replace(CHEAP, sound_after=2), serve=intake.served.serve,
                   unserve=intake.served.unserve)
    assert await sound.credit_sound() == 0, "not yet: nothing served"
    (group,) = await intake.store.enqueue([(sub.env, 1, 1, "reference", 2)])
    jobs = await intake.store.lease("w", 2, 30, policy_version=0)
    await intake.store.complete([("w", dataclasses.replace(traj(j.id, group), env=sub.env)) for j in jobs])
    assert await sound.credit_sound() == 1
    assert await sound.credit_sound() == 0, "once"
    standing = await f.contributor("ada")
    assert standing.row.reputation == reputation.ACCEPTED + reputation.PROVED_SOUND
    assert standing.ledger[0].reason.startswith(f"{sub.env} proved sound over 2 trajectories")


async def test_an_accepted_version_is_attacked_again_when_the_library_grows_and_quarantined_if_it_falls(
        intake: Intake) -> None:
    hedge = tarball(EXAMPLE, ('ok = final.strip() == str(task["hidden"]["count"])',
                              'ok = str(task["hidden"]["count"]) in final'))
    sub = await placed(intake, hedge, "approved")  # accepted before the library knew the hedges, say
    assert sub.library == ""
    again = Funnel(intake.store, intake.sandbox, KEY, CHEAP, serve=intake.served.serve,
                   unserve=intake.served.unserve)
    await again.start()
    await again.idle()
    await again.stop()
    after = await intake.funnel.submission(sub.id)
    assert after.state == "quarantined" and "quarantined by the exploit library" in after.detail, after.detail
    assert any(f.check == "tier2_exploit" and f.blocking for f in after.findings)
    assert sub.env not in intake.served.now


class Watched(Funnel):
    """A funnel that keeps the environments it checks through: what each box was asked is in their calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.envs: list[BoxedEnvironment] = []

    def _environment(self, package: Package) -> BoxedEnvironment:
        env = super()._environment(package)
        self.envs.append(env)
        return env


async def test_a_slow_or_costly_submission_holds_one_slot_for_a_bounded_time_and_is_refused(tmp_path: Path) -> None:
    """Two costly submissions first, then an honest one: each costly one is refused after its first few
    verdicts (CPU seconds, or wall seconds, as its boxes measured them, well within what its manifest declared),
    while the honest one is checked beside them and reaches review, on the seeds production will serve. (A
    submission's box seconds in all are bounded too: test_boxed.)"""
    config = IntakeConfig(seeds=(2, 2, 2), attack_budget=(2, 2, 2), tier2_tasks=1, tier2_sample=8,
                          parallel_checks=2, verdict_cpu_s=0.3, verdict_wall_s=4.0)
    sleepy_source = defects.WORD_COUNT.replace(*defects.SLEEP).replace("1.5", "6")
    burner_source = defects.WORD_COUNT.replace(*defects.BURN)
    store = await Store.open(tmp_path / "farm.db")
    served = Served()
    async with Sandbox() as sandbox:
        funnel = Watched(store, sandbox, KEY, config, serve=served.serve, unserve=served.unserve)
        try:
            # Far within what their manifests declare (verify_s = 30): the farm's budget is what counts.
            sleepy = await funnel.submit("mallory", defects.packed("sleepy", sleepy_source, entry="env.py:WordCount",
                                                                   verify_s=30))
            burner = await funnel.submit("mallory", defects.packed("burner", burner_source, entry="env.py:WordCount",
                                                                   verify_s=30))
            honest = await funnel.submit("ada", tarball(EXAMPLE))
            await funnel.idle()
            results = [await funnel.submission(s.id) for s in (sleepy, burner, honest)]
        finally:
            await funnel.stop()
            await store.close()
    sleepy, burner, honest = results
    assert honest.state == "in_review", [honest.detail, *[str(x) for x in honest.findings]]
    for slow, what in ((sleepy, "seconds of wall time"), (burner, "CPU seconds")):
        assert slow.state == "rejected", [slow.detail, *[str(x) for x in slow.findings]]
        blocking = [x for x in slow.findings if x.blocking]
        assert len(blocking) == 1, [str(x) for x in slow.findings]
        [cost] = blocking
        assert cost.check == "tier2_cost" and "checking stopped" in cost.evidence and what in cost.evidence
        assert sum(c.box_calls for c in slow.costs) < 40, "refused after its first few verdicts, not after all"

    # The honest one was checked on the seeds production will serve: not small integers, not a range of its own,
    # but the task bank's keyed sequence (which no environment can tell from random draws), from the stretch
    # production hands out first.
    env = next(e for e in funnel.envs if e.manifest.name == "word-count")
    examples = {json.loads(data)["seed"] for _, data in env.package.examples("good") + env.package.examples("bad")}
    calls = [c for c in env.calls if c.seed not in examples]  # the contributor's examples name their own seeds
    level_1 = {c.seed for c in calls if c.difficulty == 1}
    assert len(level_1) >= config.seeds[0] + 2, "tier 1's seeds and tier 2's tasks and sample"
    production = SeedSequence.keyed(KEY.seed)
    assert production == funnel.seeds, "the bank's sequence: the daemon hands the scheduler the same one"
    assert all(production.index(honest.env, 1, s) < CHECK_HORIZON for s in level_1)
    for level in (2, 3):  # tier 2's tasks at each level are drawn from that level's own sequence
        drawn = {c.seed for c in calls if c.difficulty == level} - level_1
        assert drawn and all(production.index(honest.env, level, s) < CHECK_HORIZON for s in drawn)
    assert min(c.seed for c in calls) >= 1 << 16
