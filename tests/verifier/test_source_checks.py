"""What is checked of a submission's source, and where: nothing on the host parses it.

Compiling untrusted text can fail in every way CPython's compiler can: a sum of thousands of terms
raises RecursionError, thousands of unary minuses MemoryError. Such a failure on the host would
turn a wrong attempt into an infrastructure error (and so escape its 0); in the judge's box it is
the attempt's failure. These tests need no box: they pin down the pure parts.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from farmd.envs.kernel import static_problem
from farmd.intake.exploits.source import SUFFIXES
from farmd.verifier import judge
from farmd.verifier.verdict import NO_ANSWER, unreadable_source

WRONG = "def transform(x):\n    return x\n"
HOSTILE = {name: suffix for name, (suffix, _) in SUFFIXES.items() if name != "lone-surrogate"}
KERNEL_RULES = {"imports": ["math", "numpy"]}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_host_check_never_parses(name: str) -> None:
    assert unreadable_source("1", WRONG + HOSTILE[name], 200_000) is None
    assert unreadable_source("1", WRONG + "s = '\ud800'\n", 200_000) is None
    assert unreadable_source("1", "  \n", 100) is not None
    assert NO_ANSWER in unreadable_source("1", "", 100).flags  # type: ignore[union-attr]
    assert unreadable_source("1", "x" * 101, 100) is not None
    assert unreadable_source("1", "\ud800" * 40, 100) is not None  # three bytes each, as U+FFFD


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_source_that_cannot_be_compiled_is_unparseable_whatever_the_compiler_raises(name: str) -> None:
    for rules in (None, KERNEL_RULES, {**KERNEL_RULES, "static": False}):
        problem = judge.source_problem(WRONG + HOSTILE[name], rules)
        assert problem is not None and problem["kind"] == "unparseable", (rules, problem)
    assert "does not compile" in (static_problem(WRONG + HOSTILE[name]) or "")


def test_sources_that_compile_pass() -> None:
    long_but_valid = "_ = (" + "1, " * 20000 + ")\n_ = " + "(" * 150 + "1" + ")" * 150 + "\n"
    assert judge.source_problem(WRONG + long_but_valid) is None
    assert judge.source_problem("import numpy as np\ndef kernel(x):\n    return np.fft.rfft(x).real\n",
                                KERNEL_RULES) is None
    assert judge.source_problem(b"def f(x):\n    return x\n") is None
    assert judge.source_problem(WRONG + "x = (" * 300)["kind"] == "unparseable"  # type: ignore[index]
    assert judge.source_problem(b"\xff\xfe = 1\n")["kind"] == "unparseable"  # type: ignore[index]


REFUSED = {
    "import os": "imports os",
    "from reference import kernel": "calling the reference gets nothing",
    "import numpy.testing._private.utils as u": "private name _private",
    "from numpy.testing._private.utils import os": "private name _private",
    "from numpy.ctypeslib import ctypes": "reaches for ctypes",
    "import numpy as np\n_os = np.testing._private.utils.os": "reaches for os",
    "import numpy as np\nu = np.testing._private.utils": "private name _private",
    "import numpy as np\nt = np.lib.format.os": "reaches for os",
    "import numpy as np\nt = np.ctypeslib.ctypes": "reaches for ctypes",
    "import numpy as np\nb = getattr(np, '_' * 2 + 'builtins' + '_' * 2)": "uses getattr",
    "import numpy as np\nd = vars(np)": "uses vars",
    "x = np.__dict__": "uses __dict__",
    "x = '__builtins__'": "uses __builtins__",
    "x = __loader__": "uses __loader__",
    "exec('1')": "uses exec",
    "def kernel(x):\n    return globals()": "uses globals",
}


@pytest.mark.parametrize("source", sorted(REFUSED))
def test_kernel_rules_refuse_what_reaches_outside_numpy(source: str) -> None:
    problem = judge.source_problem(source, KERNEL_RULES)
    assert problem is not None and problem["kind"] == "refused", problem
    assert REFUSED[source] in problem["why"], problem
    assert judge.source_problem(source, {**KERNEL_RULES, "static": False}) is None  # the audit hook's turn


def test_kernel_rules_let_numpy_be_numpy() -> None:
    source = ("import math\nimport numpy as np\nfrom numpy.lib.stride_tricks import sliding_window_view\n"
              "class K:\n    def __init__(self):\n        self.name = __name__\n"
              "def kernel(x):\n    w = np.lib.stride_tricks.sliding_window_view(x, 3, axis=1)\n"
              "    return np.select([x > 0], [x]) + np.fft.irfft(np.fft.rfft(x), n=x.shape[1]) * math.pi\n")
    assert judge.source_problem(source, KERNEL_RULES) is None


# Audit events recorded in the box while numpy computed every kernel reference and loaded
# numpy.fft, numpy.ma and numpy.char on first use: all must pass.
NUMPY_DIR = "/opt/farm/site/numpy/"
READABLE = (judge.SUBMISSION, NUMPY_DIR)
ALLOWED = [
    ("import", ("numpy.fft", None, [], [], [])),
    ("import", ("numpy.fft._pocketfft_umath", NUMPY_DIR + "fft/_pocketfft_umath.cpython-311-x86_64-linux-gnu.so")),
    ("open", (NUMPY_DIR + "fft/__pycache__/__init__.cpython-311.pyc", "r", 524288)),
    ("open", (NUMPY_DIR + "lib/_function_base_impl.py", "r", 524288)),
    ("open", (judge.SUBMISSION, "rb", 524288)),
    ("os.listdir", (NUMPY_DIR + "fft",)),
    ("marshal.loads", (b"",)),
    ("exec", (None,)),
    ("compile", (b"def foo(shape): pass", "<unknown>")),
    ("object.__getattr__", (len, "__code__")),
    ("object.__getattr__", (len, "__defaults__")),
    ("object.__setattr__", (int, "__module__", "numpy.ma")),
    ("builtins.id", (1,)),
    ("import", ("math", None, [], [], [])),
]
REFUSED_EVENTS = [
    ("import", ("threading", None, [], [], [])),
    ("import", ("unittest", None, [], [], [])),
    ("import", (b"numpy", None)),
    ("open", ("/proc/1/cmdline", "r", 524288)),
    ("open", (NUMPY_DIR + "../../../proc/1/mem", "r", 524288)),
    ("open", (NUMPY_DIR + "x.py", "w", 577)),
    ("open", (NUMPY_DIR + "x.py", "r+", 2)),
    ("open", (NUMPY_DIR + "x.py", None, 0o1101)),
    ("open", (5, "wb", 1)),
    ("open", ("/box/submission.pyc", "r", 0)),
    ("os.listdir", ("/proc",)),
    ("os.system", (b"true",)),
    ("os.fork", ()),
    ("os.exec", ("/bin/sh", ["sh"], None)),
    ("os.posix_spawn", ("/bin/sh", ["sh"], None)),
    ("subprocess.Popen", ("sh", ["sh"], None, None)),
    ("os.kill", (1, 9)),
    ("signal.pthread_kill", (1, 9)),
    ("socket.__new__", (None, 2, 1, 0)),
    ("ctypes.dlopen", ("libc.so.6",)),
    ("ctypes.call_function", (0, ())),
    ("sys._getframe", (None,)),
    ("sys.settrace", (None,)),
    ("sys.setprofile", (None,)),
    ("sys.addaudithook", ()),
    ("gc.get_objects", (None,)),
    ("gc.get_referrers", ((),)),
    ("object.__getattr__", (None, "tb_frame")),
    ("object.__getattr__", (None, "gi_frame")),
    ("object.__setattr__", (len, "__code__", None)),
    ("mmap.__new__", (-1, 4096, 0, 0, 0)),
    ("resource.setrlimit", (9, (1, 1))),
]


def test_the_audit_hook_lets_numpy_work_and_refuses_the_rest() -> None:
    imports = frozenset(KERNEL_RULES["imports"])
    for event, args in ALLOWED:
        assert judge.audit_refusal(event, args, imports, READABLE) is None, (event, args)
    for event, args in REFUSED_EVENTS:
        why = judge.audit_refusal(event, args, imports, READABLE)
        assert why, (event, args)


def test_a_check_killed_or_stuck_is_the_submission_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The check runs in a child of the recorder: a child killed (the box's memory bound) or stuck
    says "unparseable", and the recorder goes on to report it."""
    source = tmp_path / "submission.py"
    source.write_text(WRONG)
    monkeypatch.setattr(judge, "SUBMISSION", str(source))
    assert judge._check_submission({"mode": "call"}) is None

    monkeypatch.setattr(judge, "source_problem", lambda *args: os.kill(os.getpid(), signal.SIGKILL))
    problem = judge._check_submission({"mode": "call"})
    assert problem == {"kind": "unparseable",
                       "error": "compiling it was killed by signal 9 (a bound of the box, such as its memory)"}

    monkeypatch.setattr(judge, "_CHECK_S", 0.3)
    monkeypatch.setattr(judge, "source_problem", lambda *args: time.sleep(30))
    started = time.monotonic()
    problem = judge._check_submission({"mode": "call"})
    assert problem == {"kind": "unparseable", "error": "compiling it took longer than 0.3 s"}
    assert time.monotonic() - started < 5
