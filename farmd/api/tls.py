"""TLS on farmd's gRPC port, and what a call's TLS says about its caller.

With a certificate and key the API serves TLS; with a CA as well it is mutual TLS, and every
caller, trainers and farmctl included, must present a certificate that CA signed: the handshake of
one that presents none, or one another CA signed, fails before any call is made.

Why everyone, where only nodes need to prove themselves: grpcio offers two modes, not asking for a
client certificate at all (``require_client_auth=False``: a certificate a client has is then never
sent, so a call cannot show one), or requiring and verifying one. The mode between (ask, verify what
is sent, let a client without one in) is gRPC core's but not the Python API's.

``NodeService.Work`` must call ``peer_certificate_ok`` when a CA is configured, and end the call
(PERMISSION_DENIED) when it is False: a port bound without the CA would otherwise let a node in on
its token alone.
"""

from __future__ import annotations

import logging
import ssl
import stat
from pathlib import Path
from typing import Any

import grpc

from farmd.errors import ConfigError

log = logging.getLogger("farmd.api.tls")

_CERT_KEY = "x509_pem_cert"
"""The auth context's property for the peer's certificate, present only when gRPC verified one."""
_COMMON_NAME = "x509_common_name"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None


def _check_pair(cert: Path, key: Path) -> None:
    """Refuse a certificate and key that do not go together (or are not PEM) by name: grpc reports
    only that it could not bind."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=b"")
    except ssl.SSLError as exc:
        raise ConfigError(f"the TLS certificate {cert} and key {key} cannot serve: {exc.reason or exc} (PEM files, "
                          "the key unencrypted and the certificate's own)") from None


def _check_ca(ca: Path) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise ConfigError(f"the TLS CA {ca} holds no usable certificate: {exc.reason or exc}") from None


def server_credentials(cert: Path, key: Path, ca: Path | None) -> grpc.ServerCredentials:
    """TLS with ``cert`` (a PEM chain) and ``key``; with ``ca``, every client must present a
    certificate it signed."""
    chain, private = _read(cert, "certificate"), _read(key, "key")
    roots = _read(ca, "CA") if ca is not None else None
    _check_pair(cert, key)
    if ca is not None:
        _check_ca(ca)
    mode = key.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the TLS key %s is open to others (mode %o): chmod 600 it", key, stat.S_IMODE(mode))
    return grpc.ssl_server_credentials([(private, chain)], root_certificates=roots, require_client_auth=ca is not None)


def add_port(server: grpc.aio.Server, listen: str, cert: Path | None, key: Path | None, ca: Path | None) -> int:
    """Bind ``listen`` with TLS when ``cert`` and ``key`` are given, else in the clear; the port bound
    (0: it could not be). Raises RuntimeError where grpc does."""
    if cert is None or key is None:
        return server.add_insecure_port(listen)
    port = server.add_secure_port(listen, server_credentials(cert, key, ca))
    clients = f"client certificates signed by the CA in {ca} required" if ca else "no client certificates"
    log.info("TLS on %s: %s", listen, clients, extra={"event": "tls", "mutual": ca is not None})
    return port


def peer_certificate_ok(context: Any) -> bool:
    """Whether the call came with a client certificate gRPC verified against the configured CA.

    ``context`` is the call's ``grpc.aio.ServicerContext``. False on a plain port and on one without a
    CA (no certificate is asked for there); on a port with a CA every call that reached a servicer has
    one, so False there means the port was not bound as configured.
    """
    return bool(context.auth_context().get(_CERT_KEY))


def peer_common_name(context: Any) -> str | None:
    """The common name of the call's verified client certificate (a node's name), if it has one."""
    if not peer_certificate_ok(context):
        return None
    names = context.auth_context().get(_COMMON_NAME) or []
    return names[0].decode(errors="replace") if names else None
