"""farmctl's intake commands on the wire: against a small in-process IntakeService with canned answers (a test
double of farmd's, for what the CLI sends and how it shows what comes back; farmd's own service has its tests)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner, Result
from farm.v1 import intake_pb2, intake_pb2_grpc
from farm_client.convert import duration, money, seconds
from google.protobuf.timestamp_pb2 import Timestamp

from farmd.cli import intake_cmd
from farmd.cli.farmctl import cli
from farmd.errors import PackageError
from farmd.intake.package import pack, read_package
from tests.cli.hostile import HOSTILE, SHOWN, assert_shown_safely

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "word-count"
S = intake_pb2
# A terminal wide enough that no table wraps a cell (the escaped text is found whole); no client settings of
# the machine running the tests.
ENV = {"COLUMNS": "1000", "FARM_TOKEN": None, "FARM_TOKEN_FILE": None, "FARM_TLS_CA": None, "FARM_TLS_CERT": None,
       "FARM_TLS_KEY": None}


def _at(seconds: float) -> Timestamp:
    return Timestamp(seconds=int(seconds), nanos=round((seconds - int(seconds)) * 1e9))


def canned_submission(text: str = "word-count") -> intake_pb2.Submission:
    """A submission in review with every field set (``text`` wherever a contributor or reviewer chose it)."""
    return S.Submission(
        id=7, name=text, version="1.0.0", env=f"contrib:{text}@1.0.0", contributor=text, domain=text, kind="answer",
        levels=3, digest="ab" * 32, state=S.SUBMISSION_STATE_IN_REVIEW, tier=2, detail=text,
        findings=[S.Finding(tier=1, check="mutants", evidence=text, fix=text, blocking=False),
                  S.Finding(tier=2, check="exploit:empty-answer", evidence=f"submitted ''\nearned 1.0 {text}",
                            fix="reject an empty answer", blocking=True)],
        costs=[S.TierCost(tier=1, box_cpu=duration(1.5), box_wall=duration(2.25), box_calls=12, cost=money(0.01)),
               S.TierCost(tier=2, box_cpu=duration(3.0), attacker_tokens=5 << 33, cost=money(0.5)),
               S.TierCost(tier=0, box_cpu=duration(4.5), box_wall=duration(2.25), box_calls=12, attacker_tokens=5 << 33,
                          cost=money(0.51))],
        mutation_share=0.9, mutants=10, mutants_killed=9, seeds=8, attack_budget=20, bounty_id=3, reviewer=text,
        review_note=text, created_at=_at(1_700_000_000.25), trajectories=1 << 40, withdrawn=0, rounds=1)


@dataclass
class CannedIntake(intake_pb2_grpc.IntakeServiceServicer):
    """What a client sent, and canned answers: a submission is CHECKING when sent and IN_REVIEW when next asked."""

    submitted: list[list[intake_pb2.SubmitRequest]] = field(default_factory=list)
    submissions: dict[int, intake_pb2.Submission] = field(default_factory=dict)
    reviews: list[intake_pb2.ReviewSubmissionRequest] = field(default_factory=list)
    quarantines: list[intake_pb2.QuarantineSubmissionRequest] = field(default_factory=list)
    bounties: list[intake_pb2.PostBountyRequest] = field(default_factory=list)
    text: str = "word-count"

    def Submit(self, request_iterator: Iterator[Any], context: Any) -> Any:
        requests = list(request_iterator)
        self.submitted.append(requests)
        try:
            package = read_package(b"".join(r.data for r in requests))
        except PackageError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        m = package.manifest
        s = S.Submission(id=len(self.submissions) + 1, name=m.name, version=m.version, env=f"{m.env_name}@{m.version}",
                         contributor=requests[0].contributor or "anonymous", digest=package.digest,
                         state=S.SUBMISSION_STATE_CHECKING, tier=1, detail="tier 1: reading the package",
                         bounty_id=requests[0].bounty_id)
        self.submissions[s.id] = s
        return S.SubmitResponse(submission=s)

    def GetSubmission(self, request: Any, context: Any) -> Any:
        if request.id not in self.submissions:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no submission {request.id}")
        s = self.submissions[request.id]
        if s.state == S.SUBMISSION_STATE_CHECKING and s.contributor == "mallory":  # the tiers ran while it was asked
            s.state, s.tier, s.detail = S.SUBMISSION_STATE_REJECTED, 2, "an exploit earned 1.0"
        elif s.state == S.SUBMISSION_STATE_CHECKING:
            s.state, s.tier, s.detail = S.SUBMISSION_STATE_IN_REVIEW, 2, "survived tiers 1 and 2"
            s.findings.append(S.Finding(tier=1, check="mutants", evidence=self.text, fix="", blocking=False))
        return S.GetSubmissionResponse(submission=s)

    def ListSubmissions(self, request: Any, context: Any) -> Any:
        rows = [s for s in self.submissions.values() if request.state in (0, s.state)]
        return S.ListSubmissionsResponse(submissions=rows)

    def ReviewSubmission(self, request: Any, context: Any) -> Any:
        self.reviews.append(request)
        s = self.submissions[request.id]
        s.state = S.SUBMISSION_STATE_APPROVED if request.approve else S.SUBMISSION_STATE_REJECTED
        s.reviewer, s.review_note = "operator", request.note
        return S.ReviewSubmissionResponse(submission=s)

    def QuarantineSubmission(self, request: Any, context: Any) -> Any:
        self.quarantines.append(request)
        if self.submissions[request.id].state != S.SUBMISSION_STATE_APPROVED:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"submission {request.id} is not approved")
        s = self.submissions[request.id]
        s.state, s.trajectories, s.withdrawn = S.SUBMISSION_STATE_QUARANTINED, 40, 40
        return S.QuarantineSubmissionResponse(submission=s, withdrawn=40)

    def ListBounties(self, request: Any, context: Any) -> Any:
        return S.ListBountiesResponse(bounties=[self._bounty()])

    def PostBounty(self, request: Any, context: Any) -> Any:
        self.bounties.append(request)
        return S.PostBountyResponse(bounty=self._bounty())

    def ClaimBounty(self, request: Any, context: Any) -> Any:
        if request.id != 3:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "your reputation 0.0 is below this bounty's 2.0")
        return S.ClaimBountyResponse(bounty=self._bounty())

    def GetContributor(self, request: Any, context: Any) -> Any:
        return S.GetContributorResponse(contributor=S.Contributor(
            name=request.name or self.text, reputation=1.25, trust=self.text, seeds=8, attack_budget=20,
            bounty_cap=money(100.0), submitted=3, accepted=1, rejected=2, total_paid=money(75.0),
            ledger=[S.LedgerEntry(seq=1, delta=1.0, balance=1.0, reason=self.text, submission_id=7, at=_at(1e9)),
                    S.LedgerEntry(seq=2, delta=0.25, balance=1.25, reason="accepted", at=_at(2e9))]))

    def GetFunnel(self, request: Any, context: Any) -> Any:
        return S.GetFunnelResponse(states={"checking": 1, "in_review": 2, self.text: 1 << 40},
                                   tiers=[S.TierCost(tier=1, box_cpu=duration(10.0), cost=money(1.0))], accepted=2,
                                   payouts=money(150.0), total_cost=money(160.0), cost_per_accepted=money(80.0),
                                   per_accepted=S.TierCost(box_cpu=duration(5.0), cost=money(0.00042)))

    def _bounty(self) -> intake_pb2.Bounty:
        return S.Bounty(id=3, domain=self.text, requirements=self.text, pay_min=money(50), pay_max=money(200), wanted=2,
                        min_reputation=0.5, accepted=1, claimants=[self.text], open=True, posted_by=self.text,
                        created_at=_at(1e9), total_paid=money(75.0))


@pytest.fixture
def intake() -> Iterator[tuple[CannedIntake, str]]:
    service = CannedIntake()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    intake_pb2_grpc.add_IntakeServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield service, f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()


def farmctl(addr: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--addr", addr, *args], env=ENV)


def test_submit_sends_exactly_the_checked_package_in_chunks(intake: tuple[CannedIntake, str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    service, addr = intake
    monkeypatch.setattr(intake_cmd, "CHUNK_BYTES", 512)
    result = farmctl(addr, "submit", str(EXAMPLE), "--bounty", "3", "--contributor", "ada", "--json")
    assert result.exit_code == 0, result.output
    (requests,) = service.submitted
    assert len(requests) > 1 and all(len(r.data) <= 512 for r in requests)
    assert (requests[0].bounty_id, requests[0].contributor) == (3, "ada")
    assert all(r.bounty_id == 0 and not r.contributor for r in requests[1:]), "the first message carries them"
    received = read_package(b"".join(r.data for r in requests))
    assert received.digest == read_package(EXAMPLE).digest
    shown = json.loads(result.stdout)
    assert (shown["id"], shown["state"], shown["digest"], shown["bounty_id"]) == (1, "checking", received.digest, 3)

    said = farmctl(addr, "submit", str(EXAMPLE))
    assert said.exit_code == 0 and "submission 2 (contrib:word-count@1.0.0) checking at tier 1" in said.stdout

    tarball = tmp_path / "word-count.tar.gz"  # a tarball of the directory, top folder and all
    tarball.write_bytes(pack((f"word-count/{name}", data) for name, data in read_package(EXAMPLE).files.items()))
    assert farmctl(addr, "submit", str(tarball)).exit_code == 0
    assert read_package(b"".join(r.data for r in service.submitted[-1])).digest == received.digest


def test_submit_wait_polls_until_the_tiers_have_ruled(intake: tuple[CannedIntake, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, addr = intake
    monkeypatch.setattr(intake_cmd, "POLL_S", 0.01)
    result = farmctl(addr, "submit", str(EXAMPLE), "--wait")
    assert result.exit_code == 0, result.output
    assert "in review at tier 2: survived tiers 1 and 2" in result.stdout and "findings: 1 (0 blocking)" in result.stdout
    waited = json.loads(farmctl(addr, "submit", str(EXAMPLE), "--wait", "--json").stdout)
    assert (waited["id"], waited["state"], waited["tier"]) == (2, "in_review", 2)
    refused = farmctl(addr, "submit", str(EXAMPLE), "--contributor", "mallory", "--wait", "--json")
    assert refused.exit_code == 1, "a rejection ends --wait with 1, as a failed rollout ends run --wait"
    assert json.loads(refused.stdout)["state"] == "rejected"


def test_a_broken_package_is_refused_here_with_every_problem_and_nothing_is_sent(
        intake: tuple[CannedIntake, str], tmp_path: Path) -> None:
    service, addr = intake
    broken = tmp_path / "broken"
    shutil.copytree(EXAMPLE, broken)
    manifest = broken / "farm-env.toml"
    manifest.write_text(manifest.read_text().replace("levels = 3", "levels = 0").replace('kind = "answer"',
                                                                                            'kind = "poem"'))
    result = farmctl(addr, "submit", str(broken))
    assert result.exit_code == 2
    assert "levels must be a whole number from 1 to 10" in result.stderr and "kind must be one of" in result.stderr
    error = json.loads(farmctl(addr, "submit", str(broken), "--json").stdout)["error"]
    assert error["code"] == "PACKAGE_ERROR" and "levels" in error["message"] and "kind" in error["message"]
    assert service.submitted == [], "nothing was sent"


def test_submission_show_json_has_every_field_as_sent(intake: tuple[CannedIntake, str]) -> None:
    service, addr = intake
    sent = canned_submission(HOSTILE)
    sent.ClearField("decided_at")
    service.submissions[7] = sent
    doc = json.loads(farmctl(addr, "submission", "show", "7", "--json").stdout)
    assert set(doc) == {f.name for f in S.Submission.DESCRIPTOR.fields}, "every field, set or not"
    assert (doc["id"], doc["state"], doc["tier"], doc["trajectories"]) == (7, "in_review", 2, 1 << 40)
    assert (doc["name"], doc["detail"], doc["digest"]) == (HOSTILE, HOSTILE, "ab" * 32), "--json stays exact"
    assert doc["findings"][1] == {"tier": 2, "check": "exploit:empty-answer", "fix": "reject an empty answer",
                                  "evidence": f"submitted ''\nearned 1.0 {HOSTILE}", "blocking": True}
    # Durations in seconds and money in dollars; an unset Duration (nothing measured) is null.
    assert doc["costs"][1] == {"tier": 2, "box_cpu": 3.0, "box_wall": None, "box_calls": 0,
                               "attacker_tokens": 5 << 33, "review": None, "cost": 0.5}
    assert (doc["mutation_share"], doc["mutants_killed"], doc["mutants"]) == (0.9, 9, 10)
    assert (doc["created_at"], doc["decided_at"]) == (1_700_000_000.25, None)
    assert (doc["reviewer"], doc["review_note"], doc["bounty_id"]) == (HOSTILE, HOSTILE, 3)
    sent.ClearField("mutation_share")
    assert json.loads(farmctl(addr, "review", "show", "7", "--json").stdout)["mutation_share"] is None

    listed = json.loads(farmctl(addr, "submission", "list", "--state", "in_review", "--json").stdout)
    assert [s["id"] for s in listed] == [7]
    assert json.loads(farmctl(addr, "submission", "list", "--state", "approved", "--json").stdout) == []


def test_untrusted_text_is_shown_escaped_never_raw(intake: tuple[CannedIntake, str]) -> None:
    service, addr = intake
    service.text = HOSTILE
    service.submissions[7] = canned_submission(HOSTILE)
    shown = farmctl(addr, "submission", "show", "7")
    assert shown.exit_code == 0, shown.output
    assert_shown_safely(shown.stdout)
    assert "mutation share: 9/10 (90%)" in shown.stdout and "blocking" in shown.stdout
    assert "\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout
    for command in (["submission", "list"], ["review", "list"], ["review", "show", "7"], ["bounty", "list"],
                    ["bounty", "claim", "3"], ["contributor", "show"], ["funnel"]):
        result = farmctl(addr, *command)
        assert result.exit_code == 0, (command, result.output)
        assert_shown_safely(result.stdout)
        assert SHOWN in result.stdout, command


def test_reviews_need_a_note(intake: tuple[CannedIntake, str]) -> None:
    service, addr = intake
    service.submissions[7] = canned_submission()
    missing = farmctl(addr, "review", "reject", "7")
    assert missing.exit_code == 2 and "--note" in missing.stderr
    blank = farmctl(addr, "review", "reject", "7", "--note", "  ")
    assert blank.exit_code == 2 and "--note" in blank.stderr
    assert service.reviews == [], "nothing was sent"

    rejected = json.loads(farmctl(addr, "review", "reject", "7", "--note", "rewards empty answers", "--planted",
                                  "--minutes", "4.5", "--json").stdout)
    (request,) = service.reviews
    assert (request.id, request.approve, request.note, request.planted, seconds(request.review_time)) == \
        (7, False, "rewards empty answers", True, 270.0)
    assert (rejected["state"], rejected["review_note"]) == ("rejected", "rewards empty answers")
    approved = farmctl(addr, "review", "approve", "7", "--note", "fine")
    assert approved.exit_code == 0 and "approved" in approved.stdout and service.reviews[-1].approve


def test_farmd_errors_are_one_clear_line(intake: tuple[CannedIntake, str]) -> None:
    service, addr = intake
    missing = farmctl(addr, "submission", "show", "99")
    assert missing.exit_code == 1
    assert missing.stderr == f"error: {addr}: NOT_FOUND: no submission 99\n"
    service.submissions[7] = canned_submission()
    refused = json.loads(farmctl(addr, "quarantine", "7", "--reason", "hack", "--json").stdout)
    assert refused == {"error": {"code": "FAILED_PRECONDITION", "message": f"{addr}: submission 7 is not approved"}}
    denied = farmctl(addr, "bounty", "claim", "4")
    assert denied.exit_code == 1 and "PERMISSION_DENIED: your reputation 0.0" in denied.stderr


def test_quarantine_bounties_contributor_funnel(intake: tuple[CannedIntake, str]) -> None:
    service, addr = intake
    service.submissions[7] = canned_submission()
    assert farmctl(addr, "quarantine", "7").exit_code == 2, "--reason is required"
    farmctl(addr, "review", "approve", "7", "--note", "fine")
    done = farmctl(addr, "quarantine", "7", "--reason", "prints the answer", "--planted")
    assert done.exit_code == 0 and "40 trajectories withdrawn" in done.stdout
    assert (service.quarantines[0].reason, service.quarantines[0].planted) == ("prints the answer", True)

    posted = json.loads(farmctl(addr, "bounty", "post", "--domain", "text", "--requirements", "counts words",
                                "--payout", "50-200", "--wanted", "2", "--min-reputation", "0.5", "--json").stdout)
    assert posted["id"] == 3 and posted["created_at"] == 1e9
    (request,) = service.bounties
    assert (request.pay_min, request.pay_max, request.wanted, request.min_reputation) == (
        money(50), money(200), 2, 0.5), "money as google.type.Money, in USD"
    assert farmctl(addr, "bounty", "post", "--domain", "d", "--requirements", "r", "--payout", "200-50",
                   "--wanted", "1").exit_code == 2
    assert [b["id"] for b in json.loads(farmctl(addr, "bounty", "list", "--open", "--json").stdout)] == [3]

    who = json.loads(farmctl(addr, "contributor", "show", "ada", "--json").stdout)
    assert (who["name"], who["ledger"][0]["seq"], who["ledger"][0]["at"]) == ("ada", 1, 1e9)
    ledger = farmctl(addr, "contributor", "show", "ada").stdout.partition("ledger (newest first)")[2]
    assert 0 <= ledger.index("+0.25") < ledger.index("+1.00"), "the ledger newest first"
    funnel = json.loads(farmctl(addr, "funnel", "--json").stdout)
    assert funnel["states"]["in_review"] == 2 and funnel["cost_per_accepted"] == 80.0
    assert funnel["per_accepted"]["box_cpu"] == 5.0 and funnel["tiers"][0]["tier"] == 1
    assert funnel["per_accepted"]["cost"] == 0.00042, "a fraction of a cent is kept, not rounded to 0"
    shown = farmctl(addr, "funnel").stdout
    assert "$80.00" in shown and "$0.00042" in shown
