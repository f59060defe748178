"""Downward-API field paths (``metadata.name``, ``metadata.annotations['k']``, ...) resolved against a pod dict.

``status.podIP`` (and ``status.podIPs``) and ``status.hostIP`` are read from the pod dict like every other field.
The node agent resolves them against :func:`with_addresses` of the pod: the pod's own loopback address (assigned
by :mod:`localkube.podips` before its containers start, so before the API object shows it) and the node's
``127.0.0.1``.
"""

from __future__ import annotations

import re

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")

_SIMPLE = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "metadata.uid": ("metadata", "uid"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "status.hostIP": ("status", "hostIP"),
    "status.podIP": ("status", "podIP"),
}


def with_addresses(pod: dict, pod_ip: str | None, host_ip: str) -> dict:
    """``pod`` as the downward API sees it on this node: a shallow copy whose status holds ``hostIP`` and, once the
    pod has one, its ``podIP``/``podIPs`` (whatever the API object says so far). ``pod`` is not modified."""
    status = {**(pod.get("status") or {}), "hostIP": host_ip}
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return {**pod, "status": status}


def resolve_field_path(pod: dict, field_path: str) -> str:
    """The value a kubelet would project for ``field_path``; missing values are the empty string.

    ``status.podIPs`` is the comma-separated list of the pod's addresses (one here: the pod is IPv4 only).
    Raises ValueError naming the path when it is not one the downward API supports.
    """
    if field_path in _SIMPLE:
        section, key = _SIMPLE[field_path]
        return str((pod.get(section) or {}).get(key) or "")
    if field_path == "status.podIPs":
        return ",".join(str(entry.get("ip", "")) for entry in (pod.get("status") or {}).get("podIPs") or [])
    match = _SUBSCRIPT.match(field_path)
    if match:
        return str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = pod["metadata"].get(field_path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    raise ValueError(
        f"fieldRef.fieldPath {field_path!r} is not supported (use metadata.name, "
        "metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], "
        "spec.nodeName, spec.serviceAccountName, status.podIP, status.podIPs or status.hostIP)"
    )
