"""What a new user meets first, through real farmctl processes: a farmd that cannot be reached says what to
check (nothing listening, a TLS port dialled in the clear, a CA that signed nothing there, a URL for an
address), and progress goes to stderr while results go to stdout."""

from __future__ import annotations

import json
import os

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
