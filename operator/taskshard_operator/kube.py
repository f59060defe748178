"""The operator's only door to the Kubernetes API: create / patch / delete on plain dicts (reads come from the
watch-fed cache; the only read is the retention cleanup pod's, at Task deletion). :data:`API_VERBS` lists the
calls each method makes, and the chart's RBAC grants exactly those plus :data:`KOPF_VERBS`.

Every function returns camelCase dicts (as ``kubectl get -o json`` shows them) or None for "not found", so the
reconcilers and pure builders never see client model classes. ``create`` returns None on 409 (the object
already exists: the step was done before), which is what makes re-running a protocol step harmless.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from taskshard_operator import metrics, naming

MERGE_PATCH = "application/merge-patch+json"


API_VERBS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "create_custom": ((naming.DOMAIN, naming.SHARD_PLURAL, "create"),),
    "patch_custom": ((naming.DOMAIN, naming.SHARD_PLURAL, "patch"),),
    "delete_custom": ((naming.DOMAIN, naming.SHARD_PLURAL, "delete"),),
    "patch_custom_status": (
        (naming.DOMAIN, f"{naming.TASK_PLURAL}/status", "patch"),
        (naming.DOMAIN, f"{naming.SHARD_PLURAL}/status", "patch"),
    ),
    "get_pod": (("", "pods", "get"),),
    "list_pods": (("", "pods", "list"),),
    "create_pod": (("", "pods", "create"),),
    "delete_pod": (("", "pods", "delete"),),
    "apply_configmap": (("", "configmaps", "create"), ("", "configmaps", "patch")),
    "delete_configmap": (("", "configmaps", "delete"),),
    "ensure_service": (("", "services", "create"),),
    "ensure_secret": (("", "secrets", "create"),),
    "apply_disruption_budget": (
        ("policy", "poddisruptionbudgets", "create"),
        ("policy", "poddisruptionbudgets", "patch"),
    ),
    "post_event": (("", "events", "create"),),
}
"""(API group, resource, verb) of every call each method makes: the chart's RBAC grants exactly these plus
:data:`KOPF_VERBS` (a test compares them)."""

KOPF_VERBS: tuple[tuple[str, str, str], ...] = (
    *((naming.DOMAIN, r, v) for r in (naming.TASK_PLURAL, naming.SHARD_PLURAL) for v in ("list", "watch")),
    *(("", r, v) for r in ("pods", "configmaps") for v in ("list", "watch")),
    (naming.DOMAIN, naming.TASK_PLURAL, "patch"),
)
"""What Kopf does for the operator's handlers: list and watch every indexed or handled resource, and patch Tasks
(its finalizer and progress annotations)."""


EVENT_COMPONENT = "taskshard-operator"
"""``source.component`` and ``reportingComponent`` of the operator's events (``kubectl describe``'s "From")."""
EVENT_INSTANCE = os.environ.get("HOSTNAME") or socket.gethostname()
"""``reportingInstance``: the operator's pod name."""
EVENT_MESSAGE_LIMIT = 1000
"""An event message is cut to this many characters."""


class Conflict(Exception):
    """A conditional write found a newer ``resourceVersion`` (HTTP 409): the object changed since it was read.
    ``plural``/``name``: that object (empty when unknown)."""

    def __init__(self, message: str, plural: str = "", name: str = "") -> None:
        super().__init__(message)
        self.plural = plural
        self.name = name


def load_config() -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (``KUBECONFIG`` or ~/.kube/config)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def _counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Count each call of API method ``name`` in :mod:`taskshard_operator.metrics` by outcome."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except Conflict:
            metrics.observe_api(name, "conflict")
            raise
        except Exception:
            metrics.observe_api(name, "error")
            raise
        metrics.observe_api(name, "ok")
        return result

    return wrapper


class Kube:
    """Thin wrapper over the generated clients. One instance per operator process (thread-safe enough: the
    underlying urllib3 pool is shared)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.policy = client.PolicyV1Api(self.api)

    def _dict(self, obj: Any) -> dict[str, Any]:
        return obj if isinstance(obj, dict) else self.api.sanitize_for_serialization(obj)

    # ------------------------------------------------------------ custom resources
    def create_custom(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.custom.create_namespaced_custom_object(
                naming.DOMAIN, naming.API_VERSION, namespace, plural, body
            )
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def patch_custom(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a TaskShard; a patch carrying ``metadata.resourceVersion`` is conditional (raises
        :class:`Conflict` when the object changed since)."""
        try:
            return self.custom.patch_namespaced_custom_object(
                naming.DOMAIN, naming.API_VERSION, namespace, plural, name, patch, _content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status == 409 and (patch.get("metadata") or {}).get("resourceVersion"):
                raise Conflict(f"{plural} {namespace}/{name} changed since it was read", plural, name) from e
            raise

    def delete_custom(self, plural: str, namespace: str, name: str, *, uid: str | None = None) -> None:
        """Delete a TaskShard (background propagation: its pod and ConfigMap follow by owner reference); a missing
        one, or one replaced since (``uid`` precondition), is fine."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.custom.delete_namespaced_custom_object(
                naming.DOMAIN, naming.API_VERSION, namespace, plural, name, body=body
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def patch_custom_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch ``status``; with ``resource_version`` the write is conditional (raises :class:`Conflict`
        when the object changed since that version was read)."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self.custom.patch_namespaced_custom_object_status(
                naming.DOMAIN, naming.API_VERSION, namespace, plural, name, body, _content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status == 409 and resource_version is not None:
                raise Conflict(
                    f"{plural} {namespace}/{name} changed since version {resource_version}", plural, name
                ) from e
            raise

    # ------------------------------------------------------------ pods
    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._dict(self.core.read_namespaced_pod(name, namespace))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self._dict(p) for p in pods.items]

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self._dict(self.core.create_namespaced_pod(namespace, body))
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def delete_pod(self, namespace: str, name: str, *, uid: str | None = None, grace: int | None = None) -> None:
        """Delete (gracefully unless ``grace`` says otherwise); a missing pod is fine."""
        body: dict[str, Any] = {}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # ------------------------------------------------------------ configmaps and services
    def apply_configmap(self, namespace: str, body: dict[str, Any], *, exists: bool) -> str:
        """Create the ConfigMap (``exists=False``; one that exists already is patched) or patch its data
        (``exists=True``, as the cache says). Returns "created" or "patched"; no read."""
        name = body["metadata"]["name"]
        if not exists:
            try:
                self.core.create_namespaced_config_map(namespace, body)
                return "created"
            except ApiException as e:
                if e.status != 409:
                    raise
        self.core.patch_namespaced_config_map(name, namespace, {"data": body["data"]}, _content_type=MERGE_PATCH)
        return "patched"

    def delete_configmap(self, namespace: str, name: str) -> None:
        try:
            self.core.delete_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    def ensure_service(self, namespace: str, body: dict[str, Any]) -> None:
        _unless_exists(self.core.create_namespaced_service, namespace, body)

    def ensure_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the Secret unless it exists (an existing one is kept as it is: never read, never replaced)."""
        _unless_exists(self.core.create_namespaced_secret, namespace, body)

    def apply_disruption_budget(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the PodDisruptionBudget, or set the ``minAvailable`` of the one that exists (no read)."""
        try:
            self.policy.create_namespaced_pod_disruption_budget(namespace, body)
            return
        except ApiException as e:
            if e.status != 409:
                raise
        patch = {"spec": {"minAvailable": body["spec"]["minAvailable"]}}
        self.policy.patch_namespaced_pod_disruption_budget(
            body["metadata"]["name"], namespace, patch, _content_type=MERGE_PATCH
        )

    # ------------------------------------------------------------ events
    def post_event(self, about: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about the object ``about`` now, on the caller's thread: an event is on the API
        server when the pass that announced it ends, so an operator that dies right after (a crash, an eviction, a
        rollout) cannot lose it, as it could lose one still queued for a background poster. The message is cut to
        :data:`EVENT_MESSAGE_LIMIT` characters."""
        meta = about.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = datetime.datetime.now(datetime.UTC).isoformat()
        involved = {
            "apiVersion": about.get("apiVersion"),
            "kind": about.get("kind"),
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
        }
        body = {
            "metadata": {"namespace": namespace, "generateName": f"{meta.get('name') or 'taskshard'}."},
            "type": type_,
            "reason": reason,
            "message": message[:EVENT_MESSAGE_LIMIT],
            "action": reason,
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": EVENT_INSTANCE,
            "source": {"component": EVENT_COMPONENT},
            "involvedObject": {k: v for k, v in involved.items() if v},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
            "count": 1,
        }
        self.core.create_namespaced_event(namespace, body)


def _unless_exists(create: Any, namespace: str, body: dict[str, Any]) -> None:
    """``create(namespace, body)``; an object of that name that exists already (409) is left as it is."""
    try:
        create(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise


for _name in API_VERBS:
    setattr(Kube, _name, _counted(_name, getattr(Kube, _name)))
