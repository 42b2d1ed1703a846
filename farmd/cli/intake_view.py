"""The intake funnel as a person reads it (``farmctl submit``, ``submission``, ``review``, ``quarantine``,
``bounty``, ``contributor``, ``funnel``), and as a script reads it (``--json``).

Nearly everything here was written by someone other than farm: a submission's name, version, domain and
author come from its contributor's manifest; a finding's evidence quotes what the environment printed or
what an attack submitted and earned; notes, reasons and a bounty's requirements are free text; contributor
names are whoever asked. Each goes in as ``shown.text``, so it is shown, never obeyed.
"""

from __future__ import annotations

import datetime
import math
import typing
from typing import Any

from farm.v1 import intake_pb2
from farm_client.convert import dollars, enum_prefix, seconds
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.type import money_pb2
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from farmd.cli.shown import joined, text

MAX_SHOWN_CHARS = 4000
"""Of one block of text (evidence, a fix, a note): the rest is left to ``--json``."""

_STATE_PREFIX = "SUBMISSION_STATE_"
STATES = tuple(v.name.removeprefix(_STATE_PREFIX).lower() for v in intake_pb2.SubmissionState.DESCRIPTOR.values
               if v.number)
"""What ``--state`` takes: checking, rejected, in_review, approved, quarantined."""

_STATE_STYLE = {"checking": "yellow", "rejected": "red", "in_review": "cyan", "approved": "green",
                "quarantined": "magenta"}
_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"
_MONEY = "google.type.Money"
_INTS = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
         FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


# -- JSON ---------------------------------------------------------------------------------------------


def to_json(message: Message) -> dict[str, Any]:
    """``message`` the way farmctl's other ``--json`` output reads: ``MessageToDict`` with proto field names
    and every field present, then 64-bit integers as numbers (not the proto mapping's strings), enums by
    their short lowercase name (``in_review``, as runs have ``succeeded``), times in seconds since the
    epoch, durations in seconds, money in US dollars, and an unset optional field or time as null."""
    plain = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _fixed(message, plain)


def _enum(enum: EnumDescriptor, number: int) -> str | int:
    value = enum.values_by_number.get(number)
    if value is None:  # a farmd newer than this farmctl
        return number
    return value.name.removeprefix(enum_prefix(enum)).lower()


def _value(fd: FieldDescriptor, value: Any, shown: Any) -> Any:
    if fd.message_type is not None:
        if fd.message_type.full_name in (_TIMESTAMP, _DURATION):
            return seconds(value)
        if fd.message_type.full_name == _MONEY:
            return dollars(value)
        return _fixed(value, shown)
    if fd.enum_type is not None:
        return _enum(fd.enum_type, value)
    if fd.type in _INTS:
        return int(value)
    return shown


def _fixed(message: Message, plain: dict[str, Any]) -> dict[str, Any]:
    descriptor = typing.cast(Descriptor, message.DESCRIPTOR)  # the stubs also allow upb's twin
    for fd in descriptor.fields:
        name, value = fd.name, getattr(message, fd.name)
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_fd: FieldDescriptor = entry.fields_by_name["value"]
            plain[name] = {str(k): _value(value_fd, v, plain[name][str(k)]) for k, v in value.items()}
        elif fd.is_repeated:
            plain[name] = [_value(fd, v, s) for v, s in zip(value, plain[name], strict=True)]
        elif fd.has_presence and not message.HasField(name):
            plain[name] = None
        else:
            plain[name] = _value(fd, value, plain[name])
    return plain


# -- small pieces -------------------------------------------------------------------------------------


def state_name(state: int) -> str:
    """``SUBMISSION_STATE_IN_REVIEW`` -> ``in_review`` (a number this farmctl does not know stays a number)."""
    return str(_enum(intake_pb2.SubmissionState.DESCRIPTOR, state))


def state_value(name: str) -> intake_pb2.SubmissionState.ValueType:
    """``in_review`` (or ``in-review``, any case) -> ``SUBMISSION_STATE_IN_REVIEW``."""
    return intake_pb2.SubmissionState.Value(_STATE_PREFIX + name.upper().replace("-", "_"))


def _state(state: int) -> Text:
    name = state_name(state)
    return Text(name.replace("_", " "), _STATE_STYLE.get(name, ""))


def _when(at: Any) -> str:
    if not at.seconds and not at.nanos:
        return "-"
    return datetime.datetime.fromtimestamp(seconds(at), datetime.UTC).isoformat(timespec="seconds")


def _block(value: str, indent: str) -> Text:
    """Multi-line untrusted text, escaped, indented, cut at ``MAX_SHOWN_CHARS`` with a note saying so."""
    shown = text(value[:MAX_SHOWN_CHARS].rstrip("\n"), inline=False)
    out = Text("\n").join(Text.assemble(indent, line) for line in shown.split("\n", allow_blank=True))
    if len(value) > MAX_SHOWN_CHARS:
        out.append(f"\n{indent}... {len(value) - MAX_SHOWN_CHARS} more characters (--json shows all)", "dim")
    return out


def _usd(amount: money_pb2.Money) -> str:
    usd = dollars(amount)
    # Box time costs fractions of a cent: those with two significant digits, not as $0.00.
    return f"${usd:.2g}" if 0 < abs(usd) < 0.01 else f"${usd:,.2f}"


def mutation(s: intake_pb2.Submission) -> str:
    """The share of the reference's mutants the verifier rejected: ``killed/mutants (pct)``."""
    if not s.HasField("mutation_share"):
        return f"{s.mutants_killed}/{s.mutants}" if s.mutants else "not measured"
    share = s.mutation_share
    return f"{s.mutants_killed}/{s.mutants} ({share:.0%})" if math.isfinite(share) else f"{s.mutants_killed}/{s.mutants}"


def _findings_count(s: intake_pb2.Submission) -> str:
    blocking = sum(f.blocking for f in s.findings)
    return f"{len(s.findings)} ({blocking} blocking)" if s.findings else "0"


# -- submissions --------------------------------------------------------------------------------------


def submission_line(s: intake_pb2.Submission) -> Text:
    """One line: ``submission 7 (contrib:word-count@1.0.0) in review at tier 2: why``."""
    line = Text.assemble(Text(f"submission {s.id}", "bold"), " (", text(s.env or f"{s.name}@{s.version}"), ") ",
                         _state(s.state), f" at tier {s.tier}")
    if s.detail:
        line.append_text(Text.assemble(": ", text(s.detail)))
    return line


def findings_view(s: intake_pb2.Submission) -> list[RenderableType]:
    if not s.findings:
        return [Text.assemble(Text("findings", "bold"), ": none")]
    out: list[RenderableType] = [Text.assemble(Text("findings", "bold"), f": {_findings_count(s)}")]
    for i, f in enumerate(s.findings, 1):
        kind = Text("blocking", "red") if f.blocking else Text("note for the reviewer", "yellow")
        out.append(Text.assemble(f"  [{i}] tier {f.tier} ", text(f.check, "bold"), ": ", kind))
        out.append(Text("      evidence:"))
        out.append(_block(f.evidence or "(none given)", "        "))
        out.append(Text("      fix:"))
        out.append(_block(f.fix or "(none given)", "        "))
    return out


def costs_table(costs: Any, title: str = "cost per tier") -> Table:
    """One row per tier (tier 0 is the total over every tier)."""
    table = Table("tier", "box CPU s", "box wall s", "box calls", "attacker tokens", "review s", "USD",
                  title=title, title_justify="left")
    for c in costs:
        table.add_row("all" if c.tier == 0 else str(c.tier), f"{seconds(c.box_cpu):.1f}", f"{seconds(c.box_wall):.1f}",
                      str(c.box_calls), str(c.attacker_tokens), f"{seconds(c.review):.0f}", _usd(c.cost))
    return table


def submission_view(s: intake_pb2.Submission) -> Group:
    """Everything of a submission: where it stands and why, every finding, its costs, its review."""
    bounty = f"bounty {s.bounty_id}" if s.bounty_id else "no bounty"
    parts: list[RenderableType] = [
        submission_line(s),
        Text.assemble("  ", text(s.name), " ", text(s.version), " by ", text(s.contributor or "-"), "; domain ",
                      text(s.domain or "-"), ", kind ", text(s.kind or "-"), f", {s.levels} levels; {bounty}"),
        Text.assemble("  digest ", text(s.digest or "-"), f"; round {s.rounds}; submitted {_when(s.created_at)}, "
                      f"decided {_when(s.decided_at)}"),
        Text(f"  scrutiny: {s.seeds} seeds per level, {s.attack_budget} attacker proposals"),
        Text(f"  mutation share: {mutation(s)}"),
        Text(f"  trajectories: {s.trajectories} stored, {s.withdrawn} withdrawn"),
    ]
    if s.reviewer or s.review_note:
        parts.append(Text.assemble("  reviewer ", text(s.reviewer or "-"), ":"))
        parts.append(_block(s.review_note or "(no note)", "    "))
    parts += [Text(""), *findings_view(s)]
    if s.costs:
        parts += [Text(""), costs_table(s.costs)]
    return Group(*parts)


def submissions_table(rows: list[intake_pb2.Submission], title: str = "") -> Table:
    table = Table("id", "env", "contributor", "state", "tier", "findings", "mutation", "submitted", "detail",
                  title=title or None, title_justify="left")
    for s in rows:
        table.add_row(str(s.id), text(s.env or f"{s.name}@{s.version}"), text(s.contributor), _state(s.state),
                      str(s.tier), _findings_count(s), mutation(s), _when(s.created_at), text(s.detail))
    return table


# -- bounties, contributors, the funnel ---------------------------------------------------------------


def bounties_table(rows: list[intake_pb2.Bounty]) -> Table:
    table = Table("id", "domain", "payout", "accepted/wanted", "open", "min reputation", "claimants", "posted by",
                  "requirements")
    for b in rows:
        table.add_row(str(b.id), text(b.domain), f"{_usd(b.pay_min)}-{_usd(b.pay_max)}",
                      f"{b.accepted}/{b.wanted}", "yes" if b.open else "no", f"{b.min_reputation:g}",
                      joined(list(b.claimants), ", "), text(b.posted_by), text(b.requirements))
    return table


def bounty_line(b: intake_pb2.Bounty) -> Text:
    state = Text("open", "green") if b.open else Text("closed", "yellow")
    return Text.assemble(Text(f"bounty {b.id}", "bold"), " (", text(b.domain), ") ", state,
                         f": {_usd(b.pay_min)}-{_usd(b.pay_max)} each, {b.accepted}/{b.wanted} "
                         f"accepted, {_usd(b.total_paid)} paid, reputation {b.min_reputation:g} to claim; claimed by ",
                         joined(list(b.claimants), ", ") if b.claimants else "nobody")


def contributor_view(c: intake_pb2.Contributor) -> Group:
    """Reputation, trust, the scrutiny their next submission gets, their counts, and the ledger newest first."""
    trust = Text("tanked (a planted exploit)", "red") if c.tanked else text(c.trust)
    parts: list[RenderableType] = [
        Text.assemble(Text.assemble("contributor ", text(c.name), style="bold"), f": reputation {c.reputation:.2f}, "
                      "trust ", trust),
        Text(f"  scrutiny of their next submission: {c.seeds} seeds per level, {c.attack_budget} attacker proposals"),
        Text(f"  the most a bounty they may claim pays: {_usd(c.bounty_cap)}"),
        Text(f"  submitted {c.submitted}, accepted {c.accepted}, rejected {c.rejected}; paid {_usd(c.total_paid)}"),
    ]
    ledger = Table("seq", "at", "delta", "balance", "submission", "reason", title="ledger (newest first)",
                   title_justify="left")
    for e in sorted(c.ledger, key=lambda e: e.seq, reverse=True):
        ledger.add_row(str(e.seq), _when(e.at), f"{e.delta:+.2f}", f"{e.balance:.2f}",
                       str(e.submission_id) if e.submission_id else "-", text(e.reason))
    parts += [Text(""), ledger] if c.ledger else [Text("  ledger: empty")]
    return Group(*parts)


def funnel_view(f: intake_pb2.GetFunnelResponse) -> Group:
    """Submissions by state, the cost of every tier, and what one accepted environment cost."""
    states = Table("state", "submissions", title="submissions by state", title_justify="left")
    known = [s for s in STATES if s in f.states]
    for name in known + sorted(set(f.states) - set(known)):
        states.add_row(text(name.replace("_", " ")), str(f.states[name]))
    per = _usd(f.cost_per_accepted) if f.HasField("cost_per_accepted") else "- (nothing accepted yet)"
    parts: list[RenderableType] = [
        states, costs_table(f.tiers, "cost per tier, over every submission"),
        Text(f"accepted environments: {f.accepted}; payouts {_usd(f.payouts)}; total {_usd(f.total_cost)} "
             f"(every tier of every submission, and the payouts)"),
        Text(f"cost per accepted environment: {per}"),
    ]
    if f.HasField("per_accepted"):
        p = f.per_accepted
        parts.append(Text(f"  of which the tiers: {seconds(p.box_cpu):.1f} box CPU s, {seconds(p.box_wall):.1f} box wall s, "
                          f"{p.box_calls} box calls, {p.attacker_tokens} attacker tokens, {seconds(p.review):.0f} review s, "
                          f"{_usd(p.cost)}"))
    return Group(*parts)
