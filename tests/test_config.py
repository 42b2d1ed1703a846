"""farm.toml: the one place model endpoints and their keys are named, read once when the config loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from farmd.config import load
from farmd.errors import ConfigError

TOML = """
[endpoints.vllm]
url = "http://127.0.0.1:8000/v1"
key_env = "FARM_TEST_VLLM_KEY"
request_timeout_s = 60
max_attempts = 2
max_tokens = 4096
max_turns = 12

[endpoints.open]
url = "https://models.example.com/v1"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "farm.toml"
    path.write_text(text)
    return path


def test_endpoints_are_named_in_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TEST_VLLM_KEY", "sk-from-the-environment")
    config = load(write(tmp_path, TOML))
    vllm, open_ = config.endpoints
    assert (vllm.name, vllm.url, vllm.key_env, vllm.api_key) == (
        "vllm", "http://127.0.0.1:8000/v1", "FARM_TEST_VLLM_KEY", "sk-from-the-environment")
    assert (vllm.request_timeout_s, vllm.max_attempts, vllm.max_tokens, vllm.max_turns) == (60, 2, 4096, 12)
    assert (open_.name, open_.api_key, open_.key_env) == ("open", None, None)
    assert "sk-" not in repr(config), "a key is never shown"
    # Read when the config loads, never later: a changed environment changes nothing.
    monkeypatch.setenv("FARM_TEST_VLLM_KEY", "sk-changed")
    assert config.endpoints[0].api_key == "sk-from-the-environment"
    assert load().endpoints == ()


@pytest.mark.parametrize(("text", "why"), [
    ('[endpoints.vllm]\nurl = "http://h/v1"\ntimeout = 5\n', r"\[endpoints.vllm\] has no setting 'timeout'; known: .*url"),
    ("[endpoints.vllm]\nkey_env = \"X\"\n", r"\[endpoints.vllm\] needs a url"),
    ('[endpoints]\nvllm = "http://h/v1"\n', r"\[endpoints.vllm\] must be a table"),
    ('[endpoints."a b"]\nurl = "http://h/v1"\n', "name"),
    ('[endpoints.vllm]\nurl = "ftp://h/v1"\n', "scheme"),
    ('[endpoints.vllm]\nurl = "http://h/v1"\nmax_attempts = "many"\n', "max_attempts"),
    ('[endpoints.vllm]\nurl = "http://h/v1"\nkey_env = "FARM_TEST_UNSET_KEY"\n', "FARM_TEST_UNSET_KEY"),
    ('[scheduler]\ndemand_agent = "openai:m@nowhere"\n', r"demand_agent.*no model endpoints are configured"),
    ('[scheduler]\ndemand_agent = "openai:m@http://h/v1"\n', r"demand_agent.*URL"),
    ('[scheduler]\ndemand_agent = "torch:/models/tiny.pt"\n', r"demand_agent.*torch:NAME"),
    ('[endpoints.vllm]\nurl = "http://h/v1"\nserves = "no spaces"\n', r"serves names a policy line"),
    ('[taskbank]\nsampling = "thompson"\n', r"\[taskbank\].*sampling"),
    ('[taskbank]\nbandwidth = 3\n', r"\[taskbank\] has no setting 'bandwidth'"),
])
def test_a_bad_endpoint_table_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                               why: str) -> None:
    monkeypatch.delenv("FARM_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError, match=why):
        load(write(tmp_path, text))


def test_a_key_that_cannot_go_into_a_header_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TEST_VLLM_KEY", "sk-1\r\nX-Evil: yes")
    with pytest.raises(ConfigError, match=r"FARM_TEST_VLLM_KEY.*control characters"):
        load(write(tmp_path, TOML))
    monkeypatch.setenv("FARM_TEST_VLLM_KEY", "")
    with pytest.raises(ConfigError, match=r"FARM_TEST_VLLM_KEY.*holds no API key"):
        load(write(tmp_path, TOML))


def test_the_demand_agent_may_name_a_configured_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TEST_VLLM_KEY", "sk-x")
    config = load(write(tmp_path, TOML + '\n[scheduler]\ndemand_agent = "openai:policy-v{version}@vllm"\n'))
    assert config.scheduler.demand_agent == "openai:policy-v{version}@vllm"


def test_the_learning_loop_config_loads(tmp_path: Path) -> None:
    from farmd.cli.main_job import loop_toml

    config = load(write(tmp_path, loop_toml("uniform")))
    assert (config.scheduler.demand_agent, config.scheduler.demand_envs) == ("torch:tiny", ("arith",))
    assert (config.taskbank.sampling, config.taskbank.max_groups_per_task) == ("uniform", 2)
