"""The plan of a red-team run: every exploit meets every family of tasks it applies to, on the same seeds every
run, so that a run cannot hold or breach by the luck of the draw."""

from __future__ import annotations

import pytest

from farmd.envs import get, names
from farmd.intake.escapes import for_kind as escapes_for
from farmd.intake.exploits import for_kind
from farmd.intake.redteam import contributed_family, families_of, plan, spread


def _plan(envs: list[str], seeds: int = 1, **kwargs):  # type: ignore[no-untyped-def]
    kinds = {e: get(e).exploit_kind for e in envs}
    return plan(kinds, {e: families_of(get(e), seeds) for e in envs}, marker="nonce=ab", **kwargs)


@pytest.mark.parametrize("env_name", names())
def test_every_family_is_found_with_seeds_of_its_own(env_name: str) -> None:
    env = get(env_name)
    families = families_of(env, 3)
    assert [f.name for f in families] == list(env.families())
    for family in families:
        assert len(family.seeds) == 3 and family.seeds == tuple(sorted(set(family.seeds)))
        assert all(env.family_of(seed, family.difficulty) == family.name for seed in family.seeds)
        lower = range(1, family.difficulty)
        assert not any(env.family_of(s, d) == family.name for d in lower for s in range(64)), \
            "a family is attacked at the lowest level it appears at"


def test_shell_tasks_are_attacked_in_every_family_and_its_made_tasks_agree() -> None:
    shell = get("shell")
    for family in families_of(shell, 2):
        assert {shell.generate(s, family.difficulty).metadata["family"] for s in family.seeds} == {family.name}


def test_the_plan_is_the_cross_product_of_exploits_and_families() -> None:
    envs = names()
    attacks = _plan(envs, seeds=2)
    exploits = {(a.env, a.family, a.tried) for a in attacks if a.tried.startswith("exploit ")}
    want = {(e, f.name, f"exploit {x.name}") for e in envs for f in families_of(get(e), 2)
            for x in for_kind(get(e).exploit_kind)}
    assert exploits == want
    assert len(exploits) == sum(a.tried.startswith("exploit ") for a in attacks), "each cell once"
    shell = {a.family for a in attacks if a.env == "shell" and a.tried == "exploit too-many-steps"}
    assert shell == set(get("shell").families()) and len(shell) == 7
    assert all(len(a.seeds) == 2 for a in attacks)
    # Escapes try the box whatever the task: each once per environment where code runs.
    escapes = [(a.env, a.tried) for a in attacks if a.tried.startswith("escape ")]
    assert sorted(escapes) == sorted((e, f"escape {x.name}") for e in envs for x in escapes_for(get(e).exploit_kind))
    assert all(a.spec.endswith("?nonce=ab") for a in attacks if a.tried.startswith("escape "))


def test_the_plan_is_the_same_every_run() -> None:
    assert _plan(["shell", "py-func", "kernel"]) == _plan(["shell", "py-func", "kernel"])


def test_the_plan_takes_named_or_spread_exploits_at_every_family() -> None:
    named = _plan(["shell", "py-func"], exploits=["too-many-steps"], escapes=False)
    assert {(a.env, a.tried) for a in named} == {("shell", "exploit too-many-steps")} and len(named) == 7
    some = _plan(["py-func"], max_exploits=3, escapes=False)
    library = for_kind("function")
    assert [a.tried for a in some[:3]] == [f"exploit {e.name}" for e in spread(library, 3)]
    assert len(some) == 3 * len(get("py-func").families())


def test_a_contributed_environment_is_one_family_with_its_hangs() -> None:
    env = "contrib:sums@1.0.0"
    attacks = plan({env: "answer"}, {env: [contributed_family(env, 2)]})
    assert {a.family for a in attacks} == {env} and all(a.seeds == (0, 1) for a in attacks)
    assert len(attacks) == len(for_kind("answer", slow=True))
