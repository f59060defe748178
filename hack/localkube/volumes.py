"""Pod volumes as local directories, for the local node agent.

:func:`materialize` turns each volume of a pod into a directory on this machine and returns ``{name: path}``:

| volume kind              | local directory                                                        |
|--------------------------|------------------------------------------------------------------------|
| emptyDir                 | ``<sandbox>/volumes/<name>`` (removed with the sandbox)                 |
| configMap, secret        | ``<sandbox>/volumes/<name>`` with one file per key (or per ``items``)   |
| downwardAPI, projected   | ``<sandbox>/volumes/<name>``; service-account tokens come from TokenRequest |
| hostPath                 | the path itself (created for ``DirectoryOrCreate`` and unset type)       |
| persistentVolumeClaim    | ``<root>/pvc/<namespace>/<claimName>`` (kept across pods, like a local PV) |

It is idempotent and is called again while the pod runs, so configMap, secret and downwardAPI contents follow
their sources the way a kubelet refreshes them. A missing configMap or secret that is not ``optional`` raises
:class:`VolumeError` (the pod stays Pending with that message, and the agent retries).
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from .fieldpath import resolve_field_path

ISSUER = "https://kubernetes.default.svc.cluster.local"


class VolumeError(RuntimeError):
    """A volume's source is missing or invalid; the message names the volume and the source."""


def pvc_dir(root: Path, namespace: str, claim: str) -> Path:
    return root / "pvc" / namespace / claim


def _write_files(directory: Path, files: dict[str, bytes], mode: int | None = None) -> None:
    """Make ``directory`` hold exactly ``files`` (relative paths), rewriting only what changed."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and target.read_bytes() == data:
            continue
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, target)
    wanted = {directory / rel for rel in files}
    for existing in directory.rglob("*"):
        if existing.is_file() and existing not in wanted and not existing.name.startswith("."):
            existing.unlink()


def _select(data: dict[str, bytes], items: list[dict] | None) -> dict[str, bytes]:
    if not items:
        return data
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


class VolumeMaterializer:
    """Builds the local directories of one pod's volumes. One instance per pod worker."""

    def __init__(self, core, root: Path, sandbox: Path, pod: dict) -> None:
        self.core = core
        self.root = root
        self.sandbox = sandbox
        self.pod = pod
        self._tokens: dict[str, tuple[float, bytes]] = {}

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    def materialize(self) -> dict[str, Path]:
        paths = {}
        for volume in self.pod["spec"].get("volumes") or []:
            paths[volume["name"]] = self._one(volume)
        return paths

    def _one(self, volume: dict) -> Path:
        name = volume["name"]
        local = self.sandbox / "volumes" / name
        if "emptyDir" in volume:
            local.mkdir(parents=True, exist_ok=True)
            return local
        if "hostPath" in volume:
            path = Path(volume["hostPath"]["path"])
            kind = volume["hostPath"].get("type") or "DirectoryOrCreate"
            if kind in ("DirectoryOrCreate", ""):
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch(exist_ok=True)
            elif not path.exists():
                raise VolumeError(f"volume {name!r}: hostPath {path} does not exist (type {kind})")
            return path
        if "persistentVolumeClaim" in volume:
            path = pvc_dir(self.root, self.namespace, volume["persistentVolumeClaim"]["claimName"])
            path.mkdir(parents=True, exist_ok=True)
            return path
        if "configMap" in volume:
            _write_files(local, self._config_map_files(volume["configMap"], name))
            return local
        if "secret" in volume:
            _write_files(local, self._secret_files(volume["secret"], name), mode=0o600)
            return local
        if "downwardAPI" in volume:
            _write_files(local, self._downward_files(volume["downwardAPI"].get("items") or []))
            return local
        if "projected" in volume:
            files: dict[str, bytes] = {}
            for source in volume["projected"].get("sources") or []:
                files.update(self._projected_source(source, name))
            _write_files(local, files)
            return local
        kinds = sorted(k for k in volume if k != "name")
        raise VolumeError(f"volume {name!r}: kind {kinds} is not supported by the local node agent")

    # ----------------------------------------------------------------- sources
    def _config_map_files(self, source: dict, volume: str) -> dict[str, bytes]:
        try:
            cm = self.core.read_namespaced_config_map(source["name"], self.namespace)
        except ApiException as e:
            if e.status == 404 and source.get("optional"):
                return {}
            raise VolumeError(f"volume {volume!r}: configMap {source['name']!r}: {e.reason}") from e
        data = {k: v.encode() for k, v in (cm.data or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        return _select(data, source.get("items"))

    def _secret_files(self, source: dict, volume: str) -> dict[str, bytes]:
        name = source.get("secretName") or source.get("name")
        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as e:
            if e.status == 404 and source.get("optional"):
                return {}
            raise VolumeError(f"volume {volume!r}: secret {name!r}: {e.reason}") from e
        data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        return _select(data, source.get("items"))

    def _downward_files(self, items: list[dict]) -> dict[str, bytes]:
        files = {}
        for item in items:
            if "fieldRef" in item:
                files[item["path"]] = resolve_field_path(self.pod, item["fieldRef"]["fieldPath"]).encode()
        return files

    def _projected_source(self, source: dict, volume: str) -> dict[str, bytes]:
        if "configMap" in source:
            return self._config_map_files(source["configMap"], volume)
        if "secret" in source:
            return self._secret_files(source["secret"], volume)
        if "downwardAPI" in source:
            return self._downward_files(source["downwardAPI"].get("items") or [])
        if "serviceAccountToken" in source:
            spec = source["serviceAccountToken"]
            return {spec["path"]: self._token(spec)}
        raise VolumeError(f"volume {volume!r}: projected source {sorted(source)} is not supported")

    def _token(self, spec: dict) -> bytes:
        """A bound service-account token from TokenRequest, renewed after half its lifetime."""
        ttl = int(spec.get("expirationSeconds") or 3600)
        cached = self._tokens.get(spec["path"])
        if cached and time.monotonic() - cached[0] < ttl / 2:
            return cached[1]
        meta = self.pod["metadata"]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [spec.get("audience") or ISSUER],
                "expirationSeconds": ttl,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        try:
            response = self.core.create_namespaced_service_account_token(sa, self.namespace, body)
        except ApiException as e:
            raise VolumeError(f"service account token for {sa!r}: {e.reason}") from e
        token = response.status.token.encode()
        self._tokens[spec["path"]] = (time.monotonic(), token)
        return token
