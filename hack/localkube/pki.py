"""Certificates and keys for the local control plane.

One call, :func:`make_pki`, writes a fresh certificate authority and everything signed by it into a directory:

- ``ca.crt`` / ``ca.key``: the cluster CA (also the client CA of the apiserver).
- ``apiserver.crt`` / ``apiserver.key``: the serving certificate, valid for 127.0.0.1, localhost and the
  in-cluster names of the ``kubernetes`` Service.
- ``admin.crt`` / ``admin.key``: a client certificate in group ``system:masters`` (cluster admin).
- ``sa.key`` / ``sa.pub``: the service-account token signing key pair.

:func:`issue_client_cert` signs one more client certificate with that CA (a kubelet's ``system:node:<name>``).

Every file is new on each call: a cluster run never trusts the keys of another run.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_IP = "10.0.0.1"
SERVING_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pki:
    """Paths of the files written by :func:`make_pki`."""

    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def ca_crt(self) -> str:
        return self.path("ca.crt")


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _issue(subject, public_key, issuer, issuer_key, *, ca=False, server=False, client=False, sans=()):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, cert) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(directory: Path) -> Pki:
    """Write a fresh CA, serving and admin certificates and the service-account key pair into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("taskshard-localkube-ca")
    ca_cert = _issue(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    _write_key(directory / "ca.key", ca_key)
    _write_cert(directory / "ca.crt", ca_cert)

    sans = [x509.DNSName(n) for n in SERVING_NAMES] + [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(SERVICE_IP)),
    ]
    for stem, subject, kwargs in (
        ("apiserver", _name("kube-apiserver"), {"server": True, "sans": sans}),
        ("admin", _name("admin", "system:masters"), {"client": True}),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(subject, key.public_key(), ca_name, ca_key, **kwargs)
        _write_key(directory / f"{stem}.key", key)
        _write_cert(directory / f"{stem}.crt", cert)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return Pki(directory)


def issue_client_cert(pki: Pki, stem: str, common_name: str, organization: str | None = None) -> tuple[str, str]:
    """Sign a client certificate for ``common_name`` (in group ``organization``) with the cluster CA.

    Writes ``<stem>.crt`` and ``<stem>.key`` next to the CA and returns their paths.
    """
    ca_key = serialization.load_pem_private_key(Path(pki.path("ca.key")).read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(Path(pki.ca_crt).read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name(common_name, organization), key.public_key(), ca_cert.subject, ca_key, client=True)
    _write_key(pki.dir / f"{stem}.key", key)
    _write_cert(pki.dir / f"{stem}.crt", cert)
    return pki.path(f"{stem}.crt"), pki.path(f"{stem}.key")
