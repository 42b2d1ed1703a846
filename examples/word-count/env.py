"""word-count: how many times does a word occur in a sentence? A complete contributed environment.

farm runs each method in a fresh box of its own. `rng` is seeded from the environment's name, the seed
and the level, so anyone can regenerate a task (and write example answers); `hidden_rng` is seeded from
the farm's key and nobody outside the box can predict it (use it for hidden test inputs). 'hidden' never
leaves the box: `verify` gets it back by farm generating the task again.
"""

WORDS = ["apple", "river", "stone", "cloud", "ember", "maple", "quartz", "tiger"]


class WordCount:
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
