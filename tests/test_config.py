"""farm.toml: the one place model endpoints and their keys are named, read once when the config loads."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from farmd.config import Config, load
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
    assert (config.taskbank.sampling, config.taskbank.max_groups_per_task) == ("uniform", 1)
    assert (config.scheduler.demand_per_version, config.scheduler.demand_lag, config.scheduler.demand_buffer) == \
        (512, 0, 1024)
    assert config.torch_threads == 1
    assert load(write(tmp_path, loop_toml(torch_threads=2))).torch_threads == 2
    assert (config.taskbank.max_level, load(write(tmp_path, loop_toml(max_level=1))).taskbank.max_level) == (0, 1)


@pytest.mark.parametrize("value", ["0", "-1", "true", "1.5", '"2"', "100000"])
def test_torch_threads_is_a_whole_number_of_threads(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="torch_threads must be a whole number from 1 to 1024"):
        load(write(tmp_path, f"[farm]\ntorch_threads = {value}\n"))


def test_demand_per_version_and_lag_are_whole_numbers(tmp_path: Path) -> None:
    for name, value in (("demand_per_version", "-8"), ("demand_lag", "-1"), ("demand_lag", "true"),
                        ("demand_per_version", "1.5")):
        with pytest.raises(ConfigError, match=name):
            load(write(tmp_path, f"[scheduler]\n{name} = {value}\n"))
    config = load(write(tmp_path, "[scheduler]\ndemand_per_version = 512\ndemand_lag = 0\n"))
    assert (config.scheduler.demand_per_version, config.scheduler.demand_lag) == (512, 0)


# -- credentials and TLS ---------------------------------------------------------------------------

SHA_A = hashlib.sha256(b"token-a").hexdigest()
SHA_B = hashlib.sha256(b"token-b").hexdigest()


def credential_toml(*tables: str) -> str:
    return "\n".join(f"[[credentials]]\n{t}\n" for t in tables)


def test_credentials_keep_a_hash_and_show_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("FARM_TOKEN", raising=False)
    token_file = tmp_path / "nodes.token"
    token_file.write_text("token-b\n")
    token_file.chmod(0o644)
    config = load(write(tmp_path, credential_toml(
        f'name = "ops"\nroles = ["operator", "trainer"]\ntoken_sha256 = "{SHA_A.upper()}"',
        f'name = "nodes"\nroles = ["node"]\ntoken_file = "{token_file}"')))
    assert [(c.name, c.roles, c.token_sha256) for c in config.credentials] == [
        ("ops", {"operator", "trainer"}, SHA_A), ("nodes", {"node"}, SHA_B)]
    assert "nodes.token" in caplog.text and "chmod 600" in caplog.text, "a token file others may read is named"
    assert "token-b" not in caplog.text
    for secret in ("token-a", "token-b", SHA_A, SHA_B, SHA_A.upper()):
        assert secret not in repr(config)

    legacy = load(write(tmp_path, '[farm]\ntoken = "token-a"\n'))
    assert [(c.name, c.roles, c.token_sha256) for c in legacy.credentials] == [
        ("shared", {"operator", "trainer", "node", "contributor", "reviewer", "environment"}, SHA_A)]
    assert "token-a" not in repr(legacy) and SHA_A not in repr(legacy)
    monkeypatch.setenv("FARM_TOKEN", "token-b")
    assert [c.token_sha256 for c in load().credentials] == [SHA_B]
    assert load(read_credentials=False).credentials == (), "FARM_TOKEN is a client's own token there"
    assert load().credentials == replace(load()).credentials, "a copied config holds the token's credential once"
    monkeypatch.delenv("FARM_TOKEN")
    assert load().credentials == (), "no credentials: no authentication"
    assert Config(token="token-a").credentials == legacy.credentials


@pytest.mark.parametrize(("tables", "why"), [
    (['name = "a"\nroles = ["admin"]\ntoken_sha256 = "SHA_A"'], r"credential 'a' has no role 'admin'"),
    (['name = "a"\nroles = []\ntoken_sha256 = "SHA_A"'], r"credential 'a' has no roles"),
    (['name = "a"\nroles = "node"\ntoken_sha256 = "SHA_A"'], r"credential 'a': roles is a list"),
    (['name = "a"\nroles = ["node"]\ntoken_sha256 = "SHA_A"', 'name = "a"\nroles = ["node"]\ntoken_sha256 = "SHA_B"'],
     r"two credentials are named 'a'"),
    (['name = "a"\nroles = ["node"]\ntoken_sha256 = "SHA_A"', 'name = "b"\nroles = ["trainer"]\ntoken_sha256 = "SHA_A"'],
     r"credentials 'a' and 'b' hold the same token"),
    (['name = "a"\nroles = ["node"]\ntoken_sha256 = "token-a"'], r"credential 'a': token_sha256 must be 64 hex digits"),
    (['name = "a"\nroles = ["node"]\ntoken_sha256 = "SHA_A0"'], r"token_sha256 must be 64 hex digits"),
    (['name = "a"\nroles = ["node"]'], r"credential 'a' needs its token: token_sha256 .* or token_file"),
    (['name = "a"\nroles = ["node"]\ntoken_sha256 = "SHA_A"\ntoken_file = "/x"'], r"needs its token"),
    (['name = "a"\nroles = ["node"]\ntoken = "token-a"'], r"credential 'a' has no setting 'token'"),
    (['roles = ["node"]\ntoken_sha256 = "SHA_A"'], r"#1 needs a name"),
    (['name = "a b"\nroles = ["node"]\ntoken_sha256 = "SHA_A"'], r"name is 1 to 64 letters"),
    (['name = "a"\nroles = ["node"]\ntoken_file = "/nonexistent/farm.token"'], r"cannot read token_file"),
    (['name = "shared"\nroles = ["node"]\ntoken_sha256 = "SHA_B"\n[farm]\ntoken = "token-a"'],
     r"a credential is named 'shared', the name the token"),
    (['name = "a"\nroles = ["node"]\ntoken_sha256 = "SHA_A"\n[farm]\ntoken = "token-a"'],
     r"credentials 'a' and 'shared' hold the same token"),
])
def test_a_bad_credential_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tables: list[str],
                                           why: str) -> None:
    monkeypatch.delenv("FARM_TOKEN", raising=False)
    text = credential_toml(*tables).replace("SHA_A", SHA_A).replace("SHA_B", SHA_B)
    with pytest.raises(ConfigError, match=why) as raised:
        load(write(tmp_path, text))
    for secret in ("token-a", SHA_A, SHA_B):
        assert secret not in str(raised.value), "an error never quotes a token or its hash"


def test_an_empty_token_file_and_a_list_that_is_no_list_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"credential 'a': token_file .*empty.token is empty"):
        load(write(tmp_path, credential_toml(f'name = "a"\nroles = ["node"]\ntoken_file = "{empty}"')))
    with pytest.raises(ConfigError, match=r"\[\[credentials\]\] tables"):
        load(write(tmp_path, "[credentials]\nname = 'a'\n"))


def test_tls_comes_as_a_certificate_and_its_key(tmp_path: Path) -> None:
    config = load(write(tmp_path, '[tls]\ncert = "s.pem"\nkey = "s.key"\nca = "ca.pem"\n'))
    assert (config.tls_cert, config.tls_key, config.tls_ca) == (Path("s.pem"), Path("s.key"), Path("ca.pem"))
    assert load(write(tmp_path, '[tls]\ncert = "s.pem"\nkey = "s.key"\n'), tls_cert=Path("f.pem")).tls_cert == \
        Path("f.pem"), "a flag over the file"
    assert load().tls_cert is None
    for text, why in [('[tls]\ncert = "s.pem"\n', r"a certificate and its key together"),
                      ('[tls]\nkey = "s.key"\n', r"a certificate and its key together"),
                      ('[tls]\nca = "ca.pem"\n', r"--tls-ca .* needs TLS"),
                      ('[tls]\ncert = "s.pem"\nkey = "s.key"\nclient_ca = "ca.pem"\n', r"\[tls\] has no setting 'client_ca'"),
                      ('[farm]\ntls_cert = "s.pem"\n', r"\[farm\] has no setting 'tls_cert'")]:
        with pytest.raises(ConfigError, match=why):
            load(write(tmp_path, text))
    with pytest.raises(ConfigError, match=r"a certificate and its key together"):
        load(tls_key=Path("s.key"))


@pytest.mark.parametrize("value", ["0", "-3", "true", '"many"', "2.5"])
def test_max_concurrent_calls_is_refused_by_the_config_when_it_is_not_a_count(tmp_path: Path, value: str) -> None:
    # Refused when the config is made (farmctl, farmd's checks, a node), not first when farmd opens its port.
    path = tmp_path / "farm.toml"
    path.write_text(f"[farm]\nmax_concurrent_calls = {value}\n")
    with pytest.raises(ConfigError, match=r"max_concurrent_calls must be a whole number of at least 1, not"):
        load(path)
    with pytest.raises(ConfigError, match="max_concurrent_calls"):
        load(None, max_concurrent_calls=0)
    assert load(None, max_concurrent_calls=1).max_concurrent_calls == 1


def test_the_store_is_sqlite_unless_a_postgresql_address_is_given(tmp_path: Path) -> None:
    assert load().store is None
    toml = tmp_path / "farm.toml"
    toml.write_text('[farm]\nstore = "postgresql://farm@db.example/farm"\n')
    assert load(toml).store == "postgresql://farm@db.example/farm"
    assert load(toml, store="postgres://other@h/db").store == "postgres://other@h/db"  # the flag over the file
    assert "db.example" not in repr(load(toml))  # an address may hold a password
    for wrong in ("mysql://farm@h/db", "farm.db", ""):
        with pytest.raises(ConfigError, match="postgresql://"):
            load(store=wrong)
