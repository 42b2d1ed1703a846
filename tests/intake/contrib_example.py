"""The shipped example submission, word-count (``examples/word-count``), as the tests use it."""

from __future__ import annotations

from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "word-count"
"""The example the README documents: the tests use it as submitted."""
WORD_COUNT = (EXAMPLE / "env.py").read_text()
MANIFEST_TEXT = (EXAMPLE / "farm-env.toml").read_text()


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


def written(root: Path, source: str = WORD_COUNT) -> Path:
    """The submission with ``source`` as its module, written under ``root`` as a contributor's directory."""
    for rel, text in files(source).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
