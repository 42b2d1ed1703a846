"""running-max: write `running_max(xs)`, the largest value seen so far at each position.

A code task's verifier runs the submission, so it must never trust anything the submission can touch:

- the submission runs in a child process (`subprocess`), given only the hidden inputs. The expected
  outputs stay in this process, where the submission cannot walk frames or scan memory for them;
- the child sends back plain JSON values, compared here: an object with a lying `__eq__` becomes its
  `repr`, a string, and is simply wrong;
- a crash, a timeout, an exit before the last line, or a last line that is not JSON is a failure:
  nothing the submission prints can be read as a verdict.
"""

import json
import subprocess
import sys

DRIVER = r"""
import json, sys
request = json.loads(sys.stdin.read())
scope = {}
exec(compile(request["code"], "submission.py", "exec"), scope)
fn = scope["running_max"]
outputs = []
for xs in request["cases"]:
    try:
        outputs.append(fn(list(xs)))
    except Exception:
        outputs.append(None)
sys.stdout.write("\n" + json.dumps(outputs, default=repr) + "\n")
"""
TIMEOUT_S = 1


def running_max(xs):
    out, best = [], None
    for x in xs:
        best = x if best is None or x > best else best
        out.append(best)
    return out


class RunningMax:
    def _case(self, rng, difficulty, shortest=0):
        return [rng.randint(-10 ** difficulty, 10 ** difficulty)
                for _ in range(rng.randint(shortest, shortest + 4 * difficulty))]

    def generate(self, seed, difficulty, rng, hidden_rng):
        # Shown examples of two values or more: two empty lists would make two seeds the same task (1 in 625 at
        # level 1), which intake rejects as a generator that ignores its seed. The edge cases are hidden ones.
        shown = [self._case(rng, difficulty, shortest=2) for _ in range(2)]
        hidden = [self._case(hidden_rng, difficulty) for _ in range(6)] + [[], [5], [3, 3, 1]]
        return {"prompt": "Write a Python function `running_max(xs)` that returns a list whose i-th element is the "
                          f"largest of xs[0..i]. Values range up to {10 ** difficulty} in size.",
                "public": {"entry_point": "running_max",
                           "examples": [{"input": [xs], "output": running_max(xs)} for xs in shown]},
                "hidden": {"cases": hidden}}

    def reference(self, task):
        return ("def running_max(xs):\n    out, best = [], None\n    for x in xs:\n"
                "        best = x if best is None or x > best else best\n        out.append(best)\n    return out\n")

    def verify(self, task, final):
        cases = task["hidden"]["cases"]
        try:
            child = subprocess.run([sys.executable, "-I", "-S", "-c", DRIVER], capture_output=True, timeout=TIMEOUT_S,
                                   input=json.dumps({"code": final, "cases": cases}).encode())
        except subprocess.TimeoutExpired:
            return {"reward": 0.0, "passed": False, "reasons": [f"timed out after {TIMEOUT_S} s"]}
        lines = child.stdout.decode("utf-8", "replace").strip().splitlines()
        try:
            outputs = json.loads(lines[-1]) if lines else None
        except ValueError:
            outputs = None
        expected = [running_max(xs) for xs in cases]
        ok = outputs == expected
        return {"reward": 1.0 if ok else 0.0, "passed": ok,
                "reasons": ["every hidden case right" if ok else "a hidden case was wrong, or no answer came back"]}
