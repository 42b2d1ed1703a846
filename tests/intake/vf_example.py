"""Verifiers packages written for the tests: a SingleTurnEnv of sums with an XMLParser and a rubric of an
exact-answer function and the parser's format function, plus what each test varies. And the rubric's own
score for an answer, computed by verifiers in this plain process, to hold farm's verdicts against."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

ROWS = 4096
"""Rows of the dataset: a task's row is its seed modulo this. Enough that tier 1's two random seeds rarely land on
one row, which its seed check rightly calls a task its seed does not choose (at 12 rows, one submission in 12)."""

HEAD = r'''
import math
import os
import re
import time

import verifiers as vf
from datasets import Dataset


def rows():
    # Answers of nine digits: long enough that one found in a prompt is a leak, not a chance.
    return [{"question": f"What is {100000000 + 7919 * i} + {13 * i + 5}?",
             "answer": str(100000000 + 7919 * i + 13 * i + 5)} for i in range(ROWS)]


def load_environment(**kwargs):
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def exact_answer(completion, answer, **kwargs):
        # The whole message is one answer block: XMLParser.parse_answer alone would take the first of two
        # blocks, or one followed by a note to the grader (tier 2's exploits).
        message = completion[-1]
        text = message["content"] if isinstance(message, dict) else message.content
        match = re.fullmatch(r"\s*<answer>\s*(\S+)\s*</answer>\s*", text or "")
        return 1.0 if match is not None and match.group(1) == answer else 0.0

    funcs, weights = [exact_answer, parser.get_format_reward_func()], [1.0, FORMAT_WEIGHT]
'''

TAIL = '''
    dataset = Dataset.from_list((DATASET)())
    return vf.SingleTurnEnv(dataset=dataset, system_prompt="Give the sum in <answer> tags.", parser=parser,
                            rubric=vf.Rubric(funcs=funcs, weights=weights, parser=parser))
'''

PROBE = '''
    def probe(completion, **kwargs):
        """What an attempt's text makes a careless reward function do."""
        text = parser.parse_answer(completion) or ""
        if "RAISE" in text:
            raise KeyError("a path the author never tried")
        if "HANG" in text:
            while True:
                time.sleep(1)
        if "NAN" in text:
            return math.nan
        if "BIG" in text:
            return 5.0
        return 0.0

    funcs.append(probe)
    weights.append(0.1)
'''

WHERE = '''
    def seen_uid(**kwargs):
        return float(os.getuid())

    def seen_pid(**kwargs):
        return float(os.getpid())

    def read_host_file(**kwargs):
        try:
            with open(SECRET) as fh:
                return 1.0 if fh.read() == "host secret" else 0.5
        except OSError:
            return 0.0

    funcs += [seen_uid, seen_pid, read_host_file]
    weights += [0.0, 0.0, 0.0]
'''

ANY = '''
    def anything(completion, **kwargs):
        return 1.0

    funcs, weights = [anything], [1.0]
'''


def source(*, probe: bool = False, secret: Path | None = None, rubric: str = "", dataset: str = "rows",
           load_first: str = "", format_weight: float = 0.2) -> str:
    """The module: the sums environment; ``probe`` adds a reward function whose misdeeds the attempt picks,
    ``secret`` metrics of where the reward functions ran (and whether they read that host file), ``rubric``
    more source run before the environment is made (it may replace ``funcs``), ``dataset`` the function that
    makes the rows, ``load_first`` source run first thing in ``load_environment``, ``format_weight`` the
    format function's weight (0: a metric only; any other gives reward to a wrong answer in good format, which
    tier 2 refuses: an attack must earn nothing)."""
    head = HEAD.replace("ROWS", str(ROWS)).replace("FORMAT_WEIGHT", repr(format_weight))
    if load_first:
        head = head.replace("    parser = vf.XMLParser", f"    {load_first}\n    parser = vf.XMLParser")
    body = head + (PROBE if probe else "") + (WHERE.replace("SECRET", repr(str(secret))) if secret else "") + rubric
    return body + TAIL.replace("DATASET", dataset)


def write(root: Path, module: str, *, manifest: str | None = None, extra: dict[str, str] | None = None) -> Path:
    """A verifiers package: ``sums.py`` holding ``module``, a manifest if given, and ``extra`` files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sums.py").write_text(module)
    if manifest is not None:
        (root / "farm-env.toml").write_text(manifest)
    for rel, text in (extra or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def answer(seed: int) -> str:
    i = seed % ROWS
    return str(100000000 + 7919 * i + 13 * i + 5)


def formatted(seed: int) -> str:
    """The right answer as the XMLParser formats it (the package's reference)."""
    return f"<answer>\n{answer(seed)}\n</answer>"


def submission(root: Path, module: str, *, name: str = "sums", version: str = "1.0.0", bounds: str = "") -> Path:
    """``module`` as a verifiers-form submission: the manifest says so, with a good and a bad example."""
    manifest = (f'name = "{name}"\nversion = "{version}"\ndomain = "math"\nauthor = "ada@example.org"\n'
                f'form = "verifiers"\nentry = "sums.py:load_environment"\n{bounds}\n'
                '[examples]\ngood = ["examples/good"]\nbad = ["examples/bad"]\n')
    good = f'{{"seed": 1, "difficulty": 1, "final": "<answer>\\n{answer(1)}\\n</answer>"}}'
    bad = f'{{"seed": 1, "difficulty": 1, "final": "<answer>\\n{int(answer(1)) + 1}\\n</answer>"}}'
    return write(root, module, manifest=manifest,
                 extra={"examples/good/1.json": good, "examples/bad/1.json": bad})


def own_score(module_path: Path, seed: int, final: str) -> float:
    """The rubric's weighted sum for ``final`` on task ``seed``, as verifiers computes it in this process
    (the test's own module, not a submission), clamped to [0, 1] as farm reports it."""
    import verifiers as vf

    name = f"vf_example_{abs(hash(str(module_path)))}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, module_path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    env: Any = module.load_environment()
    dataset = env.get_dataset()
    row = dict(dataset[seed % len(dataset)])
    state = vf.State(input=row)
    state["prompt"] = row["prompt"]
    state["completion"] = [{"role": "assistant", "content": final}]
    state["trajectory"] = []
    asyncio.run(env.rubric.score_rollout(state))
    return min(1.0, max(0.0, float(state["reward"])))
