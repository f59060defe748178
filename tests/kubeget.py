"""Reads that tests poll, served through the Kubernetes API instead of a kubectl process per call.

A polling test asks the same few questions many times a second (a shard's phase, the shard pods, a Task's
status). Each ``kubectl get`` is a fresh Go process: ~70 ms of CPU on a 2-core machine, where the shard JVMs under
test need every cycle. :class:`KubeGet` answers ``kubectl get KIND [NAME] [-l SEL] [--field-selector SEL]`` in
JSON from one pooled API client (under 1 ms of CPU per read) and returns what ``kubectl get -o json`` prints:
the object for a name; for a list, ``kind: List`` with every item carrying its ``apiVersion`` and ``kind``.

Contract:
- :func:`rest_path` is pure: the REST path and query for a supported ``kubectl get`` argument list, else
  ``None`` (the caller then runs the real kubectl).
- A missing object raises :class:`subprocess.CalledProcessError` with kubectl's ``NotFound`` message, as a
  ``kubectl get`` run with ``check=True`` does.

Everything that changes the cluster, and every command a user would type, still goes through the real kubectl.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

# kubectl's names for a kind -> (API prefix, plural). Only kinds the tests read; others fall back to kubectl.
KINDS: dict[str, tuple[str, str]] = {}
for _names, _prefix, _plural in (
    (("pod", "pods", "po"), "/api/v1", "pods"),
    (("event", "events", "ev"), "/api/v1", "events"),
    (("secret", "secrets"), "/api/v1", "secrets"),
    (("configmap", "configmaps", "cm"), "/api/v1", "configmaps"),
    (("pvc", "persistentvolumeclaim", "persistentvolumeclaims"), "/api/v1", "persistentvolumeclaims"),
    (("replicaset", "replicasets", "rs"), "/apis/apps/v1", "replicasets"),
    (("poddisruptionbudget", "poddisruptionbudgets", "pdb"), "/apis/policy/v1", "poddisruptionbudgets"),
    (("task", "tasks"), "/apis/taskshard.io/v1alpha1", "tasks"),
    (("taskshard", "taskshards"), "/apis/taskshard.io/v1alpha1", "taskshards"),
):
    for _name in _names:
        KINDS[_name] = (_prefix, _plural)

SELECTOR_FLAGS = {"-l": "labelSelector", "--selector": "labelSelector", "--field-selector": "fieldSelector"}


def rest_path(args: tuple[str, ...], namespace: str) -> tuple[str, list[tuple[str, str]], str | None] | None:
    """``(path, query, name)`` for ``kubectl get *args`` in ``namespace``, or ``None`` when it is not supported."""
    if not args or args[0] not in KINDS:
        return None
    prefix, plural = KINDS[args[0]]
    name: str | None = None
    query: list[tuple[str, str]] = []
    rest = list(args[1:])
    while rest:
        word = rest.pop(0)
        if word in SELECTOR_FLAGS and rest:
            query.append((SELECTOR_FLAGS[word], rest.pop(0)))
        elif not word.startswith("-") and name is None:
            name = word
        else:
            return None  # a flag this reader does not know: let kubectl answer
    if name is not None and query:
        return None
    path = f"{prefix}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")
    return path, query, name


def as_kubectl_list(body: dict) -> dict:
    """A REST list as ``kubectl get -o json`` prints it: ``kind: List``, each item with apiVersion and kind."""
    api_version = body.get("apiVersion", "v1")
    item_kind = (body.get("kind") or "List").removesuffix("List")
    items = [{"apiVersion": api_version, "kind": item_kind, **item} for item in body.get("items") or []]
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


class KubeGet:
    """``kubectl get -o json`` for the kinds in :data:`KINDS`, through one pooled API client (thread-safe)."""

    def __init__(self, kubeconfig: str | Path) -> None:
        from kubernetes import config

        self._api = config.new_client_from_config(config_file=str(kubeconfig))

    def get(self, args: tuple[str, ...], namespace: str) -> dict | None:
        """The parsed output of ``kubectl get *args -o json``; ``None`` when the arguments are not supported."""
        from kubernetes.client.exceptions import ApiException

        plan = rest_path(args, namespace)
        if plan is None:
            return None
        path, query, name = plan
        try:
            response = self._api.call_api(
                path,
                "GET",
                query_params=query,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
        except ApiException as e:
            if e.status == 404:
                message = f'Error from server (NotFound): {path.split("/")[-2]} "{name}" not found\n'
                raise subprocess.CalledProcessError(1, ["kubectl", "get", *args], "", message) from e
            raise
        body = json.loads(response.data)
        return body if name else as_kubectl_list(body)
