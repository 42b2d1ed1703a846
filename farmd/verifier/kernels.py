"""Judging a kernel-mode judge run: outputs checked against the host's expected arrays, then timed.

The judge (``farmd.verifier.judge``, in the box) answers the correctness tests (the first ``CHECKS``)
with the reference alone and then with the submission, and then runs timed rounds, each a fresh
input answered by both, one right after the other. Here, on the host, every output is checked at
the positions sampled for this run against the expected arrays, within a magnitude-aware
tolerance, and the speedup is computed from the rounds (``farmd.verifier.speed``). What this module
needs of an environment comes in as plain data: the expected arrays, the sampled positions and
the tolerance.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from farmd.verifier.boxjudge import JudgeReport, TestOutcome, broke_a_rule, opening_verdict
from farmd.verifier.speed import Speed, paired_speed
from farmd.verifier.verdict import RULE_BROKEN, SUSPECTED_HACK, TIMEOUT, Verdict, errored

if TYPE_CHECKING:  # imported where a kernel is judged: a farmd that judges none never loads numpy
    import numpy as np

CHECKS = 4
"""Correctness tests before timing (edge cases among them)."""
WARMUP = 1
"""Timed rounds whose times are thrown away: the first calls of a process grow its heap."""
CONFIDENCE = 0.95
"""Speed is credited only when the sign test's interval for the median speedup, at this confidence,
leaves out parity; otherwise the kernel is as fast as the reference, as far as can be told."""
SPEED_AT_PARITY = 0.5
"""Reward of a correct kernel exactly as fast as the reference; twice as fast earns 1.0."""
MIN_REWARD = 0.05
"""A correct kernel, however slow, is worth more than a wrong one."""
MIN_COMPUTE_S = 20e-6
"""Below this, a call's time net of its overhead is noise: speedups are capped through it."""
UNSEEN_CPU_S = 0.02
UNSEEN_CPU_SHARE = 0.05
"""CPU time the box spends beyond what its judge's processes account for, over which the attempt is
taken to have worked out of its runner's sight: this much, plus this share of the box's total (the
box's init and the counts' skew made 2 to 6 ms here)."""
UNSEEN_TREE_CPU_S = 0.001
"""CPU time of processes the submission's runner started and reaped, over which the same holds (a
correct kernel starts none: the counts agree to the microsecond, the runner's clock read once it is a
zombie, its exit included)."""


def speed_reward(speedup: float) -> float:
    """A correct kernel's reward at ``speedup`` times the reference's speed."""
    return max(MIN_REWARD, min(1.0, SPEED_AT_PARITY * speedup)) if math.isfinite(speedup) else 1.0 \
        if speedup > 0 else MIN_REWARD


@dataclass(frozen=True)
class Tolerance:
    """How far an output may be from the expected one: ``atol`` scaled by the expected magnitude, plus ``rtol``."""

    atol: float
    rtol: float


def judge_kernel(version: str, tol: Tolerance, report: JudgeReport, expected: list[np.ndarray],
                 samples: dict[int, list[int]]) -> Verdict:
    verdict, readable = opening_verdict(version, report)
    if not readable:
        return verdict
    # The correctness checks: the reference answered them alone, before the submission was loaded,
    # so its failing there is ours, not the attempt's.
    for i in range(CHECKS):
        ref = report.ref_outcomes.get(i)
        if ref is None or not ref.ok or not _matches(ref, expected[i], tol, samples.get(i))[0]:
            return errored(version, f"the reference's own run failed on test {i}")
    wrong = 0
    for i, want in enumerate(expected):
        outcome = report.outcomes.get(i)
        if outcome is None or outcome.lost or not outcome.ok:
            wrong += 1
            why = "no answer" if outcome is None else (outcome.lost and f"no answer ({outcome.lost})") or outcome.error
            if outcome is not None and outcome.lost:
                verdict.flag(TIMEOUT if outcome.lost == "timeout" else SUSPECTED_HACK)
            if outcome is not None and broke_a_rule(outcome):
                verdict.flag(SUSPECTED_HACK)
                verdict.flag(RULE_BROKEN)
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: {why}")
            continue
        ok, why = _matches(outcome, want, tol, samples.get(i))
        if not ok:
            wrong += 1
            if len(verdict.reasons) < 5:
                verdict.reasons.append(f"test {i}: {why}")
    rounds = _timed_rounds(verdict, tol, report, expected, samples)
    unseen = _unseen_work(report)
    if unseen is not None:
        verdict.flag(SUSPECTED_HACK)
        verdict.reasons.insert(0, unseen)
    speed, details = _speed(rounds)
    verdict.details = {"tests": len(expected), "failed": wrong, **details}
    if wrong == 0 and report.done and not report.anomalies and not verdict.flags:
        verdict.passed = True
        verdict.reward = speed_reward(speed)
        low, high = details["speedup_interval"] if rounds else (speed, speed)
        # The rewards this measurement cannot tell apart: another box's run of the same kernel (a coordinator
        # checking a node's verdict) agrees anywhere in here (``farmd.scheduler.checks``).
        verdict.details["reward_interval"] = [min(speed_reward(low), verdict.reward),
                                              max(speed_reward(high), verdict.reward)]
        verdict.reasons = [f"all {len(expected)} outputs correct; {speed:.2f}x the reference's speed"
                           + ("" if details["significant"] else " (no difference the timing can tell)")]
    return verdict


@dataclass(frozen=True)
class _Round:
    ref: TestOutcome
    echo: TestOutcome
    sub: TestOutcome
    ref_first: bool
    """The judge's order: the reference first in even rounds, the submission first in odd ones."""


def _timed_rounds(verdict: Verdict, tol: Tolerance, report: JudgeReport, expected: list[np.ndarray],
                  samples: dict[int, list[int]]) -> list[_Round]:
    """The rounds that count, with both sides' answers. From the first timed test on, the reference
    ran beside the loaded submission: a reference that stopped answering or answered wrong there
    was stopped or disturbed by the submission (it cannot fail by itself on a test the host's copy
    of it passed), and the attempt is flagged for it."""
    rounds = []
    for i in range(CHECKS, len(expected)):
        ref = report.ref_outcomes.get(i)
        echo = report.ref_outcomes.get(-1 - i)
        if any(o is not None and (o.lost or "").startswith("not run") for o in (ref, echo)):
            continue  # the submission had stopped answering: the reference was not asked
        if ref is None or echo is None or not ref.ok or not echo.ok \
                or not _matches(ref, expected[i], tol, samples.get(i))[0]:
            verdict.flag(SUSPECTED_HACK)
            lost = (ref.lost if ref is not None else None) or (echo.lost if echo is not None else None)
            verdict.reasons.insert(0, f"test {i}: the reference, running beside the submission, "
                                      + (f"stopped answering ({lost})" if lost else "was disturbed"))
            return []
        sub = report.outcomes.get(i)
        if i >= CHECKS + WARMUP and sub is not None and sub.ok:
            rounds.append(_Round(ref, echo, sub, ref_first=(i - CHECKS) % 2 == 0))
    return rounds


def _speed(rounds: list[_Round]) -> tuple[float, dict[str, Any]]:
    """The speedup the reward is computed from, and the figures behind it.

    Timed by the runners' CPU time: on a machine shared with other work, time spent preempted is
    most of the noise of a wall clock (measured here: a true 2x read as 0.4x to 3x by wall time on
    a loaded machine, 1.9x to 2.1x by CPU time), and a runner's CPU clock does not count it, nor
    the time a neighbour holds the box's CPU quota. What a call costs besides the function (moving
    arrays through pipes, checking them) is measured by the reference's echoes and taken off both
    sides, so that the speedup is the functions'. Going first in a round costs more (measured
    here: about 100 us more for the echo and the call alike), so the overhead taken off a call is
    that of the reference's echoes in the same place: the first-goer's in the rounds where the
    reference went first, the second's in the others. Work a runner's CPU clock cannot see (a
    helper process) is caught by the box's CPU count instead: see ``_unseen_work``.
    """
    import numpy as np

    cpu_known = bool(rounds) and all(x.ref.cpu_seconds is not None and x.echo.cpu_seconds is not None
                                     and x.sub.cpu_seconds is not None for x in rounds)

    def clock(outcome: TestOutcome) -> float:
        return outcome.cpu_seconds if cpu_known and outcome.cpu_seconds is not None else outcome.seconds

    def wall(outcome: TestOutcome) -> float:
        return outcome.seconds

    def measure(of: Callable[[TestOutcome], float]) -> tuple[Speed, float]:
        if not rounds:
            return paired_speed([], []), 0.0
        echoes = {first: [of(x.echo) for x in rounds if x.ref_first == first] or [of(x.echo) for x in rounds]
                  for first in (True, False)}
        overhead = {first: float(np.median(e)) for first, e in echoes.items()}  # keyed by "went first"
        ref = [of(x.ref) - overhead[x.ref_first] for x in rounds]
        sub = [of(x.sub) - overhead[not x.ref_first] for x in rounds]
        speed = paired_speed(ref, sub, floor_s=MIN_COMPUTE_S, confidence=CONFIDENCE)
        return speed, float(np.median([of(x.echo) for x in rounds]))

    def median(side: str) -> float | None:
        return float(np.median([clock(getattr(x, side)) for x in rounds])) if rounds else None

    speed, overhead = measure(clock)
    credited = speed.credited if rounds else 0.0
    return credited, {
        "clock": "cpu" if cpu_known else "wall", "rounds": speed.rounds, "speedup": credited,
        "speedup_median": speed.ratio, "speedup_interval": [speed.low, speed.high],
        "significant": speed.significant, "wall_speedup_median": measure(wall)[0].ratio,
        "call_overhead_s": overhead, "reference_median_s": median("ref"), "submission_median_s": median("sub"),
    }


def _unseen_work(report: JudgeReport) -> str | None:
    """Why the box's CPU time does not add up to what its runners' clocks saw, or None.

    The recorder counts its own CPU time and its reaped runners' (the submission's runner's with and
    without the children it reaped); the box's cgroup counts every process's. A correct kernel works
    on its runner's own thread, so the counts agree. Work done in another process (reaped by the
    submission's runner, or left behind) is invisible to the runner's CPU clock and would read as
    speed: it shows up here instead."""
    cpu = report.cpu_s
    if "runner" in cpu and "runner_tree" in cpu and cpu["runner_tree"] - cpu["runner"] > UNSEEN_TREE_CPU_S:
        return (f"{cpu['runner_tree'] - cpu['runner']:.3f} s of CPU time was spent by processes the submission "
                "started (kernels run on their caller's thread only)")
    if "all" in cpu and report.box.cpu_s - cpu["all"] > UNSEEN_CPU_S + UNSEEN_CPU_SHARE * report.box.cpu_s:
        return (f"{report.box.cpu_s - cpu['all']:.3f} s of the box's CPU time was spent outside the judge's "
                "processes (kernels run on their caller's thread only)")
    return None


def _matches(outcome: TestOutcome, want: np.ndarray, tol: Tolerance, sample: list[int] | None = None) -> tuple[bool, str]:
    import numpy as np

    if outcome.dtype != want.dtype.str:
        return False, f"dtype {outcome.dtype}, expected {want.dtype.str}"
    if outcome.shape != list(want.shape):
        return False, f"shape {outcome.shape}, expected {list(want.shape)}"
    if sample is not None:
        want = want.ravel()[np.asarray(sample, dtype=np.int64)]
    try:
        raw = base64.b64decode(outcome.data or "", validate=True)
        got = np.frombuffer(raw, dtype=want.dtype).reshape(want.shape)
    except (ValueError, TypeError):
        return False, "unreadable output"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        bound = tol.atol * scale + tol.rtol * np.abs(want.astype(np.float64))
        # "not err <= bound", element by element: NaN anywhere in the output fails.
        if not bool(np.all(err <= bound)):
            return False, f"wrong values (max error {float(np.nanmax(err)) if np.isfinite(err).any() else 'nan'})"
    if want.size > 1 and np.ptp(want) > 0 and np.ptp(got) == 0:
        return False, "constant output where the reference varies"
    if np.any(want != 0) and not np.any(got):
        return False, "all-zero output"
    return True, ""
