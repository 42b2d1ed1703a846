"""``make_agent``: every spec form, and a clear error for each malformed one."""

from __future__ import annotations

import pytest

from farmd.agents import AgentSpecError, ChatLimits, OpenAIAgent, RandomAgent, ReferenceAgent, make_agent
from farmd.agents.registry import FORMS, NamedEndpoint
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


ENDPOINTS = (NamedEndpoint(name="vllm", url="http://127.0.0.1:8000/v1", api_key="sk-vllm", key_env="VLLM_KEY",
                           request_timeout_s=60, max_attempts=3, max_tokens=4096, max_turns=30),
             NamedEndpoint(name="local-2", url="http://h:1/v1"))


def test_an_openai_spec_names_a_configured_endpoint() -> None:
    agent = make_agent("openai:Qwen/Qwen2.5-7B-Instruct@vllm", endpoints=ENDPOINTS)
    assert isinstance(agent, OpenAIAgent)
    cfg = agent.config
    assert (cfg.model, cfg.base_url, cfg.api_key) == ("Qwen/Qwen2.5-7B-Instruct", "http://127.0.0.1:8000/v1", "sk-vllm")
    assert (cfg.request_timeout_s, cfg.max_attempts) == (60, 3), "timeouts and retries come from the config"
    assert agent.name == "openai:Qwen/Qwen2.5-7B-Instruct@vllm"
    assert agent.limits.max_turns is None and agent.limits.max_tokens == ChatLimits().max_tokens
    assert "sk-" not in agent.name and "sk-" not in repr(cfg) and "sk-" not in repr(ENDPOINTS)
    keyless = make_agent("openai:m@local-2", endpoints=ENDPOINTS)
    assert isinstance(keyless, OpenAIAgent) and keyless.config.api_key is None


def test_a_spec_may_choose_sampling_options_within_the_endpoints_bounds() -> None:
    agent = make_agent("openai:m@vllm?max_tokens=99&temperature=0.5&max_turns=5", endpoints=ENDPOINTS)
    assert isinstance(agent, OpenAIAgent)
    assert (agent.config.temperature, agent.limits.max_tokens, agent.limits.max_turns) == (0.5, 99, 5)
    assert agent.name == "openai:m@vllm"
    for over in ("max_tokens=4097", "max_turns=31", "temperature=2.5", "temperature=-1", "temperature=nan"):
        with pytest.raises(AgentSpecError, match=over.split("=")[0]):
            make_agent(f"openai:m@vllm?{over}", endpoints=ENDPOINTS)


def test_a_model_name_may_hold_at_signs_and_colons() -> None:
    agent = make_agent("openai:org/model:v2@beta@vllm", endpoints=ENDPOINTS)
    assert isinstance(agent, OpenAIAgent) and agent.config.model == "org/model:v2@beta"
    assert agent.model_for(3) == "org/model:v2@beta"
    versioned = make_agent("openai:farm-v{version}@vllm", endpoints=ENDPOINTS)
    assert isinstance(versioned, OpenAIAgent) and versioned.model_for(12) == "farm-v12"


@pytest.mark.parametrize("spec", [
    "openai:m@http://127.0.0.1:8000/v1",
    "openai:m@https://api.example.com/v1?key_env=FARM_TOKEN",
    "openai:m@http://169.254.169.254/latest",
    "openai:m@vllm://x",
])
def test_a_url_in_a_spec_is_refused_with_the_configured_names(spec: str) -> None:
    with pytest.raises(AgentSpecError, match="URL") as caught:
        make_agent(spec, endpoints=ENDPOINTS)
    assert "vllm, local-2" in str(caught.value) and "farm.toml" in str(caught.value)


def test_an_unknown_endpoint_is_refused_with_the_configured_names() -> None:
    for spec in ("openai:m@nowhere", "openai:m@127.0.0.1:8000", "openai:m@VLLM"):
        with pytest.raises(AgentSpecError, match="no endpoint named") as caught:
            make_agent(spec, endpoints=ENDPOINTS)
        assert "configured: vllm, local-2" in str(caught.value)
    with pytest.raises(AgentSpecError, match=r"no model endpoints are configured.*\[endpoints\.NAME\]"):
        make_agent("openai:m@vllm")


@pytest.mark.parametrize("option", ["key_env=FARM_TOKEN", "timeout_s=86400", "attempts=1000"])
def test_keys_timeouts_and_retries_are_config_only(option: str) -> None:
    with pytest.raises(AgentSpecError, match=r"farm.toml.*\[endpoints\.vllm\]"):
        make_agent(f"openai:m@vllm?{option}", endpoints=ENDPOINTS)


@pytest.mark.parametrize(("spec", "why"), [
    ("openai:Qwen", "expected openai:MODEL@ENDPOINT"),
    ("openai:@vllm", "expected openai:MODEL@ENDPOINT"),
    ("openai:m@", "no endpoint named"),
    ("openai:m@vllm?colour=blue", "unknown option"),
    ("openai:m@vllm?max_turns=many", "not an integer"),
    ("openai:m@vllm?temperature=hot", "not a number"),
    ("openai:m@vllm?max_tokens=-1", "positive"),
    ("openai:m@vllm?max_tokens=1&max_tokens=2", "more than once"),
    ("openai:m@vllm?&&", "malformed query"),
    ("openai:m\x1b]0;pwned\x07@vllm", "printable"),
    ("openai:m\u202e@vllm", "printable"),
    ("openai:" + "m" * 600 + "@vllm", "at most"),
    ("openai:m@vllm" + " " * 600, "at most"),  # counted as given: it is stored with every trajectory
])
def test_malformed_openai_specs(spec: str, why: str) -> None:
    with pytest.raises(AgentSpecError, match=why) as caught:
        make_agent(spec, endpoints=ENDPOINTS)
    assert "\x1b" not in str(caught.value) and len(str(caught.value)) < 1000


def test_a_named_endpoint_checks_itself() -> None:
    for bad, why in [({"name": "a b"}, "name"), ({"url": "ftp://h/v1"}, "scheme"),
                     ({"url": "http://u:p@h/v1"}, "credentials"), ({"api_key": "sk-1\r\nX-Evil: yes"}, "control"),
                     ({"request_timeout_s": 0}, "request_timeout_s"), ({"max_attempts": 0}, "max_attempts"),
                     ({"max_attempts": "3"}, "max_attempts"), ({"max_tokens": 0}, "max_tokens"),
                     ({"max_turns": 1.5}, "max_turns")]:
        with pytest.raises(ValueError, match=why):
            NamedEndpoint(**{"name": "x", "url": "http://h/v1", **bad})


def test_a_torch_spec_names_a_published_policy_not_a_path() -> None:
    # The forms in full are tested with the agent (tests/agents/test_torch_policy.py).
    with pytest.raises(AgentSpecError, match="a path or a URL is not accepted"):
        make_agent("torch:/models/policy.pt")
    with pytest.raises(AgentSpecError, match="this node has no policy source"):
        make_agent("torch:tiny")


def test_an_unknown_spec_lists_the_known_forms() -> None:
    with pytest.raises(AgentSpecError) as caught:
        make_agent("gpt-4")
    for form in FORMS:
        assert form in str(caught.value)
