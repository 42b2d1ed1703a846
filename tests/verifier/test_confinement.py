"""Confined code (kernels) in a real judge box: the rules hold at run time, where no static check sees.

The static check is switched off here (``"static": False``) so that each attempt reaches the audit
hook: it must refuse what a kernel never needs, keep refusing once refused (catching the error
does not help), and let numpy be numpy (lazy submodules, warnings). A second runner check: the
inputs after each call are the bytes that were sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from farmd.sandbox import Sandbox, SandboxPolicy
from farmd.verifier.boxjudge import JudgeReport, broke_a_rule, opening_verdict, run_judge
from farmd.verifier.judge import RULE_BROKEN
from farmd.verifier.verdict import SUSPECTED_HACK

pytestmark = pytest.mark.sandbox

POLICY = SandboxPolicy(wall_time_s=20, memory_mb=1024, output_kb=4096)
X = np.arange(-8, 8, dtype=np.float32).reshape(2, 8)
RULES = {"imports": ["math", "numpy"], "static": False}


def spec(rules: dict[str, Any] | None = RULES, n: int = 3) -> dict[str, Any]:
    out: dict[str, Any] = {"nonce": "confine-nonce", "mode": "array", "entry_point": "kernel", "per_call_s": 5.0,
                           "tests": [{"id": i, "arrays": [["<f4", [2, 8]]], "blob": "x.bin"} for i in range(n)]}
    if rules is not None:
        out["rules"] = rules
    return out


async def judge(sandbox: Sandbox, source: str, rules: dict[str, Any] | None = RULES) -> JudgeReport:
    return await run_judge(sandbox, source, spec(rules), POLICY, blobs={"x.bin": X.tobytes()})


def kernel(at_import: str = "", in_call: str = "") -> str:
    body = "".join(f"    {line}\n" for line in in_call.splitlines())
    return f"import numpy as np\n{at_import}\ndef kernel(x):\n{body}    return x * 2\n"


# Each breaks a rule, at import or inside the call; the error is caught where that is possible.
BREAKS = {
    "open a file": kernel("try:\n    open('/proc/1/cmdline').read()\nexcept Exception:\n    pass"),
    "open a file through numpy": kernel(in_call="np.fromfile('/proc/self/status', dtype=np.uint8)"),
    "start a thread": kernel("import _thread\n_thread.start_new_thread(lambda: None, ())"),
    "start a thread after reloading _thread": kernel(
        "import _thread, importlib, time\nimportlib.reload(_thread)\n_thread.start_new_thread(time.sleep, (5,))"),
    "import a module not loaded": kernel("import threading"),
    "numpy.testing (loads unittest)": kernel(in_call="np.testing.assert_equal(1, 1)"),
    "os.system": kernel("import os\nos.system('true')"),
    "os.fork": kernel("import os\ntry:\n    os.fork()\nexcept Exception:\n    pass"),
    "kill the recorder": kernel("import os\nos.kill(os.getppid(), 9)"),
    "ctypes": kernel("import ctypes\nctypes.CDLL(None).getpid()"),
    "ctypes through np.ctypeslib": kernel("np.ctypeslib.load_library('libc.so.6', '/lib/x86_64-linux-gnu')"),
    "walk frames": kernel(in_call="import sys\nsys._getframe(1)"),
    "walk a traceback": kernel(in_call="try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame"),
    "scan the heap": kernel(in_call="import gc\ngc.get_objects()"),
    "trace": kernel("import sys\nsys.settrace(None)"),
    "another audit hook": kernel("import sys\nsys.addaudithook(lambda *a: None)"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
async def test_a_broken_rule_fails_every_test_from_then_on_and_is_flagged(name: str) -> None:
    async with Sandbox() as sandbox:
        report = await judge(sandbox, BREAKS[name])
    verdict, readable = opening_verdict("1", report)
    if readable:  # broken inside the call: each test fails, saying which rule
        assert [o.ok for o in report.outcomes.values()] == [False] * 3, report.outcomes
        assert all(broke_a_rule(o) for o in report.outcomes.values()), report.outcomes
    else:  # broken at import
        assert report.import_error and report.import_error.startswith(RULE_BROKEN), report.import_error
        assert SUSPECTED_HACK in verdict.flags
    assert report.done, report.box.stderr[-500:]


ALLOWED = {
    "numpy's lazy submodules": kernel(in_call="y = np.fft.irfft(np.fft.rfft(x), n=8)\nnp.unique(x)\n"
                                              "np.char.upper(['a'])\nnp.polynomial.Polynomial([1, 2])(1.0)"),
    "a warning from the submission's own line": kernel(in_call="y = np.float32(1e38) * np.float32(10)"),
    "a warning from numpy's code": kernel(in_call="np.corrcoef(np.zeros((3, 3)))"),
    "math": kernel("import math", in_call="math.sqrt(2.0)"),
    "repr": kernel(in_call="repr(x); str(x)"),
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
async def test_plain_numpy_computing_is_never_refused(name: str) -> None:
    async with Sandbox() as sandbox:
        report = await judge(sandbox, ALLOWED[name])
    assert report.import_error is None and report.done
    assert [o.ok for o in report.outcomes.values()] == [True] * 3, report.outcomes


async def test_the_static_check_comes_first_and_nothing_of_a_refused_source_runs() -> None:
    source = kernel("import numpy as np\n_u = np.testing._private.utils\n_u.os.system('touch /tmp/ran')")
    async with Sandbox() as sandbox:
        report = await judge(sandbox, source, {"imports": ["math", "numpy"]})
    assert report.refused and "_private" in report.refused
    assert report.outcomes == {} and report.done
    verdict, readable = opening_verdict("1", report)
    assert not readable and SUSPECTED_HACK in verdict.flags and verdict.reasons == [report.refused]


async def test_a_modified_argument_fails_its_test() -> None:
    cases = {
        "in place": ("x *= 2\n    return x", False),
        "written then restored": ("y = x * 2\n    x[0, 0] = 99\n    return y", False),
        "reshaped in place": ("x.shape = (16,)\n    return x.reshape(2, 8) * 2", False),
        "a view, untouched": ("return x[:, :]", True),
        "untouched": ("return x * 2", True),
    }
    async with Sandbox() as sandbox:
        reports = await asyncio.gather(*[
            judge(sandbox, f"import numpy as np\ndef kernel(x):\n    {body}\n", None) for body, _ in cases.values()])
    for (name, (_, fine)), report in zip(cases.items(), reports, strict=True):
        outcomes = list(report.outcomes.values())
        assert len(outcomes) == 3 and all(o.ok is fine for o in outcomes), (name, outcomes)
        if not fine:
            assert all("modified its argument" in (o.error or "") for o in outcomes), name
