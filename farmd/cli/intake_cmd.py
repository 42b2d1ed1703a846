"""Commands of the intake funnel: contributors submit environments and claim bounties; reviewers decide;
operators post bounties, quarantine hacked versions and read what the funnel costs.

``farmctl submit`` reads and checks the package here first (``farmd.intake.package``), so a broken
manifest is reported with every problem at once and nothing is sent; what is sent is exactly the
packed tarball of the files it checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import grpc
from farm.v1 import intake_pb2, intake_pb2_grpc
from farm_client.convert import duration, money
from rich.text import Text

from farmd.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliState,
    console,
    emit_json,
    error_kind,
    fail,
    json_option,
    progress_console,
)
from farmd.cli.intake_view import (
    STATES,
    bounties_table,
    bounty_line,
    contributor_view,
    funnel_view,
    state_value,
    submission_line,
    submission_view,
    submissions_table,
    to_json,
)
from farmd.cli.remote_cmd import fail_rpc, farm_client
from farmd.cli.shown import plain
from farmd.errors import PackageError
from farmd.intake.package import Package, pack, read_package

CHUNK_BYTES = 256 << 10
"""Of the package, per ``SubmitRequest``."""
POLL_S = 0.5
"""How often ``submit --wait`` asks where a submission stands."""
CALL_TIMEOUT_S = 30.0
SUBMIT_TIMEOUT_S = 300.0
_CHECKING = intake_pb2.SUBMISSION_STATE_CHECKING
_REJECTED = intake_pb2.SUBMISSION_STATE_REJECTED
_IN_REVIEW = intake_pb2.SUBMISSION_STATE_IN_REVIEW


class Intake:
    """farmd's IntakeService over one channel, each call carrying the token and a deadline."""

    def __init__(self, channel: grpc.Channel, token: str | None) -> None:
        self.stub = intake_pb2_grpc.IntakeServiceStub(channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def submit(self, data: bytes, bounty_id: int, contributor: str) -> intake_pb2.Submission:
        digest = hashlib.sha256(data).hexdigest()  # a cancelled upload then cannot pass for a whole one

        def chunks() -> Iterator[intake_pb2.SubmitRequest]:
            yield intake_pb2.SubmitRequest(data=data[:CHUNK_BYTES], bounty_id=bounty_id, contributor=contributor,
                                           sha256=digest)
            for start in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
                yield intake_pb2.SubmitRequest(data=data[start:start + CHUNK_BYTES])

        return self.stub.Submit(chunks(), metadata=self.metadata, timeout=SUBMIT_TIMEOUT_S).submission

    def get(self, submission_id: int) -> intake_pb2.Submission:
        return self.stub.GetSubmission(intake_pb2.GetSubmissionRequest(id=submission_id), metadata=self.metadata,
                                       timeout=CALL_TIMEOUT_S).submission

    def submissions(self, state: intake_pb2.SubmissionState.ValueType, contributor: str,
                    limit: int) -> list[intake_pb2.Submission]:
        """The newest ``limit`` submissions, paged through as needed."""
        out: list[intake_pb2.Submission] = []
        token = ""
        while len(out) < limit:
            request = intake_pb2.ListSubmissionsRequest(state=state, contributor=contributor,
                                                        page_size=min(limit - len(out), 500), page_token=token)
            reply = self.stub.ListSubmissions(request, metadata=self.metadata, timeout=CALL_TIMEOUT_S)
            out.extend(reply.submissions)
            token = reply.next_page_token
            if not token or not reply.submissions:
                break
        return out[:limit]

    def review(self, request: intake_pb2.ReviewSubmissionRequest) -> intake_pb2.Submission:
        return self.stub.ReviewSubmission(request, metadata=self.metadata, timeout=CALL_TIMEOUT_S).submission

    def quarantine(self, request: intake_pb2.QuarantineSubmissionRequest) -> intake_pb2.QuarantineSubmissionResponse:
        return self.stub.QuarantineSubmission(request, metadata=self.metadata, timeout=CALL_TIMEOUT_S)

    def bounties(self, open_only: bool) -> list[intake_pb2.Bounty]:
        return list(self.stub.ListBounties(intake_pb2.ListBountiesRequest(open_only=open_only),
                                           metadata=self.metadata, timeout=CALL_TIMEOUT_S).bounties)

    def post_bounty(self, request: intake_pb2.PostBountyRequest) -> intake_pb2.Bounty:
        return self.stub.PostBounty(request, metadata=self.metadata, timeout=CALL_TIMEOUT_S).bounty

    def claim_bounty(self, bounty_id: int, contributor: str) -> intake_pb2.Bounty:
        return self.stub.ClaimBounty(intake_pb2.ClaimBountyRequest(id=bounty_id, contributor=contributor),
                                     metadata=self.metadata, timeout=CALL_TIMEOUT_S).bounty

    def contributor(self, name: str) -> intake_pb2.Contributor:
        return self.stub.GetContributor(intake_pb2.GetContributorRequest(name=name), metadata=self.metadata,
                                        timeout=CALL_TIMEOUT_S).contributor

    def funnel(self) -> intake_pb2.GetFunnelResponse:
        return self.stub.GetFunnel(intake_pb2.GetFunnelRequest(), metadata=self.metadata, timeout=CALL_TIMEOUT_S)


@contextlib.contextmanager
def intake(state: CliState) -> Iterator[Intake]:
    """An ``Intake`` to farmd at ``state.addr``; a failed call ends the command as ``remote_cmd``'s do:
    ``ADDR: CODE: details`` and exit 1 (with ``--json``, the code in the error's own field)."""
    try:
        with farm_client(state) as c:
            yield Intake(c.channel, state.token)
    except grpc.RpcError as exc:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            details = f"this farmd has no intake service (a farmd older than this farmctl?): {details}"
        fail_rpc(state, exc, details)


def _required(value: str, option: str) -> str:
    if not value.strip():
        fail(f"{option} must say something: it is kept with the decision", EXIT_USAGE, kind="INVALID_ARGUMENT")
    return value


def _print_submission(s: intake_pb2.Submission, as_json: bool) -> None:
    if as_json:
        emit_json(to_json(s))
    else:
        console().print(submission_view(s))


# -- submit -------------------------------------------------------------------------------------------


def _packed(path: Path) -> tuple[Package, bytes]:
    """The package at ``path``, checked, and the tarball of exactly the files checked; a usage error
    listing every problem otherwise (nothing is sent)."""
    try:
        package = read_package(path)
    except PackageError as exc:
        problems = "\n".join(f"  - {p}" for p in exc.problems)
        fail(f"{path} cannot be submitted; fix these first:\n{problems}", EXIT_USAGE, kind=error_kind(exc))
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE, kind="PACKAGE_ERROR")
    return package, pack(package.files.items())


def _checking(s: intake_pb2.Submission) -> str:
    return f"submission {s.id} is being checked, at tier {s.tier}: {plain(s.detail)}"


def _wait(farm: Intake, s: intake_pb2.Submission, quiet: bool) -> intake_pb2.Submission:
    """Ask until ``s`` has left CHECKING, a spinner showing its tier and detail on a terminal."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    # Its detail is the server's (it may quote the environment): shown as text, never read as markup.
    with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                  disable=quiet or not progress_console().is_terminal, transient=True,
                  console=progress_console()) as spinner:
        task = spinner.add_task(_checking(s))
        while s.state == _CHECKING:
            time.sleep(POLL_S)
            s = farm.get(s.id)
            spinner.update(task, description=_checking(s))
    return s


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--bounty", "bounty_id", type=click.IntRange(min=1), default=None,
              help="The bounty (claimed first, with `farmctl bounty claim`) this submission answers.")
@click.option("--contributor", default="", metavar="NAME",
              help="Who submits it, on a farm without credentials (with them, the token names the contributor).")
@click.option("--wait", is_flag=True, help="Wait until the automated tiers have ruled, then show it; "
              "exits 1 if it was rejected.")
@json_option
@click.pass_obj
def submit(state: CliState, path: Path, bounty_id: int | None, contributor: str, wait: bool, as_json: bool) -> None:
    """Submit an environment: PATH is its directory (farm-env.toml at the top) or a .tar.gz of it.

    The package is checked here first; one with problems is refused with every problem listed and nothing is
    sent. farmd checks it in the background: `farmctl submission show ID` (or --wait) says where it stands."""
    package, data = _packed(path)
    with intake(state) as farm:
        s = farm.submit(data, bounty_id or 0, contributor)
        if wait:
            s = _wait(farm, s, quiet=as_json)
    if as_json:
        emit_json(to_json(s))
    elif wait:
        console().print(submission_view(s))
    else:
        console().print(Text.assemble(submission_line(s), f" ({len(data)} bytes, {len(package.files)} files; "
                                      f"`farmctl submission show {s.id}` says where it stands)"))
    if wait and s.state == _REJECTED:
        sys.exit(EXIT_FAILED)


# -- submissions and reviews --------------------------------------------------------------------------


@click.group("submission")
def submission_group() -> None:
    """Submitted environments: where each stands, every finding, what it cost."""


@submission_group.command("show")
@click.argument("submission_id", type=int)
@json_option
@click.pass_obj
def submission_show(state: CliState, submission_id: int, as_json: bool) -> None:
    """One submission: state, tier and why; every finding with its evidence and fix; cost per tier; mutation
    coverage; the review."""
    with intake(state) as farm:
        s = farm.get(submission_id)
    _print_submission(s, as_json)


@submission_group.command("list")
@click.option("--state", "state_name", type=click.Choice(STATES, case_sensitive=False), default=None,
              help="Only submissions in this state.")
@click.option("--contributor", default="", help="Only this contributor's.")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50)
@json_option
@click.pass_obj
def submission_list(state: CliState, state_name: str | None, contributor: str, limit: int, as_json: bool) -> None:
    """Submissions, newest first."""
    wanted = state_value(state_name) if state_name else intake_pb2.SUBMISSION_STATE_UNSPECIFIED
    with intake(state) as farm:
        rows = farm.submissions(wanted, contributor, limit)
    _print_submissions(rows, as_json)


def _print_submissions(rows: list[intake_pb2.Submission], as_json: bool, title: str = "") -> None:
    if as_json:
        emit_json([to_json(s) for s in rows])
    else:
        console().print(submissions_table(rows, title))


@click.group("review")
def review_group() -> None:
    """The review queue: submissions that survived the automated tiers wait here for a person's decision."""


@review_group.command("list")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50)
@json_option
@click.pass_obj
def review_list(state: CliState, limit: int, as_json: bool) -> None:
    """Submissions in review, newest first."""
    with intake(state) as farm:
        rows = farm.submissions(_IN_REVIEW, "", limit)
    _print_submissions(rows, as_json, title="in review")


@review_group.command("show")
@click.argument("submission_id", type=int)
@json_option
@click.pass_obj
def review_show(state: CliState, submission_id: int, as_json: bool) -> None:
    """A submission as its reviewer reads it (the notes the tiers left count as much as the blockers)."""
    with intake(state) as farm:
        s = farm.get(submission_id)
    _print_submission(s, as_json)


_NOTE = click.option("--note", required=True, help="What you saw (required: it is kept with the decision).")
_MINUTES = click.option("--minutes", type=click.FloatRange(min=0), default=0.0,
                        help="Your time on it (default: from your first look until now).")
_REVIEWER = click.option("--reviewer", default="", metavar="NAME",
                         help="Who reviews, on a farm without credentials (with them, the token names the reviewer).")


@review_group.command("approve")
@click.argument("submission_id", type=int)
@_NOTE
@_MINUTES
@_REVIEWER
@json_option
@click.pass_obj
def review_approve(state: CliState, submission_id: int, note: str, minutes: float, reviewer: str,
                   as_json: bool) -> None:
    """Approve: the task bank serves it as contrib:NAME@VERSION."""
    request = intake_pb2.ReviewSubmissionRequest(id=submission_id, approve=True, note=_required(note, "--note"),
                                                 review_time=duration(minutes * 60), reviewer=reviewer)
    with intake(state) as farm:
        s = farm.review(request)
    emit_json(to_json(s)) if as_json else console().print(submission_line(s))


@review_group.command("reject")
@click.argument("submission_id", type=int)
@_NOTE
@click.option("--planted", is_flag=True, help="It hides a deliberately planted exploit: tanks its author for good.")
@_MINUTES
@_REVIEWER
@json_option
@click.pass_obj
def review_reject(state: CliState, submission_id: int, note: str, planted: bool, minutes: float, reviewer: str,
                  as_json: bool) -> None:
    """Reject: it never runs in training."""
    request = intake_pb2.ReviewSubmissionRequest(id=submission_id, approve=False, note=_required(note, "--note"),
                                                 planted=planted, review_time=duration(minutes * 60),
                                                 reviewer=reviewer)
    with intake(state) as farm:
        s = farm.review(request)
    emit_json(to_json(s)) if as_json else console().print(submission_line(s))


@click.command()
@click.argument("submission_id", type=int)
@click.option("--reason", required=True, help="The hack found (required).")
@click.option("--planted", is_flag=True, help="The hack was planted on purpose: tanks its author for good.")
@json_option
@click.pass_obj
def quarantine(state: CliState, submission_id: int, reason: str, planted: bool, as_json: bool) -> None:
    """Take an approved version out of service: no longer served, its trajectories withdrawn from trainers."""
    request = intake_pb2.QuarantineSubmissionRequest(id=submission_id, reason=_required(reason, "--reason"),
                                                     planted=planted)
    with intake(state) as farm:
        reply = farm.quarantine(request)
    if as_json:
        emit_json(to_json(reply))
        return
    s = reply.submission
    console().print(Text.assemble(submission_line(s), f"; {reply.withdrawn} trajectories withdrawn now "
                                  f"({s.withdrawn} of {s.trajectories} stored in all)"))


# -- bounties, contributors, the funnel ---------------------------------------------------------------


@click.group("bounty")
def bounty_group() -> None:
    """Bounties: environments wanted, what each pays, who has claimed them."""


@bounty_group.command("list")
@click.option("--open", "open_only", is_flag=True, help="Only bounties still wanting environments.")
@json_option
@click.pass_obj
def bounty_list(state: CliState, open_only: bool, as_json: bool) -> None:
    """Every bounty (or the open ones)."""
    with intake(state) as farm:
        rows = farm.bounties(open_only)
    if as_json:
        emit_json([to_json(b) for b in rows])
    else:
        console().print(bounties_table(rows))


def _payout(value: str) -> tuple[float, float]:
    """``50-200`` (or ``100`` alone: exactly that) as (least, most) dollars; a usage error otherwise."""
    low, dash, high = value.partition("-")
    try:
        least = float(low)
        most = float(high) if dash else least
    except ValueError:
        fail(f"--payout: {value[:40]!r} is not MIN-MAX dollars, such as 50-200", EXIT_USAGE, kind="INVALID_ARGUMENT")
    if not (math.isfinite(least) and math.isfinite(most) and 0 <= least <= most <= 1_000_000):
        fail(f"--payout: {value[:40]!r}: MIN and MAX are dollars, 0 <= MIN <= MAX <= 1000000", EXIT_USAGE,
             kind="INVALID_ARGUMENT")
    return least, most


@bounty_group.command("post")
@click.option("--domain", required=True, help="The domain wanted, e.g. text.")
@click.option("--requirements", required=True, help="What an environment must do to be paid.")
@click.option("--payout", required=True, metavar="MIN-MAX", help="Dollars per accepted environment, e.g. 50-200.")
@click.option("--wanted", type=click.IntRange(min=1), required=True, help="Accepted environments wanted.")
@click.option("--min-reputation", type=float, default=0.0, help="The reputation a contributor needs to claim it.")
@json_option
@click.pass_obj
def bounty_post(state: CliState, domain: str, requirements: str, payout: str, wanted: int, min_reputation: float,
                as_json: bool) -> None:
    """Post a bounty."""
    least, most = _payout(payout)
    request = intake_pb2.PostBountyRequest(domain=domain, requirements=requirements,
                                           pay_min=money(least), pay_max=money(most),
                                           wanted=wanted, min_reputation=min_reputation)
    with intake(state) as farm:
        bounty = farm.post_bounty(request)
    emit_json(to_json(bounty)) if as_json else console().print(bounty_line(bounty))


@bounty_group.command("claim")
@click.argument("bounty_id", type=int)
@click.option("--contributor", default="", metavar="NAME",
              help="Who claims it, on a farm without credentials (with them, the token names the contributor).")
@json_option
@click.pass_obj
def bounty_claim(state: CliState, bounty_id: int, contributor: str, as_json: bool) -> None:
    """Claim a bounty, then answer it with `farmctl submit PATH --bounty ID`."""
    with intake(state) as farm:
        bounty = farm.claim_bounty(bounty_id, contributor)
    emit_json(to_json(bounty)) if as_json else console().print(bounty_line(bounty))


@click.group("contributor")
def contributor_group() -> None:
    """Contributors: reputation, trust, and the ledger behind them."""


@contributor_group.command("show")
@click.argument("name", default="")
@json_option
@click.pass_obj
def contributor_show(state: CliState, name: str, as_json: bool) -> None:
    """A contributor (NAME, or you): reputation, trust, the scrutiny they get, their counts, their ledger."""
    with intake(state) as farm:
        c = farm.contributor(name)
    emit_json(to_json(c)) if as_json else console().print(contributor_view(c))


@click.command()
@json_option
@click.pass_obj
def funnel(state: CliState, as_json: bool) -> None:
    """The intake funnel: submissions by state, cost per tier, and the cost of one accepted environment."""
    with intake(state) as farm:
        reply = farm.funnel()
    emit_json(to_json(reply)) if as_json else console().print(funnel_view(reply))

