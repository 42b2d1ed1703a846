"""A throwaway PKI for tests, made with the ``openssl`` command: a CA, a server certificate for
127.0.0.1 and a client certificate it signed, and a second CA (with a client of its own) that farmd
does not trust.

    pki = make_pki(tmp_path)
    running_farm("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca))
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
_DAYS = "2"
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
"""P-256: a key in milliseconds, where RSA takes tens of them."""


@dataclass(frozen=True)
class Pki:
    """Paths of PEM files. ``client_*`` is signed by ``ca``; ``other_client_*`` by ``other_ca``."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    proc = subprocess.run([OPENSSL, *map(str, args)], cwd=cwd, capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"openssl {' '.join(map(str, args))} exited {proc.returncode}: {proc.stderr[-2000:]!r}")


def _ca(dir: Path, name: str) -> tuple[Path, Path]:
    cert, key = dir / f"{name}.pem", dir / f"{name}.key"
    _openssl("req", "-x509", *_KEY, "-keyout", key, "-out", cert, "-days", _DAYS, "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=dir)
    return cert, key


def _leaf(dir: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    """A key and a certificate for ``name``, signed by ``ca`` (cert, key), with ``extensions`` (x509v3 lines)."""
    cert, key, csr, ext = (dir / f"{name}.pem", dir / f"{name}.key", dir / f"{name}.csr", dir / f"{name}.ext")
    ext.write_text(extensions)
    _openssl("req", "-new", *_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=dir)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", cert,
             "-days", _DAYS, "-extfile", ext, cwd=dir)
    return cert, key


def make_pki(dir: Path) -> Pki:
    """Make the PKI in ``dir`` (created if need be); keys are 0600."""
    dir.mkdir(parents=True, exist_ok=True)
    ca, other = _ca(dir, "farm-ca"), _ca(dir, "other-ca")
    server = _leaf(dir, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    client = _leaf(dir, "node-1", ca, "extendedKeyUsage=clientAuth\n")
    stranger = _leaf(dir, "stranger", other, "extendedKeyUsage=clientAuth\n")
    for key in dir.glob("*.key"):
        key.chmod(0o600)
    return Pki(ca=ca[0], server_cert=server[0], server_key=server[1], client_cert=client[0], client_key=client[1],
               other_ca=other[0], other_client_cert=stranger[0], other_client_key=stranger[1])
