"""The intake funnel takes a package in verifiers' form (its manifest says ``form = "verifiers"``): tiers 1 and
2 check it as they check farm's own format, every call in boxes that share verifiers' import (one child per
call), and they catch a verifiers package that rewards anything, leaks its answers into the prompt, or poses
another task each time it loads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from farmd.errors import ContributedError, PackageError
from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.contributed_checks import tier1_report
from farmd.intake.package import read_package
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.conftest import RunningFarm
from tests.intake import vf_example
from tests.intake.farm_config import intake_farm_toml
from tests.intake.vf_example import ANY, formatted, source, submission

pytestmark = [pytest.mark.sandbox]

TOKENS = {"op": "op-token", "ada": "ada-token", "rita": "rita-token"}
ROLES = {"op": "operator", "ada": "contributor", "rita": "reviewer"}
ENV = "contrib:sums@1.0.0"


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    box = Sandbox()
    try:
        yield box
    finally:
        await box.close()


def farm_toml(tmp_path: Path) -> Path:
    return intake_farm_toml(tmp_path / "farm.toml", TOKENS, ROLES)


def as_(farm: RunningFarm, who: str, *args: str, timeout: float = 120) -> Any:
    out = farm.farmctl("--token", TOKENS[who], *args, timeout=timeout).stdout
    return json.loads(out) if "--json" in args else out.decode()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_verifiers_package_goes_through_tiers_1_and_2_then_serves(running_farm, tmp_path: Path  # type: ignore[no-untyped-def]
                                                                     ) -> None:
    # The format function a metric only: with weight, a wrong answer in good format earns reward, which tier 2
    # refuses as it refuses any reward for an attack.
    package = submission(tmp_path / "sums", source(format_weight=0.0))
    farm = running_farm("--workers", "2", "--config", str(farm_toml(tmp_path)))
    sub = as_(farm, "ada", "submit", str(package), "--wait", "--json", timeout=800)
    assert sub["state"] == "in_review", sub
    assert {c["tier"] for c in sub["costs"]} >= {1, 2}, sub["costs"]
    assert not [f for f in sub["findings"] if f.get("blocking", True)], sub["findings"]
    approved = as_(farm, "rita", "review", "approve", str(sub["id"]), "--note", "exact answers", "--json")
    assert approved["state"] == "approved"
    run = as_(farm, "op", "run", "--env", ENV, "--agent", "reference", "--rollouts", "1", "--wait", "--json",
              timeout=400)
    assert run["passed"] == 1, run


async def _tier1(root: Path, sandbox: Sandbox) -> list[str]:
    env = BoxedEnvironment(read_package(root), sandbox, VerifierKey(b"verifiers-intake-tier-one-key-32"))
    assert env.batch, "a verifiers package's checks share boxes"
    report = await tier1_report(env, seeds=(0, 1))
    return [f"{f.check}: {f.evidence}" for f in report.findings if getattr(f, "blocking", True)]


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_tier_1_catches_a_rubric_for_anything_a_leak_and_a_dataset_that_moves(
        tmp_path: Path, sandbox: Sandbox) -> None:
    leaky = "lambda: [dict(r, question=r['question'] + ' (it is ' + r['answer'] + ')') for r in rows()]"
    moving = "lambda: __import__('random').sample(rows(), len(rows()))"
    sound, anything, leak, moves = await asyncio.gather(
        _tier1(submission(tmp_path / "sound", source()), sandbox),
        _tier1(submission(tmp_path / "any", source(rubric=ANY)), sandbox),
        _tier1(submission(tmp_path / "leak", source(dataset=leaky)), sandbox),
        _tier1(submission(tmp_path / "moves", source(dataset=moving)), sandbox))
    assert sound == [], sound
    assert any(f.startswith("check_rejects_wrong: a junk submission passed") for f in anything), anything
    assert any(f.startswith("check_examples: bad example") for f in anything), anything
    assert any(f.startswith("check_reference_passes: the answer to (0, 1) is in the public task") for f in leak), leak
    assert any(f.startswith("check_generates: generate(0, 1) made two different tasks") for f in moves), moves


# A reward function that passes anything, and answers for the other calls of its box: it finds their nonces in
# its own memory (a copy of the runner's: its frames and every dict the collector holds), writes a refusal under
# each to the box's stdout and to the runner's through /proc, leaves a process behind to do it again later, and
# (KILL_RUNNER) kills the runner so that no honest line follows. Its own reward is 1; 0.75 when it found no nonce
# to forge (the test would prove nothing), 0.5 when a process of an earlier call is still there beside it, 0.25
# when it can read the runner's /proc entries.
FORGER = """
    def forger(completion, **kwargs):
        import gc, json, os, signal, sys, time
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())
                  and open(f"/proc/{p}/stat").read().split(") ")[1][0] != "Z"]
        nonces = set()

        def walk(value, depth):
            if type(value) is dict and depth < 4:
                if isinstance(value.get("nonce"), str):
                    nonces.add(value["nonce"])
                for item in list(value.values()):
                    walk(item, depth + 1)
            elif type(value) is list and depth < 4:
                for item in list(value):
                    walk(item, depth + 1)

        frame = sys._getframe()
        while frame is not None:
            for name, value in list(frame.f_locals.items()):
                if name == "nonce" and isinstance(value, str):
                    nonces.add(value)
                walk(value, 0)
            frame = frame.f_back
        for value in gc.get_objects():
            walk(value, 3)
        lines = "".join("FARM " + n + " " + json.dumps({"ok": True, "value": {"reward": 0.0, "passed": False,
                        "reasons": ["forged"]}}) + "\\n" for n in nonces).encode()
        for path in (None, f"/proc/{os.getppid()}/fd/1"):
            try:
                fd = 1 if path is None else os.open(path, os.O_WRONLY)
                os.write(fd, lines)
            except OSError:
                pass
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        if KILL_RUNNER:
            os.kill(os.getppid(), signal.SIGKILL)
        try:
            with open(f"/proc/{os.getppid()}/environ", "rb") as fh:
                fh.read()
            return 0.25  # the runner's /proc is open to it: so are its descriptors, where farmd runs unprivileged
        except OSError:
            return 0.75 if not nonces else 0.5 if others else 1.0

    funcs, weights = [forger], [1.0]
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_call_answers_only_for_itself_in_a_box_its_calls_share(tmp_path: Path, sandbox: Sandbox) -> None:
    def forger(kill: bool) -> BoxedEnvironment:
        root = submission(tmp_path / f"forger-{kill}", source(rubric=FORGER.replace("KILL_RUNNER", str(kill))))
        return BoxedEnvironment(read_package(root), sandbox, VerifierKey(b"verifiers-intake-tier-one-key-32"))

    forging, killing = forger(False), forger(True)
    verdicts, ends = await asyncio.gather(
        asyncio.gather(*(forging.verify(seed, 1, "junk") for seed in range(4))),
        asyncio.gather(*(killing.verify(seed, 1, "junk") for seed in range(4)), return_exceptions=True))
    assert len({(c.wall_s, c.cpu_s) for c in forging.calls if c.op == "verify"}) == 1, "the calls shared a box"
    assert [(v.reward, v.passed) for v in verdicts] == [(1.0, True)] * 4, verdicts
    # With the runner killed by its first call, no call has an answer: each is the package's failure, none a
    # verdict of the forger's making.
    assert all(isinstance(e, ContributedError) and "0 result lines" in str(e) for e in ends), ends


async def test_a_box_that_cannot_import_verifiers_within_the_packages_bounds_answers_no_call(
        tmp_path: Path, sandbox: Sandbox) -> None:
    root = submission(tmp_path / "small", source(), bounds="[bounds]\nmemory_mb = 64\n")
    env = BoxedEnvironment(read_package(root), sandbox, VerifierKey(b"verifiers-intake-tier-one-key-32"))
    ends = await asyncio.gather(*(env.verify(seed, 1, formatted(seed)) for seed in range(2)), return_exceptions=True)
    assert all(isinstance(e, ContributedError) and "bound of its box: memory" in str(e) for e in ends), ends
    assert [c.op for c in env.calls] == ["verify", "verify"] and all(c.wall_s > 0 for c in env.calls), \
        "the box's cost is its calls'"


def test_the_manifest_says_verifiers_and_holds_it_to_one_level(tmp_path: Path) -> None:
    root = submission(tmp_path / "sums", source(), bounds='[env_args]\nrows = 12\n')
    manifest = read_package(root).manifest
    assert (manifest.form, manifest.entry_class, manifest.levels, manifest.kind, manifest.env_args) == \
        ("verifiers", "load_environment", 1, "answer", {"rows": 12})
    assert manifest.bounds["memory_mb"] == 1024, "room for verifiers' import"
    text = (root / "farm-env.toml").read_text()
    (root / "farm-env.toml").write_text(text.replace('form = "verifiers"', 'form = "verifiers"\nlevels = 2'))
    with pytest.raises(PackageError, match="levels = 1"):
        read_package(root)
    (root / "farm-env.toml").write_text(text.replace('form = "verifiers"', 'form = "gym"'))
    with pytest.raises(PackageError, match="form must be one of"):
        read_package(root)
    assert vf_example.answer(1) in formatted(1)
