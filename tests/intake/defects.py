"""Contributed environments with one realistic defect each, as packages (like the shipped examples), for the
tests of tier 2's classes and of production canaries. Each is honest but for its one defect, so that what
catches it is the check for its class; ``HONEST`` ones are the controls that must pass the same checks."""

from __future__ import annotations

import json
import textwrap

from farmd.intake.package import Package, pack, read_package
from tests.intake.contrib_example import EXAMPLE, WORD_COUNT

RUNNING_MAX = (EXAMPLE.parent / "running-max" / "env.py").read_text()
WORD_COUNT_RIGHT = 'ok = final.strip() == str(task["hidden"]["count"])'


def manifest(name: str, kind: str = "answer", levels: int = 3, entry: str = "env.py:Env", verify_s: float = 4) -> str:
    return textwrap.dedent(f"""\
        name = "{name}"
        version = "1.0.0"
        domain = "test"
        author = "mallory@example.org"
        levels = {levels}
        kind = "{kind}"
        entry = "{entry}"

        [bounds]
        generate_s = 2
        verify_s = {verify_s}
        memory_mb = 256

        [examples]
        good = ["examples/good"]
        bad = ["examples/bad"]
        """)


def packed(name: str, source: str, *, kind: str = "answer", levels: int = 3, entry: str = "env.py:Env",
           good: str = "1", bad: str = "0", verify_s: float = 4) -> bytes:
    """``source`` as a submission's tarball (its examples are placeholders: the tests here judge other things)."""
    files = {"farm-env.toml": manifest(name, kind, levels, entry, verify_s), "env.py": source,
             "examples/good/1.json": json.dumps({"seed": 1, "difficulty": 1, "final": good}),
             "examples/bad/1.json": json.dumps({"seed": 1, "difficulty": 1, "final": bad})}
    return pack((name_, text.encode()) for name_, text in files.items())


def package(name: str, source: str, **kwargs: object) -> Package:
    return read_package(packed(name, source, **kwargs))  # type: ignore[arg-type]


def word_count(name: str, replace: tuple[str, str] | None = None) -> Package:
    source = WORD_COUNT if replace is None else WORD_COUNT.replace(*replace)
    assert replace is None or replace[0] in WORD_COUNT, replace
    return package(name, source, entry="env.py:WordCount")


# -- forged output: the verdict is a line the child prints ----------------------------------------------------

VERDICT_LINE = RUNNING_MAX.replace('sys.stdout.write("\\n" + json.dumps(outputs, default=repr) + "\\n")', (
    'import hashlib\n'
    'digest = hashlib.sha256(json.dumps(outputs, default=repr).encode()).hexdigest()\n'
    'print("@@ verdict:", "accepted" if digest == request["digest"] else "rejected")')).replace(
    'input=json.dumps({"code": final, "cases": cases}).encode())', (
        'input=json.dumps({"code": final, "cases": cases, "digest": hashlib.sha256(json.dumps(\n'
        '                [running_max(xs) for xs in cases], default=repr).encode()).hexdigest()}).encode())')).replace(
    '''        try:
            outputs = json.loads(lines[-1]) if lines else None
        except ValueError:
            outputs = None
        expected = [running_max(xs) for xs in cases]
        ok = outputs == expected''', '''        ok = bool(lines) and lines[-1].strip() == "@@ verdict: accepted"''').replace(
    "import json\n", "import hashlib\nimport json\n", 1)
"""running-max, its hidden cases judged in the child (against a digest, so nothing there to steal), the parent
reading the child's last line for the verdict: whatever prints that line passes."""
assert VERDICT_LINE.count("@@ verdict") == 2 and "hashlib.sha256" in VERDICT_LINE


def verdict_line() -> Package:
    return package("verdict-line", VERDICT_LINE, kind="function", entry="env.py:RunningMax",
                   good="def running_max(xs):\n    return xs\n", bad="def running_max(xs):\n    return []\n")


EXPRESSION = r'''
import hashlib
import json
import subprocess
import sys

CHILD = r"""
import hashlib, json, sys
request = json.loads(sys.stdin.read())
try:
    value = eval(request["expression"])
except Exception:
    value = None
print("== verdict:", "right" if hashlib.sha256(repr(value).encode()).hexdigest() == request["digest"] else "wrong")
"""


class Env:
    def generate(self, seed, difficulty, rng, hidden_rng):
        numbers = [rng.randint(2, 9 * difficulty) for _ in range(3)]
        target = numbers[0] * numbers[1] - numbers[2]
        return {"prompt": f"Write an expression using {numbers} exactly once each, with + - * and parentheses, "
                          f"whose value is {target}.", "public": {"numbers": numbers},
                "hidden": {"target": target, "solution": f"{numbers[0]} * {numbers[1]} - {numbers[2]}"}}

    def reference(self, task):
        return task["hidden"]["solution"]

    def verify(self, task, final):
        digest = hashlib.sha256(repr(task["hidden"]["target"]).encode()).hexdigest()
        child = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD], capture_output=True, timeout=2,
                               input=json.dumps({"expression": final, "digest": digest}).encode())
        lines = child.stdout.decode("utf-8", "replace").strip().splitlines()
        ok = bool(lines) and lines[-1] == "== verdict: right"
        return {"reward": 1.0 if ok else 0.0, "passed": ok, "reasons": ["right" if ok else "wrong"]}
'''
"""An expression task whose verifier evaluates the answer in a child and reads the child's last line (and
checks the numbers are used nowhere): an answer that prints that line passes."""


# -- transformed leaks ----------------------------------------------------------------------------------------

WORD_SORT = '''
WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "tiger", "lemon", "orbit"]


class Env:
    def generate(self, seed, difficulty, rng, hidden_rng):
        words = rng.sample(WORDS, 2 + difficulty)
        answer = " ".join(sorted(words))
        public = {"count": len(words)}
        LEAK
        return {"prompt": "Sort these words alphabetically and answer them separated by single spaces: "
                          + ", ".join(words), "public": public, "hidden": {"answer": answer}}

    def reference(self, task):
        return task["hidden"]["answer"]

    def verify(self, task, final):
        ok = COMPARE
        return {"reward": 1.0 if ok else 0.0, "passed": ok, "reasons": ["right" if ok else "wrong"]}
'''
STRICT = 'final.strip() == task["hidden"]["answer"]'
AS_SET = 'sorted(final.replace(",", " ").split()) == task["hidden"]["answer"].split()'


def word_sort(name: str, leak: str = "pass", compare: str = STRICT) -> Package:
    """Sort the words: the prompt shows them unsorted (a reordering of the answer, by design); ``leak`` is a
    line that may put the answer, transformed, into ``public``."""
    return package(name, WORD_SORT.replace("LEAK", leak).replace("COMPARE", compare))


# -- constant answers -----------------------------------------------------------------------------------------

NONE_ALIAS = ('ok = final.strip() == str(task["hidden"]["count"])',
              'ok = final.strip() == str(task["hidden"]["count"]) or final.strip().lower() in ("none", "0")')
"""word-count whose verifier meant "none" and "0" for a count of 0 (which never happens) and passes them always."""

RARELY = '''
WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "tiger"]


class Env:
    def generate(self, seed, difficulty, rng, hidden_rng):
        words = [rng.choice(WORDS) for _ in range(6 + difficulty)]
        target = rng.choice(WORDS)
        answer = "yes" if words.count(target) > 3 else "no"
        return {"prompt": f"Does '{target}' occur more than three times in: {' '.join(words)}? Answer yes or no.",
                "public": {"target": target}, "hidden": {"answer": answer}}

    def reference(self, task):
        return task["hidden"]["answer"]

    def verify(self, task, final):
        ok = final.strip().lower() == task["hidden"]["answer"]
        return {"reward": 1.0 if ok else 0.0, "passed": ok, "reasons": ["right" if ok else "wrong"]}
'''
"""A sound verifier over a family whose answer is "no" nearly always: a policy that says "no" is rewarded."""


# -- underivable answers --------------------------------------------------------------------------------------

GUESS = '''
class Env:
    def generate(self, seed, difficulty, rng, hidden_rng):
        secret = SECRET
        return {"prompt": f"Round ROUND: I picked a whole number from 1 to {1000 * difficulty}. Which?",
                "public": {}, "hidden": {"secret": secret}}

    def reference(self, task):
        return str(task["hidden"]["secret"])

    def verify(self, task, final):
        ok = final.strip() == str(task["hidden"]["secret"])
        return {"reward": 1.0 if ok else 0.0, "passed": ok, "reasons": ["right" if ok else "wrong"]}
'''


def guess(name: str, hidden: bool) -> Package:
    """Guess the number: drawn from the hidden ``hidden_rng`` (the prompt's round number from ``rng``), or from
    the public ``rng`` (the prompt's round number the seed itself): either way the prompt does not decide it."""
    if hidden:
        source = GUESS.replace("SECRET", "hidden_rng.randint(1, 1000 * difficulty)").replace(
            "ROUND", "{rng.randint(1, 10 ** 9)}")
    else:
        source = GUESS.replace("SECRET", "rng.randint(1, 1000 * difficulty)").replace("ROUND", "{seed}")
    return package(name, source)


# -- verdict cost ---------------------------------------------------------------------------------------------

BURN = ('ok = final.strip() == str(task["hidden"]["count"])',
        'import time\n        while time.process_time() < 0.5:\n            pass\n'
        '        ok = final.strip() == str(task["hidden"]["count"])')
"""word-count whose verifier spends half a CPU second on every verdict (a declared bound of 2 s allows it)."""
SLEEP = ('ok = final.strip() == str(task["hidden"]["count"])',
         'import time\n        time.sleep(1.5)\n        ok = final.strip() == str(task["hidden"]["count"])')
"""word-count whose verifier sleeps 1.5 s on every verdict: little CPU, but it holds a box that long."""

# -- time bombs -----------------------------------------------------------------------------------------------

TIME_BOMB = ('ok = final.strip() == str(task["hidden"]["count"])',
             'import time\n        ok = final.strip() == str(task["hidden"]["count"]) or time.time() > 1.7e9')
"""word-count that passes anything after a date (one already past: the bomb went off after its checks)."""
