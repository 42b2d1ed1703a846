"""TLS on farmd's port, with a PKI made by ``openssl`` (``tests.tlsutil``): a client that trusts the CA
talks, one in the clear or trusting another CA does not; with ``--tls-ca`` every caller shows a
certificate that CA signed, and ``peer_certificate_ok`` says which calls did."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from farm_client import FarmClient

from farmd.api.tls import add_port, peer_certificate_ok, peer_common_name, server_credentials
from farmd.errors import ConfigError
from tests.tlsutil import Pki, make_pki

TOKEN = "tls-test-token"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No FARM_* variable of the caller's reaches a client here; the environment for farmctl."""
    for name in [n for n in os.environ if n.startswith("FARM_")]:
        monkeypatch.delenv(name)
    return dict(os.environ)


def status_code(addr: str, **tls: Any) -> grpc.StatusCode:
    """OK when a client with ``tls`` reaches farmd's status, else the code it fails with."""
    try:
        with FarmClient(addr, token=TOKEN, timeout_s=5, **tls) as client:
            client.status()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_a_client_that_trusts_the_ca_talks_tls(running_farm, pki: Pki, clean_env: dict[str, str],  # type: ignore[no-untyped-def]
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    farm = running_farm("--workers", "0", "--token", TOKEN, "--tls-cert", str(pki.server_cert),
                        "--tls-key", str(pki.server_key))
    assert status_code(farm.addr, tls_ca=pki.ca) == grpc.StatusCode.OK
    assert status_code(farm.addr, tls_ca=pki.ca.read_bytes()) == grpc.StatusCode.OK
    assert status_code(farm.addr, tls_ca=pki.ca.read_text()) == grpc.StatusCode.OK
    assert status_code(farm.addr) == grpc.StatusCode.UNAVAILABLE, "in the clear"
    assert status_code(farm.addr, tls_ca=pki.other_ca) == grpc.StatusCode.UNAVAILABLE, "a CA that signed nothing here"
    # The certificate names 127.0.0.1 and localhost: the name checked may be set, and is checked.
    assert status_code(farm.addr, tls_ca=pki.ca, tls_server_name="localhost") == grpc.StatusCode.OK
    assert status_code(farm.addr, tls_ca=pki.ca, tls_server_name="farm.example") == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as raised, FarmClient(farm.addr, tls_ca=pki.ca) as client:
        client.status()  # TLS is not authentication: still no token, still refused
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED

    monkeypatch.setenv("FARM_TLS_CA", str(pki.ca))
    assert status_code(farm.addr) == grpc.StatusCode.OK, "the CA from FARM_TLS_CA"
    shown = farm.farmctl("--token", TOKEN, "--tls-ca", str(pki.ca), "status", "--json", env=clean_env)
    assert json.loads(shown.stdout)["workers"] == 0
    plain = farm.farmctl("--token", TOKEN, "status", "--json", env=clean_env, check=False)
    assert json.loads(plain.stdout)["error"]["code"] == "UNAVAILABLE"
    assert "TLS on" in farm.log.read_text()


def test_with_a_ca_every_caller_shows_a_certificate_it_signed(running_farm, pki: Pki,  # type: ignore[no-untyped-def]
                                                               clean_env: dict[str, str]) -> None:
    farm = running_farm("--workers", "0", "--token", TOKEN, "--tls-cert", str(pki.server_cert),
                        "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca))
    signed = {"tls_ca": pki.ca, "tls_cert": pki.client_cert, "tls_key": pki.client_key}
    assert status_code(farm.addr, **signed) == grpc.StatusCode.OK
    assert status_code(farm.addr, tls_ca=pki.ca) == grpc.StatusCode.UNAVAILABLE, "no client certificate"
    stranger = {"tls_ca": pki.ca, "tls_cert": pki.other_client_cert, "tls_key": pki.other_client_key}
    assert status_code(farm.addr, **stranger) == grpc.StatusCode.UNAVAILABLE, "one another CA signed"
    shown = farm.farmctl("--token", TOKEN, "--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert),
                         "--tls-key", str(pki.client_key), "status", "--json", env=clean_env)
    assert json.loads(shown.stdout)["workers"] == 0
    env = {**clean_env, "FARM_TLS_CA": str(pki.ca), "FARM_TLS_CERT": str(pki.client_cert),
           "FARM_TLS_KEY": str(pki.client_key), "FARM_TOKEN": TOKEN}
    assert json.loads(farm.farmctl("status", "--json", env=env).stdout)["workers"] == 0
    half = farm.farmctl("--tls-cert", str(pki.client_cert), "status", "--json", env=clean_env, check=False)
    assert half.returncode == 2 and "--tls-key" in json.loads(half.stdout)["error"]["message"]


async def _peer(pki: Pki, ca: Path | None, tls: bool, **client: Path) -> tuple[bool, str | None]:
    """What ``peer_certificate_ok`` and ``peer_common_name`` say of one call from a client with
    ``client``'s TLS files, to a port bound as ``add_port`` binds farmd's."""
    seen: list[tuple[bool, str | None]] = []

    async def answer(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        seen.append((peer_certificate_ok(context), peer_common_name(context)))
        return b""

    class Any_(grpc.GenericRpcHandler):  # type: ignore[type-arg]
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.stream_unary_rpc_method_handler(answer)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Any_(),))
    cert, key = (pki.server_cert, pki.server_key) if tls else (None, None)
    port = add_port(server, "127.0.0.1:0", cert, key, ca)
    await server.start()
    try:
        files = {name: path.read_bytes() for name, path in client.items()}
        addr = f"127.0.0.1:{port}"

        def call() -> None:
            channel = (grpc.secure_channel(addr, grpc.ssl_channel_credentials(**files)) if files
                       else grpc.insecure_channel(addr))
            with channel:
                channel.stream_unary("/t.T/Call")(iter([b""]), timeout=5)

        await asyncio.to_thread(call)
    finally:
        await server.stop(0)
    return seen[0]


async def test_peer_certificate_ok_says_which_calls_showed_a_signed_certificate(pki: Pki) -> None:
    signed = {"root_certificates": pki.ca, "certificate_chain": pki.client_cert, "private_key": pki.client_key}
    assert await _peer(pki, pki.ca, True, **signed) == (True, "node-1")
    # Without a CA no certificate is asked for, so one a client has is never sent.
    assert await _peer(pki, None, True, **signed) == (False, None)
    assert await _peer(pki, None, True, root_certificates=pki.ca) == (False, None)
    assert await _peer(pki, None, False) == (False, None)


def test_a_certificate_and_key_that_do_not_belong_together_are_refused_by_name(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"server.pem and key .*node-1.key cannot serve"):
        server_credentials(pki.server_cert, pki.client_key, None)
    with pytest.raises(ConfigError, match=r"CA .*server.key holds no usable certificate"):
        server_credentials(pki.server_cert, pki.server_key, pki.server_key)
    with pytest.raises(ConfigError, match=r"cannot read the TLS key"):
        server_credentials(pki.server_cert, pki.server_key.with_name("missing.key"), None)
