"""``make_agent``: every spec form, and a clear error for each malformed one."""

from __future__ import annotations

import pytest

from farmd.agents import AgentSpecError, OpenAIAgent, RandomAgent, ReferenceAgent, make_agent
from farmd.agents.registry import FORMS
from farmd.agents.scripted import SkilledAgent


def test_scripted_specs() -> None:
    assert isinstance(make_agent("reference"), ReferenceAgent)
    assert make_agent("reference").name == "reference"
    plain = make_agent("random")
    assert isinstance(plain, RandomAgent) and (plain.seed, plain.name) == (0, "random")
    seeded = make_agent(" random:7 ")
    assert isinstance(seeded, RandomAgent) and (seeded.seed, seeded.name) == (7, "random:7")
    with pytest.raises(AgentSpecError, match="integer"):
        make_agent("random:seven")
    skilled = make_agent("skilled:2.5")
    assert isinstance(skilled, SkilledAgent) and (skilled.skill, skilled.name) == (2.5, "skilled:2.5")
    for bad in ("skilled:", "skilled:high", "skilled:1e9"):
        with pytest.raises(AgentSpecError, match="skill"):
            make_agent(bad)


def test_an_openai_spec() -> None:
    agent = make_agent("openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1", environ={})
    assert isinstance(agent, OpenAIAgent)
    assert agent.config.model == "Qwen/Qwen2.5-7B-Instruct"
    assert agent.config.base_url == "http://127.0.0.1:8000/v1"
    assert agent.config.api_key is None
    assert agent.name == "openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1"
    assert agent.limits.max_turns is None


def test_the_api_key_comes_from_the_environment_when_the_agent_is_made() -> None:
    spec = "openai:m@https://api.example.com/v1"
    with_key = make_agent(spec, environ={"FARM_OPENAI_KEY": "sk-default"})
    assert isinstance(with_key, OpenAIAgent) and with_key.config.api_key == "sk-default"
    named = make_agent(spec + "?key_env=MY_KEY", environ={"MY_KEY": "sk-mine", "FARM_OPENAI_KEY": "sk-default"})
    assert isinstance(named, OpenAIAgent) and named.config.api_key == "sk-mine"
    assert "sk-" not in named.name and "sk-" not in repr(named.config)
    with pytest.raises(AgentSpecError, match="MY_KEY"):
        make_agent(spec + "?key_env=MY_KEY", environ={})
    with pytest.raises(AgentSpecError, match="control characters"):
        make_agent(spec, environ={"FARM_OPENAI_KEY": "sk-1\r\nX-Evil: yes"})


def test_openai_options() -> None:
    agent = make_agent("openai:m@http://h:1/v1?max_tokens=99&temperature=0.5&timeout_s=7&attempts=2&max_turns=5",
                       environ={})
    assert isinstance(agent, OpenAIAgent)
    cfg = agent.config
    assert (cfg.base_url, cfg.temperature, cfg.request_timeout_s, cfg.max_attempts) == ("http://h:1/v1", 0.5, 7.0, 2)
    assert (agent.limits.max_tokens, agent.limits.max_turns) == (99, 5)


def test_a_model_name_may_hold_at_signs_and_colons() -> None:
    agent = make_agent("openai:org/model:v2@beta@http://h/v1", environ={})
    assert isinstance(agent, OpenAIAgent) and agent.config.model == "org/model:v2@beta"
    assert agent.model_for(3) == "org/model:v2@beta"
    versioned = make_agent("openai:farm-v{version}@http://h/v1", environ={})
    assert isinstance(versioned, OpenAIAgent) and versioned.model_for(12) == "farm-v12"


@pytest.mark.parametrize(("spec", "why"), [
    ("openai:Qwen", "expected openai:MODEL@"),
    ("openai:@http://h/v1", "expected openai:MODEL@"),
    ("openai:m@ftp://h/v1", "expected openai:MODEL@"),
    ("openai:m@http:///v1", "no host"),
    ("openai:m@http://h:port/v1", "Port"),
    ("openai:m@http://h/v1?colour=blue", "unknown option"),
    ("openai:m@http://h/v1?attempts=many", "not an integer"),
    ("openai:m@http://h/v1?temperature=hot", "not a number"),
    ("openai:m@http://h/v1?attempts=0", "bad retry settings"),
    ("openai:m@http://h/v1?max_tokens=-1", "positive"),
    ("openai:m@http://h/v1?&&", "malformed query"),
])
def test_malformed_openai_specs(spec: str, why: str) -> None:
    with pytest.raises(AgentSpecError, match=why):
        make_agent(spec, environ={})


def test_torch_policies_come_later() -> None:
    with pytest.raises(AgentSpecError, match="torch policies arrive in a later issue"):
        make_agent("torch:/models/policy.pt")


def test_an_unknown_spec_lists_the_known_forms() -> None:
    with pytest.raises(AgentSpecError) as caught:
        make_agent("gpt-4")
    for form in FORMS:
        assert form in str(caught.value)
