"""TLS material for a test server: a CA, a server and a client certificate, made with
``openssl``."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TLSFiles:
    """PEM files from make_tls_files(): a CA, a server pair it signed, a client pair it signed."""

    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = django-redislua test

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def make_tls_files(directory: str | Path) -> TLSFiles:
    """Create, with ``openssl``, a throwaway CA and a server and a client certificate it signed.

    The server certificate names ``IP:127.0.0.1`` and ``DNS:localhost``, so clients verify it
    with hostname checking on, as they do in production. Keys are EC P-256 (generated in
    milliseconds) and certificates are valid for two days: long enough for a test run, useless
    if they leak. The extensions (critical basicConstraints, key identifiers) are those that
    strict verifiers (Python 3.13's default ``VERIFY_X509_STRICT``) insist on. Only the PEM
    files listed in TLSFiles are left in ``directory``.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "make_tls_files() needs the openssl command line tool: apt-get install openssl"
        )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)

    def run(*args: str) -> None:
        done = subprocess.run(
            [openssl, *args], cwd=folder, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"openssl {args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )

    def new_key(name: str) -> str:
        path = str(folder / f"{name}.key")
        run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-out", path)
        return path

    def signed(name: str, common_name: str, extensions: str) -> tuple[str, str]:
        key = new_key(name)
        csr, cert = str(folder / f"{name}.csr"), str(folder / f"{name}.crt")
        run("req", "-new", "-key", key, "-subj", f"/CN={common_name}", "-config", str(config),
            "-out", csr)
        run("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
            "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2",
            "-extfile", str(config), "-extensions", extensions, "-out", cert)
        Path(csr).unlink()
        return cert, key

    try:
        ca_key = new_key("ca")
        ca_cert = str(folder / "ca.crt")
        run("req", "-new", "-x509", "-key", ca_key, "-subj", "/CN=django-redislua test CA",
            "-days", "2", "-config", str(config), "-extensions", "ca_ext", "-out", ca_cert)
        server_cert, server_key = signed("server", "localhost", "server_ext")
        client_cert, client_key = signed("client", "django-redislua test client", "client_ext")
    finally:
        config.unlink(missing_ok=True)
    return TLSFiles(
        ca_cert=ca_cert,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
    )
