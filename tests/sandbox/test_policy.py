"""SandboxPolicy: safe defaults, units in names, loud rejection of nonsense."""

from __future__ import annotations

import pytest

from farmd.errors import PolicyError
from farmd.sandbox.policy import DEFAULT_POLICY, NAMED_POLICIES, SandboxPolicy


def test_defaults_are_bounded() -> None:
    p = DEFAULT_POLICY
    assert 0 < p.wall_time_s <= 60 and 0 < p.cpu_time_s <= 60
    assert p.memory_bytes == p.memory_mb * 2**20
    assert p.pids <= 256 and p.open_files <= 1024 and p.output_kb <= 4096


@pytest.mark.parametrize(
    "field,value",
    [("wall_time_s", 0), ("wall_time_s", -1), ("cpu_time_s", float("nan")), ("memory_mb", float("inf")),
     ("pids", 10**9), ("disk_mb", True), ("output_kb", "10")],
)
def test_rejects_nonsense(field: str, value: object) -> None:
    with pytest.raises(PolicyError, match=field):
        SandboxPolicy(**{field: value})  # type: ignore[arg-type]


def test_env_rules() -> None:
    assert SandboxPolicy(env=(("SEED", "1"),)).env == (("SEED", "1"),)
    with pytest.raises(PolicyError, match="PATH"):
        SandboxPolicy(env=(("PATH", "/tmp"),))
    with pytest.raises(PolicyError, match="identifier"):
        SandboxPolicy(env=(("BAD-NAME", "x"),))
    with pytest.raises(PolicyError, match="NUL"):
        SandboxPolicy(env=(("X", "a\0b"),))


def test_overrides_ignore_none_and_take_mappings() -> None:
    p = DEFAULT_POLICY.with_overrides(wall_time_s=None, memory_mb=128, env={"B": "2", "A": "1"})
    assert p.memory_mb == 128 and p.wall_time_s == DEFAULT_POLICY.wall_time_s
    assert p.env == (("A", "1"), ("B", "2"))


def test_mount_shape_is_what_a_started_box_fixes() -> None:
    assert DEFAULT_POLICY.with_overrides(memory_mb=64).mount_shape() == DEFAULT_POLICY.mount_shape()
    assert DEFAULT_POLICY.with_overrides(tmp_mb=8).mount_shape() != DEFAULT_POLICY.mount_shape()


def test_named_policies_describe_themselves() -> None:
    assert "default" in NAMED_POLICIES
    for name, (description, policy) in NAMED_POLICIES.items():
        assert description and isinstance(policy, SandboxPolicy), name
    d = DEFAULT_POLICY.to_dict()
    assert d["env"] == {} and d["wall_time_s"] == DEFAULT_POLICY.wall_time_s
