"""Pure pieces of the local node agent: field paths, $(VAR) expansion, PKI."""

from __future__ import annotations

import pytest
from cryptography import x509

from localkube.containerenv import expand
from localkube.fieldpath import resolve_field_path
from localkube.pki import make_pki

pytestmark = pytest.mark.unit

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"a": "1"}, "annotations": {"x/y": "z"}},
    "spec": {"nodeName": "localnode", "serviceAccountName": "sa"},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("metadata.labels['a']", "1"),
        ("metadata.annotations['x/y']", "z"),
        ("metadata.annotations['missing']", ""),
        ("spec.nodeName", "localnode"),
        ("status.podIP", "127.0.0.1"),
        ("metadata.labels", 'a="1"'),
    ],
)
def test_field_paths(path, value):
    assert resolve_field_path(POD, path) == value


def test_unknown_field_path_names_the_path():
    with pytest.raises(ValueError, match="spec.bogus"):
        resolve_field_path(POD, "spec.bogus")


@pytest.mark.parametrize(
    ("raw", "expanded"),
    [
        ("$(A)-x", "1-x"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("plain", "plain"),
        ("$(A)$(B)", "12"),
    ],
)
def test_dollar_expansion_follows_kubernetes_rules(raw, expanded):
    assert expand(raw, {"A": "1", "B": "2"}) == expanded


def test_pki_serving_certificate_covers_loopback_and_service_names(tmp_path):
    pki = make_pki(tmp_path)
    cert = x509.load_pem_x509_certificate((tmp_path / "apiserver.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.1"}
    admin = x509.load_pem_x509_certificate((tmp_path / "admin.crt").read_bytes())
    assert "O=system:masters" in admin.subject.rfc4514_string()
    assert pki.ca_crt.endswith("ca.crt")
    assert oct((tmp_path / "sa.key").stat().st_mode & 0o777) == "0o600"
