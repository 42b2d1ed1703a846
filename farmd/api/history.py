"""The farm over time on the wire: ``GetHistory``'s samples and activity buckets, ``GetLearningCurve``'s
points, and what an operator narrows ``ListTrajectories`` to."""

from __future__ import annotations

from typing import Any

from farm.v1 import farm_pb2, trajectory_pb2

from farmd.errors import BadRequest
from farmd.scheduler.history import Sample
from farmd.scheduler.scheduler import QueueCounts
from farmd.store import ActivityBucket, CurvePoint, TrajectoryFilter

DEFAULT_WINDOW_S = 3600.0
MAX_WINDOW_S = 7 * 24 * 3600.0
DEFAULT_BUCKETS = 60
MAX_BUCKETS = 500
DEFAULT_POINTS = 100
MAX_POINTS = 1000
_FLAG_PREFIX = "FLAG_"


def window_s(request: farm_pb2.GetHistoryRequest) -> float:
    asked = request.window.ToNanoseconds() / 1e9 if request.HasField("window") else 0.0
    if asked < 0:
        raise BadRequest(f"window must not be negative, got {asked:g}s")
    return min(asked, MAX_WINDOW_S) if asked else DEFAULT_WINDOW_S


def buckets(request: farm_pb2.GetHistoryRequest) -> int:
    return min(request.buckets, MAX_BUCKETS) if request.buckets else DEFAULT_BUCKETS


def points(request: farm_pb2.GetLearningCurveRequest) -> int:
    return min(request.points, MAX_POINTS) if request.points else DEFAULT_POINTS


def _at(message: Any, seconds: float) -> None:
    message.FromNanoseconds(round(seconds * 1e9))


def queue_pb(q: QueueCounts) -> farm_pb2.QueueCounts:
    return farm_pb2.QueueCounts(queued=q.queued, leased=q.leased, done=q.done, failed=q.failed, cancelled=q.cancelled)


def sample_pb(s: Sample) -> farm_pb2.StatusSample:
    message = farm_pb2.StatusSample(
        queue=queue_pb(s.queue), throughput_per_s=s.throughput_per_s, policy_version=s.policy_version,
        last_seq=s.last_seq, nodes=s.nodes, nodes_connected=s.nodes_connected, streams=s.streams,
        consumers=[farm_pb2.ConsumerSample(name=c.name, whole_groups=c.whole_groups, cursor=c.cursor, lag=max(0, c.lag),
                                           staleness=c.staleness) for c in s.consumers],
        bank=[farm_pb2.BankSample(env=b.env, level=b.level, band_occupancy=b.band_occupancy,
                                  informative_fraction=b.informative_fraction, level_pass_rate=b.level_pass_rate)
              for b in s.bank])
    _at(message.time, s.time)
    return message


def bucket_pb(b: ActivityBucket) -> farm_pb2.ActivityBucket:
    message = farm_pb2.ActivityBucket(env=b.env, trajectories=b.trajectories, passed=b.passed, errors=b.errors,
                                      mean_difficulty=b.mean_difficulty, max_policy_version=b.max_policy_version,
                                      flags=b.flags)
    _at(message.start, b.start)
    return message


def history_pb(samples: list[Sample], activity: list[ActivityBucket], *, since: float, bucket_s: float,
               sample_every_s: float) -> farm_pb2.GetHistoryResponse:
    reply = farm_pb2.GetHistoryResponse(samples=[sample_pb(s) for s in samples],
                                        activity=[bucket_pb(b) for b in activity])
    reply.bucket.FromNanoseconds(round(bucket_s * 1e9))
    reply.sample_every.FromNanoseconds(round(sample_every_s * 1e9))
    _at(reply.since, since)
    return reply


def curve_pb(agent: str, curve: list[CurvePoint], agents: list[str]) -> farm_pb2.GetLearningCurveResponse:
    reply = farm_pb2.GetLearningCurveResponse(agent=agent, agents=agents)
    for p in curve:
        point = reply.points.add(rollouts=p.rollouts, trajectories=p.trajectories, passed=p.passed,
                                 mean_difficulty=p.mean_difficulty, policy_version=p.policy_version)
        _at(point.time, p.time)
    return reply


def trajectory_filter(request: farm_pb2.ListTrajectoriesRequest) -> TrajectoryFilter:
    """What the request narrows the list to; a reward bound that is not a number is the caller's error."""
    for name in ("min_reward", "max_reward"):
        if request.HasField(name) and getattr(request, name) != getattr(request, name):
            raise BadRequest(f"{name} must be a number")
    flag = None
    if request.flag:
        flag = trajectory_pb2.Flag.Name(request.flag).removeprefix(_FLAG_PREFIX).lower()
    return TrajectoryFilter(
        policy_version=request.policy_version if request.HasField("policy_version") else None,
        min_reward=request.min_reward if request.HasField("min_reward") else None,
        max_reward=request.max_reward if request.HasField("max_reward") else None,
        flag=flag, node=request.node or None, agent=request.agent or None)
