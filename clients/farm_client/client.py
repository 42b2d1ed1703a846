"""A small gRPC client for trainers and scripts. It speaks only the wire contract (``farm.v1``).

    with FarmClient("127.0.0.1:7431") as farm:
        for batch in farm.batches("grpo-trainer", batch_size=64, whole_groups=True, tensors=True):
            loss = ... batch.advantages ...            # torch tensors, one row per trajectory
            farm.ack(batch)                            # at least once: un-acked batches come again

Credentials come from the arguments or, for those not given, the environment: ``FARM_TOKEN`` (or
``FARM_TOKEN_FILE``, a file holding it), and for TLS ``FARM_TLS_CA`` (the CA that signed farmd's
certificate) and ``FARM_TLS_CERT`` / ``FARM_TLS_KEY`` (a client certificate, for a farmd that requires
one). Nothing set: a plain channel and no token.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from farm.v1 import farm_pb2, farm_pb2_grpc, trajectory_pb2
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import code_pb2, error_details_pb2, status_pb2

from farm_client.addresses import grpc_target
from farm_client.convert import from_message
from farm_client.record import Score, Trajectory
from farm_client.sequences import group_advantages
from farm_client.verify import SampledTask, Verdict

_CHUNK = 1 << 20
_RETRY_S = 0.2
_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    # A farmd that restarts is back in seconds; grpc's default backoff (up to two minutes)
    # would keep a trainer waiting long after, and a subchannel shared with other clients
    # in the process would fail this one's first call with their stale error.
    # Not grpc.min_reconnect_backoff_ms: grpc takes it as the deadline of each connection
    # attempt too, and on a loaded host 200 ms fails a first call to a healthy farmd
    # ("tcp handshaker shutdown"); its default, 20 s, stays.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.use_local_subchannel_pool", 1),
]

Pem = bytes | str | Path
"""PEM: the bytes themselves, a str holding them, or the path of a file (a str without a PEM header)."""


@dataclass(frozen=True)
class Withdrawal:
    """A trajectory taken back: its environment's version was quarantined (``reason`` says for what)."""

    seq: int
    trajectory_id: int
    env: str
    reason: str


class Listing(list[Trajectory]):
    """Trajectories from a listing (a list), and what the listing says beside them."""

    withdrawn_left_out: int = 0
    """Withdrawn trajectories (a quarantine took them back) that matched and were left out (over every page; 0
    when they were asked for)."""
    verdict_mark: int = 0
    """The farm's verdict mark when the listing began: every verdict given later has a higher ``verdict_version``
    (``FarmClient.verdict_changes(verdict_mark)`` says which changed since)."""


@dataclass(frozen=True)
class VerdictChange:
    """A trajectory whose current verdict changed after a mark: withdrawn, or given a later verdict (a rescore)."""

    trajectory_id: int
    env: str
    verdict_version: int
    """Its current verdict's (in ``scores``)."""
    withdrawn: bool
    withdrawal_reason: str
    scores: list[Score]
    """Every verdict it was given, the first (``verdict_version`` 0) included."""

    def verdict(self, verdict_version: int) -> Score | None:
        """The verdict it held as ``verdict_version`` (what an export that kept that version holds)."""
        return next((s for s in self.scores if s.verdict_version == verdict_version), None)

    @property
    def current(self) -> Score | None:
        return self.verdict(self.verdict_version)


@dataclass
class Batch:
    """Scored trajectories from the stream; ``up_to`` is what ``ack`` moves the cursor to."""

    consumer: str
    whole_groups: bool
    up_to: int
    trajectories: list[Trajectory]
    rewards: Any = None
    """torch.FloatTensor of rewards, with ``tensors=True``."""
    advantages: Any = None
    """torch.FloatTensor of group-relative advantages (reward minus its group's mean, over the
    group's standard deviation), with ``tensors=True``."""
    group_ids: list[int] = field(default_factory=list)
    withdrawn: list[Withdrawal] = field(default_factory=list)
    """Trajectories a quarantine took back since the last batch (some may be in batches already taken)."""

    def __len__(self) -> int:
        return len(self.trajectories)


def _trajectory(t: trajectory_pb2.Trajectory) -> Trajectory:
    return from_message(t, Trajectory)


def error_dict(status: status_pb2.Status) -> dict[str, Any]:
    """A ``google.rpc.Status`` farm sent as plain values: ``code`` by name (``UNAVAILABLE``), ``message``, and
    the ``reason`` of its ErrorInfo ("" when it carries none)."""
    reason = ""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            reason = info.reason
    return {"code": code_pb2.Code.Name(status.code) if status.code in code_pb2.Code.values() else str(status.code),
            "message": status.message, "reason": reason}


def _run(run: farm_pb2.Run) -> dict[str, Any]:
    out: dict[str, Any] = {f.name: getattr(run, f.name) for f in run.DESCRIPTOR.fields
                           if f.name not in ("group_ids", "state", "created_at", "finished_at", "last_error")}
    out["last_error"] = error_dict(run.last_error) if run.HasField("last_error") else None
    out["state"] = farm_pb2.RunState.Name(run.state).removeprefix("RUN_STATE_").lower()
    out["group_ids"] = list(run.group_ids)
    out["created_at"] = run.created_at.ToNanoseconds() / 1e9
    out["finished_at"] = run.finished_at.ToNanoseconds() / 1e9 if run.HasField("finished_at") else None
    return out


def advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """Group-relative advantages (GRPO): each reward against its group's mean and spread."""
    return group_advantages(rewards, groups)


def _pem(source: Pem | None, env: str) -> bytes | None:
    """PEM bytes from ``source``, or from the file the environment variable ``env`` names."""
    if source is None:
        path = os.environ.get(env)
        return Path(path).read_bytes() if path else None
    if isinstance(source, bytes):
        return source
    if isinstance(source, str) and "-----BEGIN" in source:
        return source.encode()
    return Path(source).read_bytes()


def _token(token: str | None) -> str | None:
    """``token``; when not given, FARM_TOKEN's, or the one in the file FARM_TOKEN_FILE names."""
    if token is not None:
        return token or None
    if os.environ.get("FARM_TOKEN"):
        return os.environ["FARM_TOKEN"]
    path = os.environ.get("FARM_TOKEN_FILE")
    return (Path(path).read_text().strip() or None) if path else None


def _channel(addr: str, ca: bytes | None, cert: bytes | None, key: bytes | None,
             server_name: str | None) -> grpc.Channel:
    """A plain channel, or TLS when there is a CA to trust or a certificate to present."""
    addr = grpc_target(addr)
    if ca is None and cert is None and key is None:
        return grpc.insecure_channel(addr, options=_OPTIONS)
    if (cert is None) != (key is None):
        raise ValueError("a client certificate goes with its key: give tls_cert and tls_key (FARM_TLS_CERT and "
                         "FARM_TLS_KEY) together")
    options = [*_OPTIONS, ("grpc.ssl_target_name_override", server_name)] if server_name else _OPTIONS
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.secure_channel(addr, credentials, options=options)


class FarmClient:
    """``FarmClient("host:port", token=None)``; use as a context manager or call ``close()``.

    Several addresses (``"A:7431,B:7431"``, or a list): the coordinators of one farm, which serve it one at a time;
    calls go to whichever answers, and a stream opened with ``reconnect_s`` moves to another when its own goes.

    ``token``: the bearer token calls carry. ``tls_ca``: the CA to trust for farmd's certificate (TLS;
    without it and without a client certificate, a plain channel). ``tls_cert`` and ``tls_key``: a
    client certificate, for a farmd started with ``--tls-ca``. ``tls_server_name``: the name to check
    farmd's certificate against, where it is not the address's host. Any not given is read from the
    environment (see the module's docstring).
    """

    def __init__(self, addr: str | Sequence[str], token: str | None = None, timeout_s: float = 30.0, *, tls_ca: Pem | None = None,
                 tls_cert: Pem | None = None, tls_key: Pem | None = None, tls_server_name: str | None = None) -> None:
        self.addr = addr if isinstance(addr, str) else ",".join(addr)
        token = _token(token)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout_s
        self._channel = _channel(self.addr, _pem(tls_ca, "FARM_TLS_CA"), _pem(tls_cert, "FARM_TLS_CERT"),
                                 _pem(tls_key, "FARM_TLS_KEY"), tls_server_name)
        self._stub = farm_pb2_grpc.FarmServiceStub(self._channel)

    @property
    def channel(self) -> grpc.Channel:
        """The channel to farmd (TLS and options as set up here), for a service this client has no calls for
        (``farmctl``'s intake commands use it for ``IntakeService``)."""
        return self._channel

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the farm ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The node and the farm, as plain values (the shape ``farmctl status --json`` prints)."""
        reply = self._stub.GetStatus(farm_pb2.GetStatusRequest(), metadata=self._metadata, timeout=self._timeout)
        return status_dict(reply)

    def run(self, env: str, agent: str, rollouts: int = 0, group_size: int = 0, *, difficulty: int = 0,
            seeds: Sequence[int] = ()) -> dict[str, Any]:
        """Queue a run; returns it (``id``, ``group_ids``, ``jobs``, ``state``, ...). The task bank picks its
        tasks, unless ``seeds`` names them: one group per seed at ``difficulty`` (an evaluation set)."""
        reply = self._stub.CreateRun(farm_pb2.CreateRunRequest(env=env, agent=agent, rollouts=rollouts,
                                                               group_size=group_size, seeds=list(seeds),
                                                               difficulty=difficulty),
                                     metadata=self._metadata, timeout=self._timeout)
        return _run(reply.run)

    def get_run(self, run_id: int) -> dict[str, Any]:
        reply = self._stub.GetRun(farm_pb2.GetRunRequest(run_id=run_id), metadata=self._metadata,
                                  timeout=self._timeout)
        return _run(reply.run)

    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest ``limit`` runs, newest first (paged through as needed)."""
        out: list[dict[str, Any]] = []
        token = ""
        while len(out) < limit:
            reply = self._stub.ListRuns(farm_pb2.ListRunsRequest(page_size=min(limit - len(out), 1000),
                                                                 page_token=token),
                                        metadata=self._metadata, timeout=self._timeout)
            out.extend(_run(r) for r in reply.runs)
            token = reply.next_page_token
            if not token:
                break
        return out

    def progress(self, run_ids: list[int]) -> dict[str, int]:
        """Jobs, done, failed, cancelled and passed over the given runs."""
        totals = {"jobs": 0, "done": 0, "failed": 0, "cancelled": 0, "passed": 0}
        for run_id in run_ids:
            run = self.get_run(run_id)
            for key in totals:
                totals[key] += run[key]
        return totals

    def cancel_run(self, run_id: int) -> dict[str, Any]:
        reply = self._stub.CancelRun(farm_pb2.CancelRunRequest(run_id=run_id), metadata=self._metadata,
                                     timeout=self._timeout)
        return _run(reply.run)

    def trajectory_pages(self, env: str = "", *, page_size: int = 1000, newest_first: bool = False,
                         full: bool = False, run_id: int = 0, include_withdrawn: bool = False, **where: Any
                         ) -> Iterator[Listing]:
        """Every stored trajectory, a page at a time (``full`` for whole records, else summaries), each with its
        current verdict. ``where`` narrows them: ``agent``, ``policy_version``, ``min_reward``, ``max_reward``,
        ``flag`` (a flag's name, e.g. ``"timeout"``), ``node``; None or absent: any. Withdrawn trajectories are
        left out unless ``include_withdrawn`` (or ``flag`` names ``withdrawn`` or ``quarantined``); every page
        says how many were (``Listing.withdrawn_left_out``), and the verdict mark the listing began at."""
        narrowed = _trajectory_filter(where)
        token = ""
        left_out = mark = 0
        while True:
            reply = self._stub.ListTrajectories(
                farm_pb2.ListTrajectoriesRequest(env=env, page_size=page_size, page_token=token,
                                                 newest_first=newest_first, full=full, run_id=run_id,
                                                 include_withdrawn=include_withdrawn, **narrowed),
                metadata=self._metadata, timeout=self._timeout)
            if not token:  # what the first page says holds for the listing
                left_out, mark = reply.withdrawn_left_out, reply.verdict_mark
            page = Listing(_trajectory(t) for t in reply.trajectories)
            page.withdrawn_left_out, page.verdict_mark = left_out, mark
            token = reply.next_page_token
            if page or not token:
                yield page
            if not token:
                return

    def trajectories(self, env: str = "", limit: int = 50, *, newest_first: bool = False, full: bool = False,
                     run_id: int = 0, include_withdrawn: bool = False, **where: Any) -> Listing:
        """Up to ``limit`` stored trajectories; ``full`` for whole records, else summaries; ``include_withdrawn``
        and ``where`` as in ``trajectory_pages``."""
        out = Listing()
        for page in self.trajectory_pages(env, page_size=min(limit, 1000), newest_first=newest_first, full=full,
                                          run_id=run_id, include_withdrawn=include_withdrawn, **where):
            out.withdrawn_left_out, out.verdict_mark = page.withdrawn_left_out, page.verdict_mark
            out.extend(page[:limit - len(out)])
            if len(out) >= limit:
                break
        return out

    def verdict_changes(self, after_mark: int) -> Iterator[VerdictChange]:
        """Every trajectory whose current verdict changed after ``after_mark`` (a listing's or an export's
        ``verdict_mark``), in the order they changed: withdrawn ones, and those given a later verdict."""
        token = ""
        while True:
            reply = self._stub.ListVerdictChanges(
                farm_pb2.ListVerdictChangesRequest(after_mark=after_mark, page_token=token),
                metadata=self._metadata, timeout=self._timeout)
            for c in reply.changes:
                yield VerdictChange(c.trajectory_id, c.env, c.verdict_version, c.withdrawn, c.withdrawal_reason,
                                    [from_message(s, Score) for s in c.scores])
            token = reply.next_page_token
            if not token:
                return

    def trajectory(self, traj_id: int) -> Trajectory:
        """One whole trajectory, with its scores under every verifier version since."""
        reply = self._stub.GetTrajectory(farm_pb2.GetTrajectoryRequest(id=traj_id), metadata=self._metadata,
                                         timeout=self._timeout)
        return _trajectory(reply.trajectory)

    def rescore(self, env: str, limit: int = 0) -> dict[str, Any]:
        reply = self._stub.Rescore(farm_pb2.RescoreRequest(env=env, limit=limit), metadata=self._metadata)
        return {"scored": reply.scored, "already": reply.already, "errors": reply.errors,
                "verifier_version": reply.verifier_version}

    def clear_node(self, name: str) -> dict[str, Any]:
        """Let a quarantined node join again (an operator's call): why it had been quarantined."""
        reply = self._stub.ClearNode(farm_pb2.ClearNodeRequest(name=name), metadata=self._metadata)
        return {"name": name, "cleared": reply.cleared, "reason": reply.reason}

    # -- tasks and verdicts for a trainer that samples itself (farm_client.verify, farm_client.trl) ----

    def sample_tasks(self, env: str, n: int, *, difficulty: int = 0) -> list[SampledTask]:
        """``n`` tasks of ``env`` drawn from the task bank as it serves them (its picks; with ``difficulty``, fresh
        tasks at that level), each with its prompt as a model is shown it and its reference."""
        from farm_client import verify

        out: list[SampledTask] = []
        while len(out) < n:
            reply = self._stub.SampleTasks(
                farm_pb2.SampleTasksRequest(env=env, count=min(n - len(out), verify.MAX_SAMPLED), difficulty=difficulty),
                metadata=self._metadata, timeout=self._timeout)
            out += verify.sampled(reply)
        return out

    def verify(self, agent: str, tasks: Sequence[Any], completions: Sequence[str], *, retries: int = 3,
               backoff_s: float = 0.5) -> list[Verdict]:
        """Each completion of the task beside it (a ``SampledTask``, or anything with ``env``, ``seed`` and
        ``difficulty``) judged by the farm and stored as a trajectory of agent ``verify:AGENT``; the verdicts in
        order. Items of one task are stored as one group where they fit one call. A task the farm cannot make
        comes back as that item's ``error``; a judge that could not judge is tried again ``retries`` times, then
        its ``grpc.RpcError`` (UNAVAILABLE) is raised: never a reward of 0."""
        from farm_client import verify

        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks and {len(completions)} completions: one completion per task")
        refs = [verify.task_ref(t) for t in tasks]
        out: list[Verdict | None] = [None] * len(refs)
        for indices in verify.calls(refs, completions):
            message = verify.request(agent, refs, completions, indices)
            reply = verify.retrying(lambda m=message: self._stub.Verify(m, metadata=self._metadata,  # type: ignore[misc]
                                                                         timeout=max(self._timeout, 300.0)),
                                    retries, backoff_s)
            for i, v in zip(indices, verify.verdicts(reply, error_dict), strict=True):
                out[i] = v
        return [v for v in out if v is not None]

    # -- the trainer's side -----------------------------------------------------------------------

    def batches(self, consumer: str, batch_size: int = 64, *, whole_groups: bool = False, max_staleness: int = 0,
                summary_only: bool = False, tensors: bool = False, reconnect_s: float = 0.0, agent: str = "",
                envs: Sequence[str] = (), withdrawals_after: int = 0, tokens_only: bool = False) -> Iterator[Batch]:
        """Scored trajectories, batch by batch, from just after ``consumer``'s last ack; blocks for more.

        At least once: what was not acked comes again when the stream is reopened. With
        ``reconnect_s`` the stream survives a farmd restart, reopening for up to that many
        seconds; ack each batch before taking the next and none is received twice.

        ``agent`` and ``envs`` subscribe: only trajectories of that agent spec (as queued, e.g.
        ``torch:tiny``) and of those environments come, and ``max_staleness`` counts versions of that
        agent's own policy line. A trainer subscribes to its own policy, so no other agent's
        trajectories (scripted controls, evaluations, another lab's endpoint) reach its loss.

        Each batch's ``withdrawn`` lists trajectories quarantined since the last (from the first withdrawal
        after ``withdrawals_after``): none is streamed again, and one already taken may be dropped.

        ``summary_only`` leaves out the task, the conversation, the turns and the steps; ``tokens_only`` leaves
        out all a loss does not need (the task, the conversation, the steps, the final text, the verifier's
        details and the scores) and keeps the turns' token ids and sampling logprobs: what ``tensors`` and
        ``collate`` read, in about half the bytes and the time.
        """
        told = withdrawals_after
        withdrawn: list[Withdrawal] = []
        down_since: float | None = None
        while True:
            request = farm_pb2.StreamTrajectoriesRequest(consumer=consumer, batch_size=batch_size,
                                                         whole_groups=whole_groups, max_staleness=max_staleness,
                                                         summary_only=summary_only, tokens_only=tokens_only,
                                                         agent=agent, envs=list(envs),
                                                         withdrawals_after=told)
            stream = self._stub.StreamTrajectories(request, metadata=self._metadata)
            try:
                # Each message read as it comes: the next is on its way (farmd builds it meanwhile).
                parts: list[Trajectory] = []
                for reply in stream:
                    down_since = None
                    parts.extend(_trajectory(t) for t in reply.trajectories)
                    for w in reply.withdrawals:
                        withdrawn.append(Withdrawal(w.seq, w.trajectory_id, w.env, w.reason))
                        told = max(told, w.seq)
                    if reply.more:  # a batch too big for one message continues in the next
                        continue
                    whole, parts = parts, []
                    if not whole:
                        continue  # only stale ones: the next batch's up_to covers them (and its withdrawals)
                    batch = self._batch(whole, reply.up_to, consumer, whole_groups, tensors)
                    batch.withdrawn, withdrawn = withdrawn, []
                    yield batch
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or not reconnect_s:
                    raise
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > reconnect_s:
                    raise
                time.sleep(_RETRY_S)
            finally:
                stream.cancel()  # type: ignore[no-untyped-call]

    @staticmethod
    def _batch(rows: list[Trajectory], up_to: int, consumer: str, whole_groups: bool, tensors: bool) -> Batch:
        batch = Batch(consumer=consumer, whole_groups=whole_groups, up_to=up_to, trajectories=rows,
                      group_ids=[r.group_id for r in rows])
        if tensors:
            import torch  # optional: only trainers that ask for tensors need it

            rewards = [r.reward for r in rows]
            batch.rewards = torch.tensor(rewards, dtype=torch.float32)
            batch.advantages = torch.tensor(advantages(rewards, batch.group_ids), dtype=torch.float32)
        return batch

    def ack(self, batch_or_consumer: Batch | str, up_to: int | None = None, whole_groups: bool = False,
            retry_s: float = 0.0) -> int:
        """Acknowledge a batch (or ``consumer`` up to ``up_to``); returns the consumer's cursor.

        With ``retry_s`` an unreachable farmd is retried for that long: acks are idempotent.
        """
        if isinstance(batch_or_consumer, Batch):
            consumer, up_to, whole_groups = (batch_or_consumer.consumer, batch_or_consumer.up_to,
                                             batch_or_consumer.whole_groups)
        else:
            consumer = batch_or_consumer
        request = farm_pb2.AckRequest(consumer=consumer, up_to=up_to or 0, whole_groups=whole_groups)
        deadline = time.monotonic() + retry_s
        while True:
            try:
                reply = self._stub.Ack(request, metadata=self._metadata, timeout=self._timeout)
                return int(reply.cursor)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(_RETRY_S)

    def publish_policy(self, policy: Any = None, *, uri: str | None = None, name: str = "") -> dict[str, Any]:
        """Publish a policy to line ``name``: bytes, a torch state_dict (saved with torch.save), or a ``uri``.
        ``torch:NAME`` jobs leased from now on run it."""
        if policy is None and uri is None:
            raise ValueError("publish bytes, a state_dict, or a uri")
        data = b""
        if policy is not None:
            if isinstance(policy, bytes | bytearray):
                data = bytes(policy)
            else:
                import torch

                buf = io.BytesIO()
                torch.save(policy, buf)
                data = buf.getvalue()
        digest = hashlib.sha256(data if data else (uri or "").encode()).hexdigest()

        def chunks() -> Iterator[farm_pb2.PublishPolicyRequest]:
            yield farm_pb2.PublishPolicyRequest(sha256=digest, uri=uri or "", data=data[:_CHUNK], name=name)
            for start in range(_CHUNK, len(data), _CHUNK):
                yield farm_pb2.PublishPolicyRequest(data=data[start:start + _CHUNK])

        reply = self._stub.PublishPolicy(chunks(), metadata=self._metadata, timeout=self._timeout * 10)
        return {"version": reply.version, "sha256": reply.sha256, "size": reply.size, "name": reply.name}

    def get_policy(self, sha256: str = "", *, name: str = "") -> tuple[int, bytes, str]:
        """(version, content, uri) of a policy by hash, or of the latest one (of line ``name``, if given)."""
        data = bytearray()
        version, uri = 0, ""
        for chunk in self._stub.GetPolicy(farm_pb2.GetPolicyRequest(sha256=sha256, name=name),
                                          metadata=self._metadata, timeout=self._timeout * 10):
            version = version or chunk.version
            uri = uri or chunk.uri
            data += chunk.data
        return version, bytes(data), uri

    def policies(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest ``limit`` policy versions, newest first: line, hash, size, whether the farm still holds the
        content (``kept``), ``pinned_at``, and ``removed_at`` with ``removed_reason`` (times in seconds, or None)."""
        out: list[dict[str, Any]] = []
        token = ""
        while len(out) < limit:
            reply = self._stub.ListPolicies(farm_pb2.ListPoliciesRequest(page_size=min(limit - len(out), 1000),
                                                                         page_token=token),
                                            metadata=self._metadata, timeout=self._timeout)
            out.extend(_policy(p) for p in reply.policies)
            token = reply.next_page_token
            if not token:
                break
        return out

    def pin_policy(self, version: int, pinned: bool = True) -> dict[str, Any]:
        """Keep policy ``version``'s content whatever else holds (``pinned``), or stop keeping it for that reason.
        An operator's call; returns the version as ``policies`` lists it."""
        reply = self._stub.PinPolicy(farm_pb2.PinPolicyRequest(version=version, pinned=pinned),
                                     metadata=self._metadata, timeout=self._timeout)
        return _policy(reply.policy)


def _seconds(at: Timestamp, present: bool) -> float | None:
    return at.ToNanoseconds() / 1e9 if present else None


def _policy(p: farm_pb2.PolicyInfo) -> dict[str, Any]:
    pinned, removed = p.HasField("pinned_at"), p.HasField("removed_at")
    return {"version": p.version, "name": p.name, "sha256": p.sha256, "size": p.size, "uri": p.uri,
            "created_at": _seconds(p.created_at, p.HasField("created_at")), "kept": p.kept, "pinned": pinned,
            "pinned_at": _seconds(p.pinned_at, pinned), "removed": removed,
            "removed_at": _seconds(p.removed_at, removed), "removed_reason": p.removed_reason}


_FILTERS = frozenset({"agent", "policy_version", "min_reward", "max_reward", "flag", "node"})


def _trajectory_filter(where: dict[str, Any]) -> dict[str, Any]:
    """``trajectory_pages``' filters as ListTrajectoriesRequest fields (a flag by its name in the record)."""
    unknown = set(where) - _FILTERS
    if unknown:
        raise TypeError(f"unknown trajectory filters {sorted(unknown)}; known: {sorted(_FILTERS)}")
    fields = {k: v for k, v in where.items() if v is not None and v != ""}
    if "flag" in fields:
        fields["flag"] = trajectory_pb2.Flag.Value(f"FLAG_{str(fields['flag']).upper()}")
    return fields


def status_dict(reply: farm_pb2.GetStatusResponse) -> dict[str, Any]:
    """A status reply as plain values: enums by name, times in seconds, the bank per environment."""
    plain = MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True,
                          use_integers_for_enums=False)
    plain["uptime_s"] = reply.uptime.ToNanoseconds() / 1e9
    del plain["uptime"]
    for key in ("queue", "counters"):  # uint64s: JSON strings in the proto mapping, numbers here
        plain[key] = {k: int(v) for k, v in plain.get(key, {}).items()}
    for key in ("last_seq", "policy_version"):
        plain[key] = int(plain.get(key, 0))
    plain["pass_rates"] = [{**row, **{k: int(row[k]) for k in ("trajectories", "passed", "errors", "difficulty")},
                            "mean_reward": row.get("mean_reward")} for row in plain.get("pass_rates", [])]
    bank = [MessageToDict(b, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            for b in reply.bank]
    for entry, message in zip(bank, reply.bank, strict=True):
        for name in ("level_pass_rate", "band_occupancy", "fresh_share", "informative_fraction"):
            entry[name] = getattr(message, name) if message.HasField(name) else None
        for name, value in list(entry.items()):
            if isinstance(value, str) and value.isdigit():
                entry[name] = int(value)
    named = {e["env"]: {k: v for k, v in e.items() if k != "env"} for e in bank}
    plain["bank"] = {"policy_version": plain["policy_version"], "totals": named.pop("", {}), "envs": named}
    plain["consumers"] = [{"name": c.name, "whole_groups": c.whole_groups, "cursor": c.cursor, "lag": c.lag,
                           "streams": c.streams,
                           "state": farm_pb2.ConsumerState.Name(c.state).removeprefix("CONSUMER_STATE_").lower(),
                           "acked_at": c.acked_at.ToNanoseconds() / 1e9 if c.HasField("acked_at") else None}
                          for c in reply.consumers]
    plain["standbys"] = [{"address": b.address, "since": b.since.ToNanoseconds() / 1e9} for b in reply.standbys]
    plain["recent_failures"] = [{"job_id": f.job_id, "run_id": f.run_id, "attempt": f.attempt, "final": f.final,
                                 "error": error_dict(f.error), "at": f.at.ToNanoseconds() / 1e9}
                                for f in reply.recent_failures]
    plain["nodes"] = [{"name": n.name, "address": n.address,
                       "state": farm_pb2.NodeState.Name(n.state).removeprefix("NODE_STATE_").lower(),
                       "capacity": n.capacity, "in_flight": n.in_flight, "done": n.done, "failed": n.failed,
                       "last_heartbeat": n.last_heartbeat.ToNanoseconds() / 1e9 if n.HasField("last_heartbeat") else None,
                       "last_seen": n.last_seen.ToNanoseconds() / 1e9 if n.HasField("last_seen") else None,
                       "policy_versions": list(n.policy_versions), "isolation_ok": n.isolation_ok,
                       "version": n.version, "facts": dict(n.facts), "refused": n.refused, "checked": n.checked,
                       "disagreed": n.disagreed, "canaries": n.canaries, "quarantine_reason": n.quarantine_reason,
                       "quarantined_at": n.quarantined_at.ToNanoseconds() / 1e9 if n.HasField("quarantined_at")
                       else None} for n in reply.nodes]
    d = reply.disk
    plain["disk"] = {"store_bytes": d.store_bytes, "policy_bytes": d.policy_bytes, "policy_files": d.policy_files,
                     "policies_kept": d.policies_kept, "policies_removed": d.policies_removed,
                     "policies_pinned": d.policies_pinned, "policy_bytes_removed": d.policy_bytes_removed,
                     "store_growth_bytes_per_hour": d.store_growth_bytes_per_hour
                     if d.HasField("store_growth_bytes_per_hour") else None,
                     "policy_growth_bytes_per_hour": d.policy_growth_bytes_per_hour
                     if d.HasField("policy_growth_bytes_per_hour") else None,
                     "growth_window_s": d.growth_window.ToNanoseconds() / 1e9,
                     "policy_keep_newest": d.policy_keep_newest}
    return plain
