"""IntakeService: the funnel over gRPC. Who calls decides what they see: a contributor is the calling
credential (never a name the request claims, when the farm has credentials) and sees only their own
submissions; reviewers and operators see all. Everything a contributor sent comes back as valid text,
bounded; escaping it for a terminal or a page is the client's (farmctl does)."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

import grpc
from farm.v1 import intake_pb2, intake_pb2_grpc
from farm_client.convert import dollars, duration, money, seconds
from google.type import money_pb2

from farmd.api.auth import OPERATOR, REVIEWER, credential_for
from farmd.api.budget import Budgets
from farmd.api.errors import guarded, guarded_stream
from farmd.api.paging import make_token, read_token
from farmd.config import ROLES, Credential
from farmd.errors import BadRequest, Forbidden, NotFound
from farmd.intake.funnel import Funnel
from farmd.store.intake import STATES, BountyRow, CostRow, LedgerRow, SubmissionRow

MAX_LIST = 500
PACKAGE_CHUNK_BYTES = 1 << 20
_ANONYMOUS = "anonymous"
_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,64}")


class _Caller:
    def __init__(self, name: str, roles: frozenset[str]) -> None:
        self.name = name
        self.roles = roles

    @property
    def sees_all(self) -> bool:
        return bool(self.roles & {OPERATOR, REVIEWER})


def _ts(message: Any, field: str, seconds: float | None) -> None:
    if seconds:
        getattr(message, field).FromNanoseconds(round(seconds * 1e9))


class IntakeService(intake_pb2_grpc.IntakeServiceServicer):
    def __init__(self, funnel: Funnel, credentials: Iterable[Credential], budgets: Budgets | None = None) -> None:
        self._funnel = funnel
        self._credentials = tuple(credentials)
        self._budgets = budgets or Budgets(self._credentials)
        """What each credential holds at once across its uploads and streams: a package is held whole."""

    def _caller(self, context: grpc.aio.ServicerContext[Any, Any], claimed: str = "") -> _Caller:
        """The credential that called (the interceptor let it through); with no credentials at all, the
        name the request gives (a loopback farm trusts its callers) with every role."""
        if self._credentials:
            credential = credential_for(self._credentials, tuple(context.invocation_metadata() or ()))
            if credential is None:  # the interceptor refuses these first; here only if it was bypassed
                raise BadRequest("no credential")
            return _Caller(credential.name, credential.roles)
        name = claimed.strip() or _ANONYMOUS
        if not _NAME.fullmatch(name):
            raise BadRequest("a contributor's name is 1 to 64 letters, digits, '.', '_', '@', '+' or '-'")
        return _Caller(name, ROLES)

    # -- submissions -------------------------------------------------------------------------------

    async def Submit(self, request_iterator: AsyncIterator[intake_pb2.SubmitRequest],
                     context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.SubmitResponse:
        async def call() -> intake_pb2.SubmitResponse:
            limit = self._funnel.config.max_package_bytes
            data: list[bytes] = []
            bounty_id, claimed, declared, size = 0, "", "", 0
            async with self._budgets.stream(context, "Submit") as share:
                async for chunk in request_iterator:
                    if not data and not size:
                        bounty_id, claimed, declared = chunk.bounty_id, chunk.contributor, chunk.sha256
                    size += len(chunk.data)
                    if size > limit:  # bounded as it arrives: the rest is never read
                        raise BadRequest(f"the package is over {limit} bytes", reason="PACKAGE_TOO_LARGE")
                    share.take(len(chunk.data), pieces=1)
                    data.append(chunk.data)
                caller = self._caller(context, claimed)
                sub = await self._funnel.submit(caller.name, b"".join(data), bounty_id, sha256=declared)
            return intake_pb2.SubmitResponse(submission=self._submission_pb(sub))
        return await guarded(context, call)

    async def _visible(self, caller: _Caller, submission_id: int) -> SubmissionRow:
        sub = await self._funnel.submission(submission_id)
        if not caller.sees_all and sub.contributor != caller.name:
            raise NotFound(f"no submission {submission_id}")  # another's: not even whether it exists
        return sub

    async def GetSubmission(self, request: intake_pb2.GetSubmissionRequest,
                            context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.GetSubmissionResponse:
        async def call() -> intake_pb2.GetSubmissionResponse:
            caller = self._caller(context)
            sub = await self._visible(caller, request.id)
            if REVIEWER in caller.roles and sub.contributor != caller.name:
                await self._funnel.looked_at(sub.id, caller.name)
            return intake_pb2.GetSubmissionResponse(submission=self._submission_pb(sub))
        return await guarded(context, call)

    async def ListSubmissions(self, request: intake_pb2.ListSubmissionsRequest,
                              context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.ListSubmissionsResponse:
        async def call() -> intake_pb2.ListSubmissionsResponse:
            caller = self._caller(context)
            size = min(request.page_size or 50, MAX_LIST)
            before = read_token("submissions", request.page_token)
            state = _state_name(request.state)
            contributor = request.contributor if caller.sees_all else caller.name
            rows = await self._funnel.submissions(state=state, contributor=contributor or None,
                                                  before_id=before or 0, limit=size + 1) if before != 0 else []
            more = len(rows) > size
            rows = rows[:size]
            return intake_pb2.ListSubmissionsResponse(
                submissions=[self._submission_pb(r) for r in rows],
                next_page_token=make_token("submissions", rows[-1].id) if more else "")
        return await guarded(context, call)

    async def ReviewSubmission(self, request: intake_pb2.ReviewSubmissionRequest,
                               context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.ReviewSubmissionResponse:
        async def call() -> intake_pb2.ReviewSubmissionResponse:
            caller = self._caller(context, request.reviewer)
            try:
                sub = await self._funnel.review(request.id, caller.name, approve=request.approve, note=request.note,
                                                planted=request.planted, minutes=seconds(request.review_time) / 60)
            except Forbidden as exc:
                if self._credentials or exc.reason != "OWN_SUBMISSION":
                    raise
                # Without credentials every caller is who it says, anonymous unless it says: the first day's
                # submit-then-review meets this, and is told how the review step is tried.
                raise Forbidden(f"{exc}: on a farm without credentials, {caller.name!r} submitted it and reviews "
                                "it; review as someone else (farmctl review approve ID --reviewer NAME), or give the "
                                "farm credentials (farmctl token new --role contributor, and --role reviewer)",
                                reason="OWN_SUBMISSION") from None
            return intake_pb2.ReviewSubmissionResponse(submission=self._submission_pb(sub))
        return await guarded(context, call)

    async def QuarantineSubmission(self, request: intake_pb2.QuarantineSubmissionRequest,
                                   context: grpc.aio.ServicerContext[Any, Any]
                                   ) -> intake_pb2.QuarantineSubmissionResponse:
        async def call() -> intake_pb2.QuarantineSubmissionResponse:
            caller = self._caller(context)
            sub, withdrawn = await self._funnel.quarantine(request.id, caller.name, request.reason,
                                                           planted=request.planted)
            return intake_pb2.QuarantineSubmissionResponse(submission=self._submission_pb(sub), withdrawn=withdrawn)
        return await guarded(context, call)

    # -- bounties ----------------------------------------------------------------------------------

    async def ListBounties(self, request: intake_pb2.ListBountiesRequest,
                           context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.ListBountiesResponse:
        async def call() -> intake_pb2.ListBountiesResponse:
            return intake_pb2.ListBountiesResponse(
                bounties=[_bounty_pb(b) for b in await self._funnel.bounties(request.open_only)])
        return await guarded(context, call)

    async def PostBounty(self, request: intake_pb2.PostBountyRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.PostBountyResponse:
        async def call() -> intake_pb2.PostBountyResponse:
            caller = self._caller(context)
            bounty = await self._funnel.post_bounty(
                caller.name, domain=request.domain, requirements=request.requirements,
                payout_min=_usd(request.pay_min, "pay_min"), payout_max=_usd(request.pay_max, "pay_max"),
                wanted=request.wanted, min_reputation=request.min_reputation)
            return intake_pb2.PostBountyResponse(bounty=_bounty_pb(bounty))
        return await guarded(context, call)

    async def ClaimBounty(self, request: intake_pb2.ClaimBountyRequest,
                          context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.ClaimBountyResponse:
        async def call() -> intake_pb2.ClaimBountyResponse:
            caller = self._caller(context, request.contributor)
            return intake_pb2.ClaimBountyResponse(bounty=_bounty_pb(await self._funnel.claim(request.id, caller.name)))
        return await guarded(context, call)

    # -- reputation and the funnel ---------------------------------------------------------------------

    async def GetContributor(self, request: intake_pb2.GetContributorRequest,
                             context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.GetContributorResponse:
        async def call() -> intake_pb2.GetContributorResponse:
            caller = self._caller(context, request.name if not self._credentials else "")
            name = request.name.strip() or caller.name
            if name != caller.name and not caller.sees_all:
                raise NotFound(f"no contributor {name!r}")
            found = await self._funnel.contributor(name)
            trust, row, states = found.trust, found.row, found.row.states
            contributor = intake_pb2.Contributor(
                name=name, reputation=row.reputation, trust=trust.name, tanked=row.tanked, seeds=trust.seeds,
                attack_budget=trust.attack_budget, bounty_cap=money(trust.max_payout), submitted=sum(states.values()),
                accepted=states.get("approved", 0) + states.get("quarantined", 0), rejected=states.get("rejected", 0),
                total_paid=money(row.paid), ledger=_ledger_pb(found.ledger, row.reputation))
            return intake_pb2.GetContributorResponse(contributor=contributor)
        return await guarded(context, call)

    async def GetFunnel(self, request: intake_pb2.GetFunnelRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> intake_pb2.GetFunnelResponse:
        async def call() -> intake_pb2.GetFunnelResponse:
            figures = await self._funnel.figures()
            reply = intake_pb2.GetFunnelResponse(
                states=figures.states, tiers=[self._cost_pb(c) for c in figures.tiers],
                accepted=figures.accepted, payouts=money(figures.payouts_usd),
                total_cost=money(figures.total_usd))
            if figures.usd_per_accepted is not None and figures.per_accepted is not None:
                reply.cost_per_accepted.CopyFrom(money(figures.usd_per_accepted))
                reply.per_accepted.CopyFrom(self._cost_pb(figures.per_accepted))
            return reply
        return await guarded(context, call)

    async def GetEnvironmentPackage(self, request: intake_pb2.GetEnvironmentPackageRequest,
                                    context: grpc.aio.ServicerContext[Any, Any]
                                    ) -> AsyncIterator[intake_pb2.GetEnvironmentPackageResponse]:
        async for message in guarded_stream(context, self._package_chunks(request, context)):
            yield message

    async def _package_chunks(self, request: intake_pb2.GetEnvironmentPackageRequest,
                              context: grpc.aio.ServicerContext[Any, Any]
                              ) -> AsyncGenerator[intake_pb2.GetEnvironmentPackageResponse, None]:
        caller = self._caller(context)
        # A node runs only what is served; a reviewer reads whatever is submitted.
        sub, data = await self._funnel.package_of(request.env, approved_only=not caller.sees_all)
        for start in range(0, max(1, len(data)), PACKAGE_CHUNK_BYTES):
            yield intake_pb2.GetEnvironmentPackageResponse(data=data[start:start + PACKAGE_CHUNK_BYTES],
                                                           digest=sub.digest if start == 0 else "")

    # -- messages ----------------------------------------------------------------------------------

    def _cost_pb(self, cost: CostRow) -> intake_pb2.TierCost:
        return intake_pb2.TierCost(tier=cost.tier, box_cpu=duration(cost.box_cpu_s), box_wall=duration(cost.box_wall_s),
                                   box_calls=cost.box_calls, attacker_tokens=cost.attacker_tokens,
                                   review=duration(cost.review_s), cost=money(self._funnel.prices.usd(cost)))

    def _submission_pb(self, sub: SubmissionRow) -> intake_pb2.Submission:
        message = intake_pb2.Submission(
            id=sub.id, name=sub.name, version=sub.version, env=sub.env, contributor=sub.contributor, domain=sub.domain,
            kind=sub.kind, levels=sub.levels, digest=sub.digest,
            state=intake_pb2.SubmissionState.Value(f"SUBMISSION_STATE_{sub.state.upper()}"), tier=sub.tier,
            detail=sub.detail,
            findings=[intake_pb2.Finding(tier=f.tier, check=f.check, evidence=f.evidence, fix=f.fix, blocking=f.blocking)
                      for f in sub.findings],
            costs=[self._cost_pb(c) for c in sub.costs], mutants=sub.mutants, mutants_killed=sub.mutants_killed,
            seeds=sub.seeds, attack_budget=sub.attack_budget, bounty_id=sub.bounty_id, reviewer=sub.reviewer,
            review_note=sub.review_note, trajectories=sub.trajectories, withdrawn=sub.withdrawn, rounds=sub.rounds)
        if sub.mutants:
            message.mutation_share = sub.mutants_killed / sub.mutants
        _ts(message, "created_at", sub.created_at)
        _ts(message, "decided_at", sub.decided_at)
        return message


def _usd(amount: money_pb2.Money, field: str) -> float:
    try:
        return dollars(amount)
    except ValueError as exc:
        raise BadRequest(f"{field}: {exc}") from None


def _state_name(value: int) -> str | None:
    if value == intake_pb2.SUBMISSION_STATE_UNSPECIFIED:
        return None
    try:
        name = intake_pb2.SubmissionState.Name(value)  # type: ignore[arg-type]
    except ValueError:
        raise BadRequest(f"no submission state {value}") from None
    state = name.removeprefix("SUBMISSION_STATE_").lower()
    assert state in STATES
    return state


def _bounty_pb(b: BountyRow) -> intake_pb2.Bounty:
    message = intake_pb2.Bounty(id=b.id, domain=b.domain, requirements=b.requirements,
                                pay_min=money(b.payout_min), pay_max=money(b.payout_max),
                                wanted=b.wanted, min_reputation=b.min_reputation, accepted=b.accepted,
                                claimants=b.claimants, open=b.open, posted_by=b.posted_by, total_paid=money(b.paid))
    _ts(message, "created_at", b.created_at)
    return message


def _ledger_pb(rows: list[LedgerRow], balance: float) -> list[intake_pb2.LedgerEntry]:
    """Newest first, each with the balance after it (``balance``: after the newest)."""
    out = []
    for r in rows:
        entry = intake_pb2.LedgerEntry(seq=r.seq, delta=r.delta, balance=balance, reason=r.reason,
                                       submission_id=r.submission_id)
        _ts(entry, "at", r.at)
        out.append(entry)
        balance -= r.delta
    return out

