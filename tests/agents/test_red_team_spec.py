"""A red-team spec is checked by its form where no agent runs (a run being queued), and built only where a
red team is handed in: a node without one refuses it."""

from __future__ import annotations

import pytest

from farmd.agents.registry import check_spec, make_agent, parse_red_team_spec
from farmd.errors import AgentSpecError


def test_a_red_team_spec_parses_its_marker_and_targets() -> None:
    spec = parse_red_team_spec("redteam:escape:leave-files?nonce=00112233445566778899aabbccddeeff&canary=4000"
                               "&farm=7431&data=/var/lib/farm")
    assert (spec.what, spec.name, spec.canary, spec.farm, spec.data) == ("escape", "leave-files", 4000, 7431,
                                                                         "/var/lib/farm")
    check_spec("redteam:exploit:always-equal")


@pytest.mark.parametrize("bad", [
    "redteam:steal:x", "redteam:exploit:", "redteam:exploit:Bad Name", "redteam:escape:x?nonce=abc",
    "redteam:escape:x?canary=0", "redteam:escape:x?farm=70000", "redteam:escape:x?data=relative/dir",
    "redteam:escape:x?url=http://example.org", "redteam:escape:x?canary=1&canary=2",
])
def test_a_malformed_red_team_spec_is_refused(bad: str) -> None:
    with pytest.raises(AgentSpecError):
        check_spec(bad)


def test_a_node_without_a_red_team_refuses_its_agents() -> None:
    with pytest.raises(AgentSpecError, match="no red team"):
        make_agent("redteam:exploit:always-equal")
