"""The local cluster's DNS stand-in (test infrastructure): Service names resolved through each pod's /etc/hosts.

A real cluster resolves ``<service>.<namespace>.svc[.cluster.local]`` with its DNS add-on; for a headless
Service (``clusterIP: None``) the answer is the addresses of the Service's endpoints. The local control plane has
no DNS server and no kube-proxy, so the node agent keeps one hosts file with those names instead:

- it watches the EndpointSlices of every namespace (label ``kubernetes.io/service-name``) and maps each Service's
  names to the addresses of its endpoints that are ready or serving, as cluster DNS does (a Service with
  ``publishNotReadyAddresses`` has every endpoint ready);
- the file starts with the machine's own ``/etc/hosts`` (``localhost`` and the host's name keep resolving), then
  one line per address: ``<ip> <svc>.<ns>.svc.cluster.local <svc>.<ns>.svc <svc>.<ns>``;
- every container of a pod that is not ``hostNetwork`` sees it at ``/etc/hosts`` (a read-only bind mount, see
  :mod:`localkube.podworker`); it is rewritten in place, so a running process sees each change.

Only names of Services with endpoints on loopback pod addresses are useful locally; a ClusterIP Service's port
mapping (``port`` != ``targetPort``) has no stand-in: clients reach the endpoints' own ports.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from kubernetes import client, watch

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
CLUSTER_DOMAIN = "cluster.local"


def log(message: str) -> None:
    print(f"[cluster-dns {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def slice_addresses(endpoint_slice: dict) -> list[str]:
    """The addresses of an EndpointSlice's endpoints that are ready or serving (unknown counts as ready)."""
    out: list[str] = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False and not conditions.get("serving"):
            continue
        out.extend(endpoint.get("addresses") or [])
    return out


def render_hosts(base: str, services: dict[tuple[str, str], list[str]]) -> str:
    """The hosts file: ``base`` (the machine's own), then each Service's names per address, sorted."""
    lines = [base.rstrip("\n"), "# Services (localkube cluster DNS stand-in)"]
    for (namespace, name), addresses in sorted(services.items()):
        names = f"{name}.{namespace}.svc.{CLUSTER_DOMAIN} {name}.{namespace}.svc {name}.{namespace}"
        lines.extend(f"{address} {names}" for address in sorted(set(addresses)))
    return "\n".join(lines) + "\n"


class ClusterHosts:
    """Keeps ``path`` up to date with the Services' endpoints (run :meth:`loop` in a thread)."""

    def __init__(self, api: client.ApiClient, path: Path, base_hosts: Path = Path("/etc/hosts")) -> None:
        self.api = api
        self.discovery = client.DiscoveryV1Api(api)
        self.path = path
        self.base = base_hosts.read_text() if base_hosts.is_file() else "127.0.0.1 localhost\n::1 localhost\n"
        self.slices: dict[tuple[str, str], dict] = {}
        self._lock = threading.Lock()
        self._write()

    def _services(self) -> dict[tuple[str, str], list[str]]:
        services: dict[tuple[str, str], list[str]] = {}
        for (namespace, _), endpoint_slice in self.slices.items():
            service = ((endpoint_slice.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL)
            if service:
                services.setdefault((namespace, service), []).extend(slice_addresses(endpoint_slice))
        return {k: v for k, v in services.items() if v}

    def _write(self) -> None:
        text = render_hosts(self.base, self._services())
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # in place: containers bind-mount this inode, so a rename would leave them the old file
            with open(self.path, "a+", encoding="utf-8") as fh:
                fh.seek(0)
                if fh.read() == text:
                    return
                fh.seek(0)
                fh.truncate()
                fh.write(text)

    def apply(self, event_type: str, endpoint_slice: dict) -> None:
        meta = endpoint_slice["metadata"]
        key = (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self.slices.pop(key, None)
        else:
            self.slices[key] = endpoint_slice
        self._write()

    def loop(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                listing = self.discovery.list_endpoint_slice_for_all_namespaces()
                self.slices = {
                    (s["metadata"]["namespace"], s["metadata"]["name"]): s
                    for s in (self.api.sanitize_for_serialization(i) for i in listing.items)
                }
                self._write()
                stream = watch.Watch().stream(
                    self.discovery.list_endpoint_slice_for_all_namespaces,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=60,
                )
                for event in stream:
                    if stopping.is_set():
                        break
                    self.apply(event["type"], self.api.sanitize_for_serialization(event["object"]))
            except Exception as e:  # noqa: BLE001 - relist and go on
                if not stopping.is_set():
                    log(f"endpoint slice watch: {e!r}; relisting")
                    time.sleep(1)
