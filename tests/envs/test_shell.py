"""The ``shell`` environment: generation, episodes over a persistent tree, verification, exploits, the CLI."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from farmd.envs import get, verify_safely
from farmd.envs.base import Attempt, Task, TaskError, VerifyContext
from farmd.envs.shell import (
    COMMON,
    FAMILIES,
    MAX_STEPS,
    OUTPUT_CHARS,
    TREE_BYTES,
    TREE_ENTRIES,
    Expect,
    Shell,
    ShellEpisode,
    build_puzzle,
    matches,
    normalize_answer,
)
from farmd.intake.exploits import for_kind
from farmd.sandbox import Sandbox
from farmd.verifier.secret import VerifierKey
from farmd.verifier.verdict import NO_ANSWER, SANDBOX_VIOLATION, SUSPECTED_HACK, Verdict
from tests.conftest import farmctl, sweep_seeds
from tests.envs.recall import failures, verify_references

ENV = Shell()
KEY = VerifierKey(b"shell-tests-key-0123456789abcdef")
LEVELS = range(1, ENV.max_difficulty + 1)
FAMILY_NAMES = [name for name, _ in FAMILIES]
_CONCURRENCY = 4
# A fork bomb alone may die of its failed forks before the bound is seen; the sleepers stay until it is.
BOMB = "f(){ f | f & }; f; i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); done; wait"


@asynccontextmanager
async def _context(scratch_dir: Path | None = None) -> AsyncIterator[VerifyContext]:
    async with Sandbox() as sandbox:
        yield VerifyContext(sandbox=sandbox, key=KEY, scratch_dir=scratch_dir)


async def _verify_all(ctx: VerifyContext, jobs: Iterable[tuple[Task, Attempt]]) -> list[Verdict]:
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def one(task: Task, attempt: Attempt) -> Verdict:
        async with limit:
            return await ENV.verify(task, attempt, ctx)

    return list(await asyncio.gather(*[one(t, a) for t, a in jobs]))


def _tasks(seeds: Iterable[int]) -> list[Task]:
    return [ENV.generate(seed, level) for level in LEVELS for seed in seeds]


# -- generation -----------------------------------------------------------------------------------------

def test_the_registry_knows_shell() -> None:
    env = get("shell")
    assert isinstance(env, Shell)
    assert (env.name, env.exploit_kind, env.max_difficulty) == ("shell", "shell", 5)


def test_generate_is_deterministic() -> None:
    first = [ENV.generate(seed, level) for level in LEVELS for seed in range(30)]
    trees = [dict(ENV.puzzle(t.seed, t.difficulty).files) for t in first]
    build_puzzle.cache_clear()
    assert [ENV.generate(t.seed, t.difficulty) for t in first] == first
    assert [dict(ENV.puzzle(t.seed, t.difficulty).files) for t in first] == trees
    assert len({tuple(sorted(tree.items())) for tree in trees}) == len(trees)


def _digest_in_subprocess(hash_seed: str) -> str:
    code = ("import hashlib\nfrom farmd.envs.shell import Shell\n"
            "h = hashlib.sha256()\n"
            "for d in range(1, 6):\n"
            "    for s in range(20):\n"
            "        p = Shell().puzzle(s, d)\n"
            "        h.update(repr((p.goal, p.answer, sorted(p.files.items()), sorted(p.expected.items()),"
            " p.actions)).encode())\n"
            "print(h.hexdigest())\n")
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                          timeout=60).stdout.strip()


def test_generation_does_not_depend_on_the_process() -> None:
    """Set and dict orders vary with PYTHONHASHSEED; a task must not."""
    assert _digest_in_subprocess("1") == _digest_in_subprocess("2")


def test_every_family_appears_at_every_level() -> None:
    for level in LEVELS:
        assert {ENV.puzzle(seed, level).family for seed in range(len(FAMILIES))} == set(FAMILY_NAMES)


def test_difficulty_out_of_range_is_refused() -> None:
    for level in (0, ENV.max_difficulty + 1):
        with pytest.raises(TaskError):
            ENV.generate(1, level)


def test_difficulty_grows_the_trees() -> None:
    def mean_size(level: int, family: str | None = None) -> tuple[float, float]:
        puzzles = [ENV.puzzle(s, level) for s in range(140)]
        puzzles = [p for p in puzzles if family is None or p.family == family]
        return (statistics.mean(len(p.files) for p in puzzles),
                statistics.mean(sum(len(c) for c in p.files.values()) for p in puzzles))

    overall = [mean_size(level) for level in LEVELS]
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(overall)), overall
    for family in FAMILY_NAMES:
        easy, hard = mean_size(1, family), mean_size(5, family)
        assert hard[1] > easy[1], (family, easy, hard)


def test_harder_levels_add_reasoning() -> None:
    """What each family asks for at level 5 that level 1 does not."""
    hard = {ENV.puzzle(s, 5).family: ENV.generate(s, 5).prompt for s in range(len(FAMILIES))}
    easy = {ENV.puzzle(s, 1).family: ENV.generate(s, 1).prompt for s in range(len(FAMILIES))}
    assert "section of `config/search.ini`" in hard["find-token"] and "config/" not in easy["find-token"]
    assert "service tag" in hard["count-lines"] and "service tag" not in easy["count-lines"]
    assert "negative" in hard["csv-sum"] and "exactly" not in easy["csv-sum"]
    assert "first line" in hard["move-files"] and ".jpeg" in easy["move-files"]
    assert "at least two different files" in hard["distinct-words"]
    assert "twice the value" in hard["edit-config"]
    assert "COUNT" in hard["log-fields"]


def test_tasks_are_action_tasks_that_say_how_to_finish() -> None:
    for task in _tasks(range(len(FAMILIES))):
        puzzle = ENV.puzzle(task.seed, task.difficulty)
        assert task.kind == "actions" and task.env == "shell" and COMMON in task.prompt
        assert task.answer_format is not None
        if puzzle.finish == "answer":
            assert "final answer" in task.answer_format and puzzle.answer and not puzzle.expected
        else:
            assert "final file state" in task.answer_format or "is checked" in task.answer_format
            assert puzzle.expected and not puzzle.answer
        assert task.metadata["family"] == puzzle.family and task.metadata["finish"] == puzzle.finish
        reference = ENV.reference(task)
        assert 1 <= len(reference.actions) <= 3, reference.actions
        assert json.dumps(task.public())  # a task travels as JSON


def test_checks_compare_what_they_say() -> None:
    number = Expect("number", b"12.50\n")
    assert matches(number, b"12.5") is None and matches(number, b" 12.50 \n") is None
    assert matches(number, b"1.25e1") and matches(number, b"12.51") and matches(number, b"12.5\n13")
    assert matches(number, b"\xff") == "it is not UTF-8 text"
    lines = Expect("lines", b"a\nb c\n")
    assert matches(lines, b"a  \nb   c") is None and matches(lines, b"\na\nb c\n\n") is None
    assert matches(lines, b"b c\na\n") and matches(lines, b"a\n\nb c\n") and matches(lines, b"a\nb c\nd\n")
    ini = Expect("ini", b"[s]\nport = 1\n# port = 2\n")
    assert matches(ini, b"[s]\nport=1   \n# port = 2") is None
    assert matches(ini, b"[s]\nport = 2\n# port = 2\n") and matches(ini, b"[s]\nport = 1\n")
    exact = Expect("bytes", b"x\n")
    assert matches(exact, b"x\n") is None and matches(exact, b"x")
    assert normalize_answer("  ./data/a.txt:3\n") == "data/a.txt:3"


# -- verification of references and wrong attempts --------------------------------------------------------

@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_references_pass_for_many_seeds_of_every_level() -> None:
    started = time.monotonic()
    results = await verify_references(ENV, sweep_seeds(200), LEVELS, concurrency=_CONCURRENCY)
    elapsed = time.monotonic() - started
    assert len(results) == len(sweep_seeds(200)) * len(LEVELS)
    assert not failures(results), failures(results)[:5]
    assert all(v.reward == 1.0 and v.status == "ok" and not v.flags for _, _, v in results)
    print(f"\n{len(results)} reference verifications in {elapsed:.1f} s")


@pytest.mark.sandbox
async def test_the_reference_commands_print_the_answer() -> None:
    """For answer tasks the final answer is what the reference's commands find in the tree, not a constant."""
    tasks = [t for t in _tasks(range(14)) if ENV.puzzle(t.seed, t.difficulty).finish == "answer"]
    async with _context() as ctx:
        for task in tasks:
            reference = ENV.reference(task)
            episode = await ENV.episode(task, ctx)
            try:
                for action in reference.actions:
                    observation = await episode.act(action)
            finally:
                await episode.close()
            assert observation.exit_code == 0
            assert observation.output.strip() == reference.final, (task.seed, task.difficulty)


def _wrong(task: Task) -> Attempt:
    """The reference, off by a little: one line more or less, a number off by one."""
    puzzle = ENV.puzzle(task.seed, task.difficulty)
    reference = ENV.reference(task)
    if puzzle.finish == "answer":
        head, _, tail = reference.final.rpartition(":")
        off = str(int(tail) + 1)
        return Attempt(final=f"{head}:{off}" if head else off, actions=reference.actions)
    first = sorted(puzzle.expected)[0]
    return Attempt(actions=[*reference.actions, f"sed -i 1d {first}"])


def _random(task: Task, rng: random.Random) -> Attempt:
    puzzle = ENV.puzzle(task.seed, task.difficulty)
    junk = "".join(rng.choice("abcdefghij0123456789 \n:/.") for _ in range(200))
    outputs = sorted(puzzle.expected) or ["answer.txt"]
    writes = [f"mkdir -p $(dirname {p}) && printf %s '{junk}' > {p}" for p in outputs[:3]]
    return Attempt(final=junk, actions=[f"echo {rng.randint(0, 10**6)}", *writes])


@pytest.mark.sandbox
async def test_known_bad_attempts_fail() -> None:
    rng = random.Random(7)
    jobs: list[tuple[str, Task, Attempt]] = []
    for task in _tasks(range(len(FAMILIES))):
        jobs += [
            ("empty", task, Attempt()),
            ("wrong", task, _wrong(task)),
            ("random", task, _random(task, rng)),
            ("constant", task, Attempt(final="42", actions=["echo 42 > answer.txt", "true"])),
            ("echo-prompt", task, Attempt(final=task.prompt, actions=["echo " + json.dumps(task.prompt[:500])])),
        ]
    async with _context() as ctx:
        verdicts = await _verify_all(ctx, [(t, a) for _, t, a in jobs])
    for (name, task, _), verdict in zip(jobs, verdicts, strict=True):
        assert verdict.status == "ok" and not verdict.passed and verdict.reward == 0, (name, task.seed, verdict)
        assert verdict.reasons, name
        if name == "empty":
            assert NO_ANSWER in verdict.flags


@pytest.mark.sandbox
@pytest.mark.slow
async def test_every_shell_exploit_scores_zero() -> None:
    exploits = for_kind("shell")
    assert len(exploits) >= 15
    # The family rotation puts all seven in these ten; one task of each family is what an exploit meets.
    tasks = list({ENV.puzzle(t.seed, t.difficulty).family: t for t in reversed(_tasks(range(2)))}.values())
    assert sorted(ENV.puzzle(t.seed, t.difficulty).family for t in tasks) == sorted(FAMILY_NAMES)
    jobs = [(e.name, t, e.make(t)) for e in exploits for t in tasks]
    async with _context() as ctx:
        verdicts = await _verify_all(ctx, [(t, a) for _, t, a in jobs])
    rewarded = [(n, t.seed, t.difficulty, v.status, v.reasons) for (n, t, _), v in zip(jobs, verdicts, strict=True)
                if v.reward != 0 or v.passed or v.status != "ok"]
    assert not rewarded, rewarded[:5]
    by_name = {}
    for (name, task, _), verdict in zip(jobs, verdicts, strict=True):
        if ENV.puzzle(task.seed, task.difficulty).finish == "files":
            by_name.setdefault(name, []).append(verdict)
    # A link or special file where a regular file belongs is called out, not just scored 0.
    for name in ("symlink-to-host", "symlink-to-right-copy", "fifo-outputs"):
        assert all(SUSPECTED_HACK in v.flags for v in by_name[name]), name
    assert all(SANDBOX_VIOLATION in v.flags for v in by_name["fill-disk"] + by_name["fork-bomb"])


@pytest.mark.sandbox
async def test_more_steps_than_allowed_fail() -> None:
    task = ENV.generate(2, 1)
    reference = ENV.reference(task)
    async with _context() as ctx:
        ok = await ENV.verify(task, Attempt(final=reference.final, actions=["true"] * (MAX_STEPS - 1)
                                           + reference.actions[-1:]), ctx)
        too_many = await ENV.verify(task, Attempt(final=reference.final, actions=["true"] * MAX_STEPS
                                                 + reference.actions), ctx)
    assert ok.passed
    assert not too_many.passed and too_many.status == "ok" and str(MAX_STEPS) in too_many.reasons[0]


@pytest.mark.sandbox
async def test_a_broken_sandbox_is_an_error_not_a_score() -> None:
    sandbox = Sandbox()
    await sandbox.start()
    await sandbox.close()
    task = ENV.generate(3, 2)
    verdict = await ENV.verify(task, ENV.reference(task), VerifyContext(sandbox=sandbox, key=KEY))
    assert verdict.status == "error" and not verdict.passed and verdict.reward == 0


# -- episodes -----------------------------------------------------------------------------------------------

@pytest.mark.sandbox
async def test_state_persists_only_through_regular_files(tmp_path: Path) -> None:
    task = ENV.generate(0, 1)
    async with _context(scratch_dir=tmp_path) as ctx:
        episode = await ENV.episode(task, ctx)
        roots = await asyncio.to_thread(lambda: list(tmp_path.iterdir()))
        try:
            first = await episode.act(
                "echo kept > note.txt; mkdir -p sub/dir && echo deep > sub/dir/f; mkdir empty; ln -s note.txt link; "
                "ln -s /etc/passwd host; mkfifo pipe; echo x > a; ln a b; chmod +x note.txt; export X=1; "
                "echo t > /tmp/t; cd sub; sleep 30 & echo started")
            second = await episode.act(
                "pwd; cat note.txt sub/dir/f; echo \"X=$X\"; ls /tmp; test -d empty && echo empty-dir; "
                "test -x note.txt && echo executable || echo not-executable; ls link host pipe a b 2>&1; "
                "ps -e -o comm= | grep -c sleep")
        finally:
            await episode.close()
    assert first.exit_code == 0 and "started" in first.output
    for note in ("link (symbolic link)", "host (symbolic link)", "pipe (not a regular file)"):
        assert note in first.output
    assert "(hard link)" not in first.output  # links among the box's own files come out as copies
    lines = second.output.splitlines()
    assert lines[:4] == ["/box", "kept", "deep", "X="]
    assert "empty-dir" in lines and "executable" in lines and lines[-1] == "0"
    assert sum("No such file" in line for line in lines) == 3
    assert len(roots) == 1 and not await asyncio.to_thread(roots[0].exists)  # it lived under scratch_dir


@pytest.mark.sandbox
async def test_observations_are_truncated() -> None:
    async with _context() as ctx:
        episode = await ENV.episode(ENV.generate(0, 1), ctx)
        try:
            long = await episode.act("seq 1 30000; echo tail-of-stderr >&2")
            short = await episode.act("echo hello")
        finally:
            await episode.close()
    assert len(long.output) <= OUTPUT_CHARS + 100
    assert long.output.startswith("1\n2\n3\n") and long.output.rstrip().endswith("tail-of-stderr")
    assert "characters cut" in long.output and long.exit_code == 0
    assert short.output == "hello\n"


@pytest.mark.sandbox
async def test_a_step_past_a_bound_is_reported_and_the_episode_goes_on() -> None:
    async with _context() as ctx:
        episode = await ENV.episode(ENV.generate(0, 1), ctx)
        try:
            await episode.act("echo before > keep.txt")
            disk = await episode.act("cat /dev/zero > fill")
            output = await episode.act("yes")
            pids = await episode.act(BOMB)
            after = await episode.act("cat keep.txt; ls")
        finally:
            await episode.close()
    assert "bound on disk" in disk.output and "fill (the tree would exceed" in disk.output
    assert "bound on output" in output.output and output.exit_code is None
    assert "bound on pids" in pids.output
    assert after.exit_code == 0 and after.output.startswith("before\n") and "fill" not in after.output
    assert [v.split(": ")[1] for v in episode.violations] == ["disk", "output", "pids"]


@pytest.mark.sandbox
async def test_bad_commands_are_observations_too() -> None:
    async with _context() as ctx:
        episode = await ENV.episode(ENV.generate(0, 1), ctx)
        try:
            nul = await episode.act("echo a\0b")
            huge = await episode.act("echo " + "x" * 100_000)
            odd = await episode.act("echo \udcff")
            fine = await episode.act("echo ok")
        finally:
            await episode.close()
    assert nul.output.startswith("[not run: ") and nul.exit_code is None
    assert "longer than" in huge.output and "UTF-8" in odd.output
    assert fine.output == "ok\n" and episode.steps == 4


@pytest.mark.sandbox
async def test_the_step_budget_ends_an_episode() -> None:
    async with _context() as ctx:
        episode = await ShellEpisode.start(ctx.sandbox, {"a.txt": b"a\n"}, max_steps=2)
        try:
            one = await episode.act("true")
            two = await episode.act("cat a.txt")
            three = await episode.act("echo never")
        finally:
            await episode.close()
    assert not one.done and two.done and two.output == "a\n"
    assert three.done and "not run" in three.output and episode.steps == 2


@pytest.mark.sandbox
async def test_a_hostile_tree_is_cut_to_its_bounds() -> None:
    deep = ("python3 -c 'import os\nfor i in range(70):\n    os.mkdir(\"d\" * 200)\n    os.chdir(\"d\" * 200)\n"
            "os.chdir(\"/box\")\nos.mkdir(\"many\")\nfor i in range(1500):\n"
            "    open(\"many/%04d\" % i, \"w\").write(\"x\")\nopen(b\"odd\\xff\\nname\", \"w\").write(\"odd\")\n'; "
            "head -c 9000000 /dev/zero > zz-big")
    async with _context() as ctx:
        episode = await ShellEpisode.start(ctx.sandbox, {"keep.txt": b"kept\n"})
        try:
            made = await episode.act(deep)
            after = await episode.act("cat keep.txt; ls many | wc -l; ls | grep -c odd; find . -print0 | tr -dc '\\0' | wc -c")
            tree_files = [p for p in episode.tree.rglob("*")]
        finally:
            await episode.close()
    assert made.exit_code == 0, made.output
    assert "deeper than" in made.output and "more than" in made.output and "would exceed" in made.output
    assert after.exit_code == 0
    kept, many, odd, total = after.output.split()
    assert kept == "kept" and int(many) < 1500 and odd == "1" and int(total) <= TREE_ENTRIES + 1
    assert sum(p.stat().st_size for p in tree_files if p.is_file()) <= TREE_BYTES


# -- the CLI ------------------------------------------------------------------------------------------------

@pytest.mark.sandbox
def test_farmctl_verifies_a_reference_and_fails_a_wrong_submission(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ok = json.loads(farmctl("verify", "--env", "shell", "--seed", "1", "--difficulty", "2", "--reference",
                            "--data", str(data)).stdout)
    assert ok["passed"] is True and ok["reward"] == 1.0 and ok["status"] == "ok"

    task = ENV.generate(1, 2)
    lines = tmp_path / "commands.txt"
    lines.write_text("\n".join(ENV.reference(task).actions) + "\n")
    by_line = json.loads(farmctl("verify", "--env", "shell", "--seed", "1", "--difficulty", "2", "--submission",
                                 str(lines), "--data", str(data)).stdout)
    assert by_line["passed"] is True

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"actions": ["ls", "echo zero > words.txt"], "final": "0"}))
    bad = json.loads(farmctl("verify", "--env", "shell", "--seed", "1", "--difficulty", "2", "--submission",
                             str(wrong), "--data", str(data)).stdout)
    assert bad["passed"] is False and bad["reward"] == 0 and bad["status"] == "ok" and bad["reasons"]


def test_farmctl_shows_a_shell_task() -> None:
    shown = json.loads(farmctl("task", "show", "--env", "shell", "--seed", "4", "--difficulty", "3").stdout)
    task = ENV.generate(4, 3)
    assert shown["prompt"] == task.prompt and shown["kind"] == "actions"
    assert shown["answer_format"] == task.answer_format and shown["metadata"]["family"] == "move-files"


# -- the host reads what the agent left, whatever it is --------------------------------------------------

# The pattern ini files were once read with: it backtracked quadratically on a long line of blanks.
_OLD_INI_LINE = re.compile(r"^\s*([^#;=\s][^=]*?)\s*=\s*(.*?)\s*$")


@pytest.mark.clocked
def test_ini_files_are_read_as_before_in_linear_time() -> None:
    from farmd.envs.shell.checks import _as_ini

    def old(text: str) -> list[str]:
        out = []
        for line in text.split("\n"):
            m = _OLD_INI_LINE.match(line.rstrip())
            out.append(f"{m.group(1)} = {m.group(2)}" if m else line.rstrip())
        while out and not out[-1]:
            out.pop()
        while out and not out[0]:
            out.pop(0)
        return out

    rng = random.Random(3)
    alphabet = [" ", "\t", "=", "#", ";", "a", "b", "[", "]", "\x1c", "\u3000", "\x85", "\r", "\n", "k_1", " = "]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        assert _as_ini(text) == old(text), repr(text)
    ini = Expect("ini", b"[s]\nport = 1\n")
    for hostile in (b"[s]\na" + b" " * 50_000 + b"b", b"[s]\na=b" + b" " * 50_000 + b"c", b" " * 50_000 + b"=" * 50_000):
        started = time.perf_counter()
        assert matches(ini, hostile) is not None
        assert time.perf_counter() - started < 0.5
    number = Expect("number", b"12\n")
    assert matches(number, b"1" * 5_000_000) == "it does not hold a plain decimal number"


@pytest.mark.sandbox
async def test_a_lone_surrogate_never_makes_verify_raise_and_is_flagged() -> None:
    from farmd.verifier.verdict import INVALID_TEXT

    tasks = {}
    for seed in range(20):
        task = ENV.generate(seed, 1)
        tasks.setdefault(ENV.puzzle(seed, 1).finish, task)
    answer, files = tasks["answer"], tasks["files"]
    ref = ENV.reference(answer)
    attempts = [
        (answer, Attempt(final=ref.final + "\ud800", actions=ref.actions), False),
        (answer, Attempt(final="\udfff", actions=["echo \ud800"]), False),
        (answer, Attempt(final="1" + "0" * 4000, actions=["true"]), False),
        (files, Attempt(final="\ud800 done", actions=ENV.reference(files).actions), True),
        (files, Attempt(final="", actions=[*ENV.reference(files).actions, "echo '\udc80' > /dev/null"]), True),
    ]
    async with _context() as ctx:
        verdicts = list(await asyncio.gather(*[verify_safely(ENV, t, a, ctx) for t, a, _ in attempts]))
        direct = await _verify_all(ctx, [(t, a) for t, a, _ in attempts])  # no flag, the same judgement
    assert [v.passed for v in direct] == [v.passed for v in verdicts]
    for (_, attempt, passes), verdict in zip(attempts, verdicts, strict=True):
        assert verdict.status == "ok" and verdict.passed is passes, (attempt, verdict)
        if not attempt.final.isascii() or not all(a.isascii() for a in attempt.actions):
            assert INVALID_TEXT in verdict.flags, (attempt, verdict)
        json.dumps(verdict.to_json(), ensure_ascii=False).encode("utf-8")
