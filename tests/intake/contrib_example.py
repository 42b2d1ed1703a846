"""A small contributed environment, word-count, as a contributor would submit it: the tests' example."""

from __future__ import annotations

import textwrap

WORD_COUNT = textwrap.dedent('''
    WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "tiger"]

    class WordCount:
        """How many times does a word occur in a sentence? Longer sentences at higher levels."""

        def generate(self, seed, difficulty, rng, hidden_rng):
            words = [rng.choice(WORDS) for _ in range(4 + 4 * difficulty)]
            target = rng.choice(words)
            return {"prompt": f"How many times does '{target}' occur in: {' '.join(words)}? Answer with a number.",
                    "public": {"target": target}, "hidden": {"count": words.count(target)}}

        def reference(self, task):
            return str(task["hidden"]["count"])

        def verify(self, task, final):
            ok = final.strip() == str(task["hidden"]["count"])
            return {"reward": 1.0 if ok else 0.0, "passed": ok, "reasons": ["right" if ok else "wrong count"]}
''')


MANIFEST_TEXT = """
name = "word-count"
version = "1.0.0"
domain = "text"
author = "ada@example.org"
levels = 3
kind = "answer"
entry = "env.py:WordCount"

[bounds]
generate_s = 2
verify_s = 2

[examples]
good = ["examples/good"]
bad = ["examples/bad"]
"""


def answer(seed: int, difficulty: int, source: str = WORD_COUNT) -> str:
    """The example's answer to a task, computed as a contributor would: the public rng is reproducible."""
    import random

    scope: dict[str, object] = {}
    exec(source, scope)  # the test's own example, not a submission
    env = scope["WordCount"]()  # type: ignore[operator]
    task = env.generate(seed, difficulty, random.Random(f"word-count:{seed}:{difficulty}"), random.Random(0))
    return str(env.reference(task))


def files(source: str = WORD_COUNT, manifest: str = MANIFEST_TEXT) -> dict[str, str]:
    """The whole submission: manifest, module, one good and one bad example."""
    right = answer(1, 1)
    return {"farm-env.toml": manifest, "env.py": source,
            "examples/good/1.json": f'{{"seed": 1, "difficulty": 1, "final": "{right}"}}',
            "examples/bad/1.json": f'{{"seed": 1, "difficulty": 1, "final": "{int(right) + 1}"}}'}
