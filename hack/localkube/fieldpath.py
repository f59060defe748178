"""Downward-API field paths (``metadata.name``, ``metadata.annotations['k']``, ...) resolved against a pod dict."""

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


def resolve_field_path(pod: dict, field_path: str) -> str:
    """The value a kubelet would project for ``field_path``; missing values are the empty string.

    ``status.podIP`` and ``status.hostIP`` are always ``127.0.0.1`` here (pods are local processes).
    Raises ValueError naming the path when it is not one the downward API supports.
    """
    if field_path in ("status.podIP", "status.hostIP"):
        return "127.0.0.1"
    if field_path in _SIMPLE:
        section, key = _SIMPLE[field_path]
        return str((pod.get(section) or {}).get(key) or "")
    match = _SUBSCRIPT.match(field_path)
    if match:
        return str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = pod["metadata"].get(field_path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    raise ValueError(
        f"fieldRef.fieldPath {field_path!r} is not supported (use metadata.name, "
        "metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], "
        "spec.nodeName, spec.serviceAccountName, status.podIP or status.hostIP)"
    )
