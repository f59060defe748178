"""A container's environment, resolved the way a kubelet resolves it.

Order (later wins): the agent's base variables (``PATH``, ``LANG``, ``JAVA_HOME``, ``HOME``, the in-cluster
``KUBERNETES_SERVICE_*`` variables and, when the pod mounts a service-account token, ``KUBECONFIG`` for that
account), then ``envFrom`` (configMapRef, secretRef, with prefix), then ``env`` in order. ``env`` values may
reference earlier variables as ``$(NAME)``; ``$$`` escapes a dollar sign. ``valueFrom`` supports fieldRef,
configMapKeyRef and secretKeyRef (honouring ``optional``). The agent's own environment, and its admin
credentials, never leak into a pod.
"""

from __future__ import annotations

import base64
import os
import re

from kubernetes.client.exceptions import ApiException

from .fieldpath import resolve_field_path

PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "TZ", "JAVA_HOME", "PYTHONDONTWRITEBYTECODE")
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class EnvError(RuntimeError):
    """A referenced configMap/secret/key is missing and not optional; the message names it."""


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, unknown ones are left as written."""

    def repl(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REF.sub(repl, value)


class EnvResolver:
    def __init__(self, core, pod: dict, base: dict[str, str]) -> None:
        self.core = core
        self.pod = pod
        self.base = base
        self._cache: dict[tuple[str, str], dict[str, str] | None] = {}

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    def _source(self, kind: str, name: str) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self._cache:
            try:
                if kind == "configMap":
                    self._cache[key] = dict(self.core.read_namespaced_config_map(name, self.namespace).data or {})
                else:
                    data = self.core.read_namespaced_secret(name, self.namespace).data or {}
                    self._cache[key] = {k: base64.b64decode(v).decode() for k, v in data.items()}
            except ApiException as e:
                if e.status != 404:
                    raise
                self._cache[key] = None
        return self._cache[key]

    def _key_ref(self, kind: str, ref: dict, var: str) -> str | None:
        data = self._source(kind, ref["name"])
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            what = "configMap" if kind == "configMap" else "secret"
            missing = f"{what} {ref['name']!r}" if data is None else f"key {ref['key']!r} in {what} {ref['name']!r}"
            raise EnvError(f"env {var}: {missing} not found")
        return data[ref["key"]]

    def resolve(self, container: dict) -> dict[str, str]:
        env = dict(self.base)
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, field in (("configMap", "configMapRef"), ("secret", "secretRef")):
                if field in source:
                    data = self._source(kind, source[field]["name"])
                    if data is None and not source[field].get("optional"):
                        raise EnvError(f"envFrom: {kind} {source[field]['name']!r} not found")
                    env.update({prefix + k: v for k, v in (data or {}).items()})
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" not in var:
                env[name] = expand(var.get("value", ""), env)
                continue
            value_from = var["valueFrom"]
            if "fieldRef" in value_from:
                value = resolve_field_path(self.pod, value_from["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in value_from:
                value = self._key_ref("configMap", value_from["configMapKeyRef"], name)
            elif "secretKeyRef" in value_from:
                value = self._key_ref("secret", value_from["secretKeyRef"], name)
            elif "resourceFieldRef" in value_from:
                value = "0"
            else:
                raise EnvError(f"env {name}: valueFrom {sorted(value_from)} is not supported")
            if value is not None:
                env[name] = value
        return env


def base_environment(home: str, api_host: str, api_port: int, kubeconfig: str | None) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = home
    env["KUBERNETES_SERVICE_HOST"] = api_host
    env["KUBERNETES_SERVICE_PORT"] = str(api_port)
    env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(api_port)
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    return env
