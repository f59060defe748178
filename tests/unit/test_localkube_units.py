"""Pure pieces of the local node agent: field paths, pod IP allocation, probes, $(VAR) expansion, PKI."""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
import time

import pytest
from cryptography import x509

from localkube.containerenv import expand
from localkube.fieldpath import resolve_field_path, with_addresses
from localkube.pki import make_pki
from localkube.podips import HOST_IP, PodIPAllocator, PodIPsExhausted, pool_for_api_port
from localkube.probes import Prober

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
        ("status.podIP", ""),  # no address assigned yet
        ("metadata.labels", 'a="1"'),
    ],
)
def test_field_paths(path, value):
    assert resolve_field_path(POD, path) == value


def test_pod_and_host_ip_resolve_to_the_assigned_address_not_the_api_objects():
    stale = {**POD, "status": {"phase": "Pending", "podIP": "127.9.9.9"}}  # an older object, say
    pod = with_addresses(stale, "127.42.0.7", HOST_IP)
    assert resolve_field_path(pod, "status.podIP") == "127.42.0.7"
    assert resolve_field_path(pod, "status.podIPs") == "127.42.0.7"
    assert resolve_field_path(pod, "status.hostIP") == "127.0.0.1"
    assert pod["status"]["phase"] == "Pending"
    assert stale["status"]["podIP"] == "127.9.9.9", "the pod given is not modified"
    unassigned = with_addresses(POD, None, HOST_IP)
    assert resolve_field_path(unassigned, "status.podIP") == ""
    assert resolve_field_path(unassigned, "status.hostIP") == "127.0.0.1"


def test_pod_ips_are_unique_loopback_addresses_never_the_hosts():
    ips = PodIPAllocator("127.0.0.0/24")  # a block holding 127.0.0.1 itself
    got = [ips.allocate(f"uid-{i}") for i in range(253)]
    assert len(set(got)) == 253
    assert HOST_IP not in got
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/24") for ip in got)
    assert {"127.0.0.0", "127.0.0.255"}.isdisjoint(got), "no network or broadcast address"
    assert ips.allocate("uid-7") == got[7], "a pod keeps its address"
    with pytest.raises(PodIPsExhausted, match="127.0.0.0/24"):
        ips.allocate("one-too-many")


def test_released_pod_ips_are_reused_only_after_every_other_free_one():
    ips = PodIPAllocator("127.42.0.0/29")  # 6 addresses: .1 to .6
    first = [ips.allocate(uid) for uid in "abc"]
    assert first == ["127.42.0.1", "127.42.0.2", "127.42.0.3"]
    ips.release("a")
    ips.release("a")  # idempotent
    assert ips.address_of("a") is None
    assert [ips.allocate(uid) for uid in "def"] == ["127.42.0.4", "127.42.0.5", "127.42.0.6"]
    assert ips.allocate("g") == "127.42.0.1", "the released address, once nothing else is free"
    with pytest.raises(PodIPsExhausted):
        ips.allocate("h")
    assert ips.held() == {f"127.42.0.{n}": uid for n, uid in zip(range(1, 7), "gbcdef", strict=True)}


def test_a_pod_keeps_the_address_it_reports_when_that_is_free():
    ips = PodIPAllocator("127.42.0.0/24")
    assert ips.allocate("a", preferred="127.42.0.77") == "127.42.0.77"
    assert ips.allocate("b", preferred="127.42.0.77") == "127.42.0.1", "held by a: not given twice"
    assert ips.allocate("c", preferred="127.0.0.1") == "127.42.0.2", "never the host's address"
    assert ips.allocate("d", preferred="127.43.0.5") == "127.42.0.3", "outside the block"


@pytest.mark.parametrize("cidr", ["10.0.0.0/24", "127.0.0.1/32", "::1/128", "126.0.0.0/7"])
def test_pod_cidr_must_be_loopback_with_an_address_to_give(cidr):
    with pytest.raises(ValueError, match="pod CIDR"):
        PodIPAllocator(cidr)


def test_default_pod_cidr_differs_per_api_port_and_avoids_the_host():
    blocks = {port: ipaddress.ip_network(pool_for_api_port(port)) for port in (6443, 32768, 32769, 60999, 65535)}
    assert blocks[6443] == ipaddress.ip_network("127.25.43.0/24")
    assert len(set(blocks.values())) == len(blocks)
    assert all(ipaddress.ip_address(HOST_IP) not in block for block in blocks.values())


def _http_server(host: str) -> http.server.HTTPServer:
    server = http.server.HTTPServer((host, 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _verdict(probe: dict, host: str) -> tuple[bool, str]:
    prober = Prober({**probe, "timeoutSeconds": 2}, {"ports": []}, time.monotonic(), False, host)
    return prober.tick(0), prober.last_error


def test_http_and_tcp_probes_target_the_pod_ip_unless_they_set_host():
    pod_server, host_server = _http_server("127.42.0.9"), _http_server("127.0.0.1")
    try:
        pod_port, host_port = pod_server.server_address[1], host_server.server_address[1]
        assert _verdict({"httpGet": {"port": pod_port, "path": "/"}}, "127.42.0.9")[0]
        assert _verdict({"tcpSocket": {"port": pod_port}}, "127.42.0.9")[0]
        # A server on 127.0.0.1 only is not reachable on the pod IP (as in a real pod, where that is its own lo).
        assert not _verdict({"httpGet": {"port": host_port}}, "127.42.0.9")[0]
        assert not _verdict({"tcpSocket": {"port": host_port}}, "127.42.0.9")[0]
        assert _verdict({"httpGet": {"port": host_port, "host": "127.0.0.1"}}, "127.42.0.9")[0]
        assert _verdict({"tcpSocket": {"port": host_port, "host": "127.0.0.1"}}, "127.42.0.9")[0]
    finally:
        pod_server.shutdown()
        host_server.shutdown()


def test_a_process_bound_to_all_addresses_answers_on_any_pod_ip():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        assert _verdict({"tcpSocket": {"port": s.getsockname()[1]}}, "127.42.0.10")[0]


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
