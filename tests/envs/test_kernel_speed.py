"""kernel's speed reward, end to end in real boxes: parity for the reference against itself, credit
for a kernel truly faster, none for one that is slower, sleeps, or works out of its runner's sight;
and a reference stopped by the submission is the submission's failure.

Some of these run a submission that does what the kernel rules forbid (importing os, forking,
signalling): they call the judge without the rules, so that what is tested is the timing protocol's
own robustness, not the rules' (tested in tests/verifier)."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from farmd.envs import Attempt, Task, VerifyContext
from farmd.envs.kernel import POLICY, SAMPLE, Kernel, Spec
from farmd.sandbox import Sandbox
from farmd.verifier import Verdict, VerifierKey
from farmd.verifier.boxjudge import JudgeReport, run_judge
from farmd.verifier.kernels import CHECKS, SPEED_AT_PARITY, WARMUP, judge_kernel
from farmd.verifier.verdict import SUSPECTED_HACK

pytestmark = [pytest.mark.sandbox, pytest.mark.clocked]

ENV = Kernel()
KEY = VerifierKey(b"kernel-speed-test-key-32-bytes!!")
CHEAP = ENV.generate(0, 2)  # softmax or log-softmax: a few passes over the data, as cheap as the call itself
DEAR = ENV.generate(0, 4)  # a windowed op: the call is mostly the function's work


def twice(source: str) -> str:
    return source + "\n_once = kernel\n\n\ndef kernel(*args):\n    _once(*args)\n    return _once(*args)\n"


class DoubledReference(Kernel):
    """Each task's reference does its work twice: the plain reference is then a truly 2x faster kernel."""

    def spec(self, seed: int, difficulty: int) -> Spec:
        s = super().spec(seed, difficulty)
        return Spec(replace(s.op, source=twice(s.op.source)), s.args, s.out, s.consts)


async def verify(env: Kernel, task: Task, source: str) -> Verdict:
    async with Sandbox() as sandbox:
        return await env.verify(task, Attempt(final=source), VerifyContext(sandbox=sandbox, key=KEY))


async def judge(task: Task, submission: str, *, reference_source: str | None = None,
                per_call_s: float = 5.0) -> tuple[Verdict, JudgeReport]:
    """What ``Kernel.verify`` does, without the rules that would refuse these submissions before they ran."""
    s = ENV.spec(task.seed, task.difficulty)
    ctx = VerifyContext(sandbox=None, key=KEY)  # type: ignore[arg-type]
    cases = ENV.inputs(s, task, ctx)
    fn = s.reference()
    expected = [np.asarray(fn(*[a.copy() for a in case])) for case in cases]
    rng = np.random.default_rng(7)
    tests: list[dict[str, Any]] = []
    blobs = {}
    for i, case in enumerate(cases):
        blobs[f"in{i}.bin"] = b"".join(a.tobytes() for a in case)
        test: dict[str, Any] = {"id": i, "arrays": [[a.dtype.str, list(a.shape)] for a in case],
                                "blob": f"in{i}.bin", "timed": i >= CHECKS,
                                "sample": np.sort(rng.choice(expected[i].size, min(SAMPLE, expected[i].size),
                                                             replace=False)).tolist()}
        if i >= CHECKS:
            test["echo"] = [expected[i].dtype.str, list(expected[i].shape)]
        tests.append(test)
    spec = {"nonce": KEY.nonce(), "mode": "array", "entry_point": "kernel", "per_call_s": per_call_s, "tests": tests,
            "reference_source": reference_source or s.reference_source()}
    async with Sandbox() as sandbox:
        report = await run_judge(sandbox, submission, spec, POLICY, blobs=blobs)
    return judge_kernel(ENV.verifier_version, s.tolerance, report, expected, {t["id"]: t["sample"] for t in tests}), report


def reference(task: Task) -> str:
    return ENV.reference(task).final


# -- the reward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("task", [CHEAP, DEAR], ids=["cheap", "dear"])
async def test_the_reference_against_itself_is_at_parity(task: Task) -> None:
    verdict = await verify(ENV, task, reference(task))
    assert verdict.passed and verdict.details["clock"] == "cpu", verdict.reasons
    assert abs(verdict.reward - SPEED_AT_PARITY) <= 0.1, verdict.details
    assert verdict.details["rounds"] > 0 and verdict.details["tests"] == len(ENV.inputs(
        ENV.spec(task.seed, task.difficulty), task, VerifyContext(sandbox=None, key=KEY)))  # type: ignore[arg-type]


@pytest.mark.parametrize("task", [CHEAP, DEAR], ids=["cheap", "dear"])
async def test_a_kernel_twice_as_fast_earns_nearly_full_speed_credit(task: Task) -> None:
    def measured_well(v: Verdict) -> bool:
        return v.passed and v.details["significant"] and v.reward > 0.8 and 1.6 < v.details["speedup"] < 2.5

    verdict = await verify(DoubledReference(), task, reference(task))
    if task is CHEAP and verdict.passed and not measured_well(verdict):
        # The cheap kernel's calls take about a millisecond, of which the call itself is most: on a loaded
        # two-core machine one verification in twenty measures it too noisily, either way (2.54x was seen).
        # Once more, as a person would; the bounds stay.
        verdict = await verify(DoubledReference(), task, reference(task))
    assert verdict.passed, verdict.reasons
    assert verdict.details["significant"] and verdict.reward > 0.8, verdict.details
    assert 1.6 < verdict.details["speedup"] < 2.5


async def test_doing_the_work_twice_is_not_fast() -> None:
    verdict = await verify(ENV, DEAR, twice(reference(DEAR)))
    assert verdict.passed, verdict.reasons
    # Half as fast, measured. The upper bound is the one that guards the reward (a slowdown measured as near
    # parity would be paid as such); below, the second call's extra output and cache misses under CI's load made
    # it look slower still (0.37 seen once on a fresh clone), which is no credit either way.
    assert verdict.details["significant"] and 0.3 < verdict.details["speedup"] < 0.65, verdict.details
    assert verdict.reward < 0.35


async def test_sleeping_is_not_speed() -> None:
    """A call that waits costs the machine nothing but time: it is not rewarded as fast (nor, timed
    by CPU, as slow)."""
    slept = reference(DEAR) + textwrap.dedent("""
        import time
        _work = kernel
        def kernel(*args):
            time.sleep(0.004)
            return _work(*args)
    """)
    verdict, _ = await judge(DEAR, slept)
    assert verdict.passed, verdict.reasons
    assert verdict.reward <= SPEED_AT_PARITY + 0.1, verdict.details


# -- work out of the runner's sight ----------------------------------------------------------------

HELPER = """
import os, pickle
_work = kernel
def kernel(*args):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the work, where the runner's CPU clock does not look
        for _ in range({times}):
            out = _work(*args)
        os.write(w, pickle.dumps(out))
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 20):
        data += chunk
    os.close(r)
    {wait}
    return pickle.loads(data)
"""


@pytest.mark.parametrize(("wait", "times"), [("os.waitpid(pid, 0)", 1), ("pass", 10)], ids=["reaped", "left-behind"])
async def test_work_done_in_a_helper_process_is_caught(wait: str, times: int) -> None:
    """A helper the runner reaps is seen to the microsecond (its CPU time joins the runner's
    children's); one left behind only in the box's total, with a margin for the box's own noise."""
    source = reference(DEAR) + HELPER.replace("{wait}", wait).replace("{times}", str(times))
    verdict, report = await judge(DEAR, source)
    assert verdict.status == "ok" and not verdict.passed and verdict.reward == 0.0, verdict.details
    assert SUSPECTED_HACK in verdict.flags and "processes" in verdict.reasons[0], verdict.reasons
    assert report.cpu_s.get("all") is not None


# -- the reference beside the submission -----------------------------------------------------------

SIBLING = """
import os, signal
_work = kernel
_calls = [0]
def _sibling():
    me, parent = os.getpid(), os.getppid()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            with open(f"/proc/{name}/stat") as fh:
                if int(fh.read().rsplit(")", 1)[1].split()[1]) == parent:
                    return int(name)
def kernel(*args):
    _calls[0] += 1
    if _calls[0] == {call}:
        os.kill(_sibling(), signal.{sig})
    return _work(*args)
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
async def test_a_reference_stopped_by_the_submission_fails_the_submission(sig: str) -> None:
    # The submission's call CHECKS + WARMUP + 2 comes in the middle of the timed rounds.
    source = reference(DEAR) + SIBLING.replace("{call}", str(CHECKS + WARMUP + 2)).replace("{sig}", sig)
    verdict, report = await judge(DEAR, source, per_call_s=1.0)
    assert verdict.status == "ok" and not verdict.passed and verdict.reward == 0.0
    assert SUSPECTED_HACK in verdict.flags, verdict.reasons
    assert "the reference, running beside the submission, stopped answering" in verdict.reasons[0]
    assert all(o.ok for o in report.outcomes.values())  # the submission itself answered everything right


async def test_a_reference_failing_before_the_submission_loads_is_the_farms_error() -> None:
    """Before the timed rounds the reference runs alone: nothing of the attempt can have stopped it."""
    dies = reference(DEAR) + "\nimport os\n_work = kernel\n_n = [0]\n\ndef kernel(*args):\n" \
        "    _n[0] += 1\n    if _n[0] == 2:\n        os._exit(0)\n    return _work(*args)\n"
    verdict, _ = await judge(DEAR, reference(DEAR), reference_source=dies)
    assert verdict.status == "error" and "the reference's own run failed on test 1" in verdict.reasons[0]


PREVIEW = """
import os
_reads = {}
_readv = os.readv
def _spy(fd, buffers):  # every input the runner reads, by its first 4 KiB
    n = _readv(fd, buffers)
    if n >= 4096:
        head = bytes(buffers[0][:4096])
        _reads[head] = _reads.get(head, 0) + 1
    return n
os.readv = _spy
_work = kernel
def kernel(*args):
    print("reads-before-call", _reads.get(args[0].tobytes()[:4096], 0), flush=True)
    return _work(*args)
"""


async def test_no_input_reaches_the_submission_before_its_call() -> None:
    """The submission's runner gets an echo before each timed call (for symmetry; its time is not
    used): it must carry inputs already answered, never the ones the call is about to time, or a
    submission could work ahead, unmeasured. Even a submission that spies on every read of its
    runner sees each input once by the time it is called on it."""
    verdict, report = await judge(DEAR, reference(DEAR) + PREVIEW)
    assert verdict.passed, verdict.reasons
    counts = [int(line.split()[-1]) for line in report.agent_log.splitlines() if line.startswith("reads-before-call")]
    assert len(counts) == len(report.outcomes) and max(counts) <= 1, counts


async def test_runners_cannot_read_each_others_memory() -> None:
    """Both runners are alive together now: the submission's cannot open the reference's memory
    (nor the recorder's), because both are forks of a process that is not dumpable."""
    probe = reference(DEAR) + SIBLING.replace("{call}", "0").replace("{sig}", "SIGKILL") + textwrap.dedent("""
        def _try(pid):
            try:
                with open(f"/proc/{pid}/mem", "rb") as fh:
                    fh.seek(4096)
                    fh.read(1)
                return "readable"
            except OSError as exc:
                return f"refused {exc.errno}"
        print("reference-memory", _try(_sibling()), "recorder-memory", _try(os.getppid()), flush=True)
    """)
    verdict, report = await judge(DEAR, probe)
    assert verdict.passed, verdict.reasons  # the probe's kernel is the reference: correct
    assert "reference-memory refused" in report.agent_log and "recorder-memory refused" in report.agent_log, \
        report.agent_log
