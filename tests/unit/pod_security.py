"""An offline reading of the Pod Security Standard "restricted" (baseline included) for the pods the operator builds.

Each check follows one check of the apiserver's PodSecurity admission (``k8s.io/pod-security-admission/policy``,
``check_*.go``, Kubernetes 1.34) for the fields these pods can carry; the cluster tier
(tests/cluster/test_pod_security.py) confirms the verdicts on a real kube-apiserver. Returns one message per
failed check, naming the check's ID, so a test can assert ``== []`` or on the one expected violation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESTRICTED_VOLUME_SOURCES", "restricted_violations"]

RESTRICTED_VOLUME_SOURCES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
"""check_restrictedVolumes.go: the only volume sources "restricted" allows (hostPath is not one)."""
ALLOWED_SECCOMP = ("RuntimeDefault", "Localhost")


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for kind in ("initContainers", "containers", "ephemeralContainers") for c in pod_spec.get(kind) or []]


def _pod_or_every_container(pod_spec: dict[str, Any], ok) -> list[str]:
    """Names of the containers that fail ``ok`` on their own securityContext, when the pod-level one does not
    cover them. ``ok(value)`` returns True (good), False (explicitly bad) or None (unset)."""
    pod_verdict = ok(pod_spec.get("securityContext") or {})
    bad = ["pod"] if pod_verdict is False else []
    for c in _containers(pod_spec):
        verdict = ok(c.get("securityContext") or {})
        if verdict is False or (verdict is None and pod_verdict is not True):
            bad.append(c["name"])
    return bad


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The "restricted" checks ``pod`` (a Pod manifest) fails, as ``"<check id>: <detail>"``; empty when it passes."""
    spec = pod["spec"]
    out: list[str] = []
    # baseline: host namespaces, privileged, hostPath, host ports
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"hostNamespaces: {field}=true")
    for c in _containers(spec):
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged"):
            out.append(f"privileged: container {c['name']!r}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"hostPorts: container {c['name']!r}")
        if ctx.get("procMount") not in (None, "Default"):
            out.append(f"procMount: container {c['name']!r}")
    # restricted: volume types (hostPath included)
    bad_volumes = [v["name"] for v in spec.get("volumes") or [] if not (set(v) - {"name"}) <= RESTRICTED_VOLUME_SOURCES]
    if bad_volumes:
        out.append(f"restrictedVolumes: volumes {bad_volumes} have restricted types")
    # restricted: allowPrivilegeEscalation must be explicitly false on every container
    escalating = [
        c["name"]
        for c in _containers(spec)
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if escalating:
        out.append(f"allowPrivilegeEscalation: containers {escalating} must set it to false")
    # restricted: runAsNonRoot true (pod, or every container), never false
    non_root = _pod_or_every_container(spec, lambda ctx: ctx.get("runAsNonRoot"))
    if non_root:
        out.append(f"runAsNonRoot: {non_root} must set runAsNonRoot=true")
    # restricted: runAsUser never 0
    root_users = [
        name
        for name, ctx in [("pod", spec.get("securityContext") or {})]
        + [(c["name"], c.get("securityContext") or {}) for c in _containers(spec)]
        if ctx.get("runAsUser") == 0
    ]
    if root_users:
        out.append(f"runAsUser: {root_users} must not set runAsUser=0")
    # restricted: seccompProfile RuntimeDefault or Localhost (pod, or every container)
    seccomp = _pod_or_every_container(
        spec, lambda ctx: ctx["seccompProfile"].get("type") in ALLOWED_SECCOMP if "seccompProfile" in ctx else None
    )
    if seccomp:
        out.append(f"seccompProfile: {seccomp} must set RuntimeDefault or Localhost")
    # restricted: capabilities drop ALL, add nothing but NET_BIND_SERVICE
    for c in _containers(spec):
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"capabilities_restricted: container {c['name']!r} must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"capabilities_restricted: container {c['name']!r} adds {caps['add']}")
    return out
