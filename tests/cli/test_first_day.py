"""What a new user meets first, through real farmctl processes: a farmd that cannot be reached says what to
check (nothing listening, a TLS port dialled in the clear, a CA that signed nothing there, a URL for an
address), progress goes to stderr while results go to stdout, and a new token's stanza goes into farm.toml as
it is printed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib

import pytest

from tests.conftest import farmctl
from tests.tlsutil import make_pki

pytestmark = pytest.mark.sandbox


@pytest.fixture
def clean_env() -> dict[str, str]:
    """No FARM_* variable of the caller's (a token, a CA) reaches farmctl."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}


def error_of(*args: str, env: dict[str, str]) -> str:
    done = farmctl(*args, "status", check=False, env=env)
    assert done.returncode != 0 and done.stdout == b""
    return done.stderr.decode()


def test_an_unreachable_farmd_says_what_to_check(running_farm, tmp_path, clean_env) -> None:  # type: ignore[no-untyped-def]
    pki = make_pki(tmp_path / "pki")
    farm = running_farm("--workers", "0", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))

    nothing = "127.0.0.1:1"  # as the other tests of a farmd that is not there
    assert "is farmd running there?" in error_of("--addr", nothing, env=clean_env)
    plain = error_of("--addr", farm.addr, env=clean_env)
    assert "UNAVAILABLE" in plain and "pass --tls-ca" in plain, plain
    wrong_ca = error_of("--addr", farm.addr, "--tls-ca", str(pki.other_ca), env=clean_env)
    assert "not signed by the CA given in --tls-ca" in wrong_ca, wrong_ca
    assert farmctl("--addr", farm.addr, "--tls-ca", str(pki.ca), "status", env=clean_env).returncode == 0

    for url in (f"http://{farm.addr}", f"https://{farm.addr}", f"grpc://{farm.addr}"):
        refused = farmctl("--addr", url, "status", "--json", check=False, env=clean_env)
        error = json.loads(refused.stdout)["error"]
        assert refused.returncode != 0 and "give HOST[:PORT]" in error["message"] and "lookup" not in error["message"]


def test_progress_goes_to_stderr_and_results_to_stdout(running_farm) -> None:  # type: ignore[no-untyped-def]
    farm = running_farm("--workers", "2")
    done = farm.farmctl("run", "--env", "arith", "--agent", "reference", "--rollouts", "4", "--group-size", "2",
                        "--wait")
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run ") and "4 done (4 passed), 0 failed" in lines[0], lines
    assert "rollouts" in done.stderr.decode(), "the bar, on stderr"


def test_a_failed_run_says_why_wherever_it_is_read(running_farm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every rollout of a run fails (its model endpoint refuses connections): the cause travels with the run
    (a google.rpc.Status), run --wait prints it on stderr, runs show and status show it."""
    config = tmp_path / "farm.toml"
    config.write_text('[scheduler]\nmax_attempts = 2\nretry_backoff_s = 0.0\n\n'
                      '[endpoints.gone]\nurl = "http://127.0.0.1:1/v1"\n')
    farm = running_farm("--workers", "1", "--config", str(config))
    done = farm.farmctl("run", "--env", "rg:chain_sum", "--agent", "openai:m@gone", "--rollouts", "2", "--wait",
                        check=False)
    assert done.returncode == 1 and "2 failed" in done.stdout.decode()
    said = done.stderr.decode()
    assert "last error: UNAVAILABLE INFRASTRUCTURE:" in said and "http://127.0.0.1:1/v1" in said and "connect" in said, said

    (run,) = json.loads(farm.farmctl("runs", "list", "--json").stdout)
    assert run["state"] == "failed" and run["last_error"]["code"] == "UNAVAILABLE"
    assert run["last_error"]["reason"] == "INFRASTRUCTURE" and "127.0.0.1:1" in run["last_error"]["message"]
    assert "last error: UNAVAILABLE INFRASTRUCTURE" in farm.farmctl("runs", "show", str(run["id"])).stdout.decode()

    status = json.loads(farm.farmctl("status", "--json").stdout)
    failures = status["recent_failures"]
    assert len(failures) == 4 and {f["run_id"] for f in failures} == {run["id"]}, "2 jobs, 2 attempts each"
    assert sum(f["final"] for f in failures) == 2 and all(f["error"]["code"] == "UNAVAILABLE" for f in failures)
    assert "latest job failures" in farm.farmctl("status").stdout.decode()

    ok = farm.farmctl("run", "--env", "arith", "--agent", "reference", "--rollouts", "2", "--wait", "--json")
    assert json.loads(ok.stdout)["last_error"] is None, "a run none of whose jobs failed has none"


def test_a_new_tokens_stanza_appends_to_farm_toml_as_it_is(running_farm, tmp_path, clean_env) -> None:  # type: ignore[no-untyped-def]
    """`farmctl token new --out F >> farm.toml`, the README's way: stdout is the stanza alone, so farmd starts on the
    file it made and the token lets its holder in; without --out, the token is on stderr, never in the TOML."""
    config = tmp_path / "farm.toml"
    config.write_text("[scheduler]\nmax_attempts = 2\n\n")
    made = farmctl("token", "new", "--name", "tess", "--role", "trainer", "--out", str(tmp_path / "tess.token"),
                   env=clean_env)
    with config.open("ab") as toml:
        toml.write(made.stdout)
    assert made.stdout.startswith(b"[[credentials]]") and b"tess.token" in made.stderr
    loaded = tomllib.loads(config.read_text())
    assert [c["name"] for c in loaded["credentials"]] == ["tess"] and loaded["scheduler"]["max_attempts"] == 2

    shown = farmctl("token", "new", "--name", "ops", "--role", "operator", env=clean_env)
    (token,) = re.findall(r"token: (\S+)", shown.stderr.decode())
    assert token.encode() not in shown.stdout, "the secret is not in what >> appends"
    stanza = tomllib.loads(shown.stdout.decode())["credentials"][0]
    assert stanza["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()

    farm = running_farm("--workers", "0", "--config", str(config))
    status = farmctl("--addr", farm.addr, "--token-file", str(tmp_path / "tess.token"), "status", "--json",
                     env=clean_env)
    assert json.loads(status.stdout)["version"]
    assert farmctl("--addr", farm.addr, "status", check=False, env=clean_env).returncode != 0, "and none without it"
