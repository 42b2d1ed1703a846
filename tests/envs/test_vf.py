"""verifiers environments served as ``vf:NAME``: an operator's verifiers package (a module with
``load_environment``) named in farm.toml's ``[verifiers]``, its dataset posing the tasks and its rubric judging
them, all of its code run in boxes, never in farmd. Rewards are the rubric's own (clamped to [0, 1]), and what
the package's code does wrong (raise, hang, NaN, out of range, a load that fails) is the verifier's failure."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from farm_client import FarmClient

from farmd import config
from farmd.envs import Attempt, VerifyContext, verify_safely
from farmd.errors import ConfigError, ContributedError, PackageError
from farmd.flags import VERIFIER_FAULT
from farmd.intake.boxed import BoxedEnvironment
from farmd.intake.package import read_verifiers_package
from farmd.intake.vf import local_environment
from farmd.sandbox import Sandbox
from farmd.verifier import VerifierKey
from tests.conftest import RunningFarm
from tests.intake import vf_example
from tests.intake.vf_example import formatted, own_score, source, write

pytestmark = [pytest.mark.sandbox]

ENV = "vf:sums"


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[VerifyContext]:
    sandbox = Sandbox()
    try:
        yield VerifyContext(sandbox=sandbox, key=VerifierKey(b"verifiers-environments-key-32byt"),
                            scratch_dir=tmp_path)
    finally:
        await sandbox.close()


def _metric(reasons: list[str], name: str) -> float:
    """A metric's value as the verdict's reasons list it (``name = value``)."""
    for reason in reasons:
        if reason.startswith(f"{name} = "):
            return float(reason.split(" = ", 1)[1])
    raise AssertionError(f"no {name} in {reasons}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_vf_environment_rolls_out_through_farmd_judged_in_boxes(running_farm, tmp_path: Path  # type: ignore[no-untyped-def]
                                                                   ) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host secret")
    package = write(tmp_path / "sums", source(secret=secret))
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[verifiers]\nsums = "{package.name}"\n')
    farm: RunningFarm = running_farm("--workers", "2", "--config", str(toml))

    right = json.loads(farm.farmctl("run", "--env", ENV, "--agent", "reference", "--rollouts", "2", "--wait",
                                    "--json", timeout=400).stdout)
    assert right["passed"] == 2, right
    wrong = json.loads(farm.farmctl("run", "--env", ENV, "--agent", "random", "--rollouts", "1", "--wait",
                                    "--json", timeout=400).stdout)
    assert wrong["passed"] == 0, wrong

    with FarmClient(farm.addr) as client:
        trajectories = client.trajectories(ENV, full=True)
    assert len(trajectories) == 3 and {t.status for t in trajectories} == {"ok"}
    module = package / "sums.py"
    for t in trajectories:
        assert t.task.prompt.endswith(f"What is {100000000 + 7919 * (t.seed % vf_example.ROWS)} + "
                                      f"{13 * (t.seed % vf_example.ROWS) + 5}?"), "the task is the dataset's row"
        assert vf_example.answer(t.seed) not in t.task.prompt, "the answer stays in the box"
        assert t.passed is (t.agent == "reference") and (t.final == formatted(t.seed)) is (t.agent == "reference")
        assert math.isclose(t.reward, own_score(module, t.seed, t.final), abs_tol=1e-9), (t.reward, t.reasons)
        # The reward functions ran in a box: another uid than farmd's, a pid of a fresh pid namespace, and the
        # host file farmd's uid reads was out of their reach.
        farmd_pid = farm.proc.pid
        assert _metric(t.reasons, "seen_uid") != os.getuid() == 0, t.reasons
        assert _metric(t.reasons, "seen_pid") < 64 < farmd_pid, t.reasons
        assert _metric(t.reasons, "read_host_file") == 0.0 and secret.read_text() == "host secret"


async def test_a_served_packages_tasks_and_references_are_made_in_one_box_as_fresh_boxes_make_them(
        tmp_path: Path, ctx: VerifyContext) -> None:
    env = local_environment("sums", write(tmp_path / "sums", source()))
    try:
        tasks = [await env.make_task(seed, 1, ctx) for seed in (4, 5, 6)]
        references = [await env.make_reference(task, ctx) for task in tasks]
        made = env._maker(ctx).calls
        # verifiers imported once for the six, not once a call
        assert [c.op for c in made] == ["import", *["generate"] * 3, *["reference"] * 3], made
        fresh = BoxedEnvironment(env.package, ctx.sandbox, ctx.key, batch=False)  # a box for the call alone
        task, reference = await fresh.solve(5, 1)
        assert tasks[1].prompt.endswith(task.prompt) and references[1].final == reference == formatted(5)
        verdict = await env.verify(tasks[2], references[2], ctx)  # a verdict's box is still its own
        assert verdict.passed and len(env._maker(ctx).calls) == len(made)
    finally:
        await env.aclose()


def _quick(package_root: Path, name: str = "sums", verify_s: float = 6.0):  # type: ignore[no-untyped-def]
    """The package read as ``vf:NAME`` with a short bound on each call (a hang costs the test this much)."""
    package = read_verifiers_package(package_root, name)
    bounds = {**package.manifest.bounds, "verify_s": verify_s}
    return dataclasses.replace(package, manifest=dataclasses.replace(package.manifest, bounds=bounds))


async def test_what_a_reward_function_does_wrong_is_the_verifiers_failure_each_on_its_own(
        tmp_path: Path, ctx: VerifyContext) -> None:
    env = BoxedEnvironment(_quick(write(tmp_path / "sums", source(probe=True))), ctx.sandbox, ctx.key, batch=True)
    finals = {"right": formatted(3), "raises": "<answer>RAISE</answer>", "hangs": "<answer>HANG</answer>",
              "nan": "<answer>NAN</answer>", "above one": "<answer>BIG</answer>",
              "wrong": f"<answer>\n{int(vf_example.answer(3)) + 1}\n</answer>"}
    verdicts = dict(zip(finals, await asyncio.gather(*[env.verify(3, 1, f) for f in finals.values()],
                                                   return_exceptions=True), strict=True))
    # One box for all six (verifiers imported once), each call in its own child: the hang is its own.
    assert len({(c.wall_s, c.cpu_s) for c in env.calls if c.op == "verify"}) == 1, env.calls
    right, wrong = verdicts["right"], verdicts["wrong"]
    assert not isinstance(right, BaseException) and not isinstance(wrong, BaseException), verdicts
    assert (right.reward, right.passed) == (1.0, True), "1.2 by the rubric, clamped to 1"
    assert (wrong.passed, math.isclose(wrong.reward, 0.2)) == (False, True), wrong
    for what, expected in (("raises", "probe raised KeyError"), ("hangs", "took more than its 6 seconds"),
                           ("nan", "probe returned nan"), ("above one", "probe returned 5.0, outside [0, 1]")):
        failure = verdicts[what]
        assert isinstance(failure, ContributedError), (what, failure)
        assert expected in failure.evidence, (what, failure.evidence)


async def test_a_reward_function_that_raises_scores_the_attempt_zero_and_flags_it(
        tmp_path: Path, ctx: VerifyContext) -> None:
    """Verifiers itself would score a raising reward function 0 and say nothing: farm says so, loudly."""
    env = local_environment("sums", write(tmp_path / "sums", source(probe=True)))
    assert (env.name, env.max_difficulty, env.package.manifest.form) == (ENV, 1, "verifiers")
    task = await env.make_task(3, 1, ctx)
    verdict = await verify_safely(env, task, Attempt(final="<answer>RAISE</answer>"), ctx)
    assert (verdict.status, verdict.passed, verdict.reward) == ("ok", False, 0.0)
    assert VERIFIER_FAULT in verdict.flags and "KeyError" in verdict.reasons[0], verdict.reasons


async def test_a_load_environment_that_fails_makes_no_task(tmp_path: Path, ctx: VerifyContext) -> None:
    env = local_environment("sums", write(tmp_path / "sums", source(load_first="raise ValueError('no rows today')")))
    with pytest.raises(ContributedError, match="ValueError: no rows today"):
        await env.make_task(0, 1, ctx)


def test_a_package_is_one_module_defining_load_environment(tmp_path: Path) -> None:
    one = write(tmp_path / "one", source(), extra={"pyproject.toml": '[project]\nname = "sums"\nversion = "2.1"\n'})
    package = read_verifiers_package(one, "sums")
    assert (package.manifest.entry_file, package.manifest.entry_class, package.manifest.version) == \
        ("sums.py", "load_environment", "2.1")
    two = write(tmp_path / "two", source(), extra={"other.py": "def load_environment():\n    pass\n"})
    with pytest.raises(PackageError, match="2 top-level modules define load_environment"):
        read_verifiers_package(two, "sums")
    none = write(tmp_path / "none", "x = 1\n")
    with pytest.raises(PackageError, match="0 top-level modules"):
        read_verifiers_package(none, "sums")
    with pytest.raises(PackageError, match="lowercase"):
        read_verifiers_package(one, "Sums!")


def test_the_config_names_each_vf_environment(tmp_path: Path) -> None:
    toml = tmp_path / "farm.toml"
    toml.write_text('[verifiers]\nsums = "pkgs/sums"\nother = "/abs/other"\n')
    assert config.load(toml).verifiers == (("other", Path("/abs/other")), ("sums", tmp_path / "pkgs/sums"))
    toml.write_text('[verifiers]\n"Bad Name" = "x"\n')
    with pytest.raises(ConfigError, match="lowercase"):
        config.load(toml)


def test_farmd_refuses_to_start_on_a_vf_package_it_cannot_read(running_farm, tmp_path: Path  # type: ignore[no-untyped-def]
                                                               ) -> None:
    toml = tmp_path / "farm.toml"
    toml.write_text('[verifiers]\nsums = "missing"\n')
    with pytest.raises(AssertionError, match=r"\[verifiers\] sums .* is not a directory"):
        running_farm("--workers", "1", "--config", str(toml))
