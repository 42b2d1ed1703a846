"""The catalog serves the built-ins and environments added at run time, by name, and never swaps one
environment for another under a name jobs use."""

from __future__ import annotations

import pytest

from farmd.agents import make_agent
from farmd.envs import Attempt, SubmissionEnvironment, Task, VerifyContext, registry
from farmd.envs.catalog import Catalog
from farmd.errors import Conflict, TaskError
from farmd.verifier import VerifierKey
from farmd.verifier.verdict import Verdict, failed


class Boxed(SubmissionEnvironment):
    """Stands in for an environment whose tasks and references exist only through the async hooks."""

    max_difficulty = 2
    verifier_version = "1"

    def __init__(self, name: str = "contrib:echo@1.0") -> None:
        self.name = name
        self.version = "1.0"

    def generate(self, seed: int, difficulty: int) -> Task:
        raise TaskError("only through make_task")

    def reference(self, task: Task) -> Attempt:
        raise TaskError("only through make_reference")

    async def make_task(self, seed: int, difficulty: int, ctx: VerifyContext) -> Task:
        return self.task(seed, difficulty, f"say {seed}")

    async def make_reference(self, task: Task, ctx: VerifyContext) -> Attempt:
        return Attempt(final=str(task.seed))

    async def verify(self, task: Task, attempt: Attempt, ctx: VerifyContext) -> Verdict:
        return failed("1", "not judged here")


def no_box() -> VerifyContext:
    return VerifyContext(sandbox=None, key=VerifierKey(b"k" * 32))  # type: ignore[arg-type]


def test_the_built_ins_are_served_as_the_registry_has_them() -> None:
    catalog = Catalog()
    assert catalog.names() == registry.names()
    assert catalog.get("arith") is registry.get("arith")
    with pytest.raises(TaskError, match=r"known: .*arith"):
        catalog.get("nope")


def test_added_environments_are_served_until_removed() -> None:
    catalog = Catalog()
    env = Boxed()
    catalog.add(env)
    assert catalog.get("contrib:echo@1.0") is env
    assert catalog.names() == [*registry.names(), "contrib:echo@1.0"]
    levels = catalog.max_difficulty()
    assert levels["contrib:echo@1.0"] == 2 and levels["arith"] == registry.get("arith").max_difficulty
    assert set(levels) == set(catalog.names())
    assert catalog.remove("contrib:echo@1.0") is env
    with pytest.raises(TaskError, match=r"no environment 'contrib:echo@1\.0'; known: "):
        catalog.get("contrib:echo@1.0")


def test_no_name_is_served_twice_and_built_ins_stay() -> None:
    catalog = Catalog()
    catalog.add(Boxed())
    with pytest.raises(Conflict, match="remove it first"):
        catalog.add(Boxed())
    with pytest.raises(Conflict):
        catalog.add(Boxed("arith"))
    with pytest.raises(TaskError, match="no name"):
        catalog.add(Boxed(""))
    with pytest.raises(TaskError, match="built-ins cannot be"):
        catalog.remove("arith")
    assert catalog.get("arith") is registry.get("arith")


async def test_the_reference_agent_answers_an_added_environment_through_its_hooks() -> None:
    catalog = Catalog()
    env = Boxed()
    catalog.add(env)
    ctx = no_box()
    task = await env.make_task(41, 1, ctx)
    for spec in ("reference", "skilled:100"):
        result = await make_agent(spec, envs=catalog.get, ctx=ctx).attempt(task, None, 0)
        assert result.attempt.final == "41", spec
    with pytest.raises(TaskError, match="make_reference"):  # without boxes there is only the sync reference
        await make_agent("reference", envs=catalog.get).attempt(task, None, 0)
