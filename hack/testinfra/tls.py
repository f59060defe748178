"""A throwaway certificate authority for the test bed: a CA, a server certificate for 127.0.0.1 and localhost, and
a client certificate, as PEM files (private keys unencrypted PKCS#8, which Kafka's PEM key stores take).

:func:`make_tls` writes them under a directory once and returns their paths; nothing here is fit for production
(short keys, no revocation, a CA key on disk).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsFiles", "make_tls"]


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    """The CA certificate (PEM): what clients trust."""
    server: Path
    """The server's private key and certificate chain in one PEM file (Kafka ``ssl.keystore.type=PEM``)."""
    client_cert: Path
    client_key: Path

    def text(self, path: Path) -> str:
        return path.read_text()


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, sans=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def make_tls(directory: str | Path) -> TlsFiles:
    """Write (once) and return the test bed's CA, server and client PEM files under ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    directory = Path(directory)
    files = TlsFiles(directory / "ca.crt", directory / "server.pem", directory / "client.crt", directory / "client.key")
    if all(p.exists() for p in (files.ca, files.server, files.client_cert, files.client_key)):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _cert("taskshard-test-ca", ca_key, None, None, ca=True)
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM)  # noqa: E731
    server_key = _key()
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _cert("127.0.0.1", server_key, ca.subject, ca_key, ca=False, sans=sans)
    client_key = _key()
    client = _cert("taskshard-test-client", client_key, ca.subject, ca_key, ca=False)
    files.ca.write_bytes(pem(ca))
    files.server.write_bytes(_pem_key(server_key) + pem(server) + pem(ca))
    files.client_cert.write_bytes(pem(client) + pem(ca))
    files.client_key.write_bytes(_pem_key(client_key))
    return files
