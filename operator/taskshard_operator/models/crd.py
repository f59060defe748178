"""Generate the Task and TaskShard CustomResourceDefinitions from the pydantic models.

The models are the one source of truth: :func:`build_crds` turns their JSON schemas into Kubernetes structural
schemas (``$ref`` inlined, ``Optional`` unwrapped, titles dropped, CEL rules kept) and adds names, printer
columns, the status subresource and the Task's scale subresource. ``hack/gen_crds.py`` writes the result to
``crds/``; a unit test fails when the files drift from :func:`render_crds`.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from .base import API_GROUP, API_VERSION
from .shard import ROOT_RULES, TaskShardSpec, TaskShardStatus
from .task import TASK_METADATA_SCHEMA, TaskSpec, TaskStatus

__all__ = ["CRD_FILES", "build_crds", "render_crds", "structural_schema"]

_VALIDATIONS = "x-kubernetes-validations"
_DROP = {"title", "$defs"}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` wins, except that CEL rule lists are concatenated (type rules first, then field rules)."""
    out = {**base, **over}
    if _VALIDATIONS in base and _VALIDATIONS in over:
        out[_VALIDATIONS] = base[_VALIDATIONS] + over[_VALIDATIONS]
    return out


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        return _convert(_merge(target, node), defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        return _convert(_merge(inner, node), defs)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {options} in a structural schema")
        if node.get("default", ...) is None:
            node.pop("default")
        return _convert(_merge(options[0], node), defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields instead
        if key == "properties":
            value = {name: _convert(prop, defs) for name, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = _convert(value, defs)
        elif key == "default" and value == {} and node.get("type") == "object":
            continue
        out[key] = value
    if out.get("type") == "array" and out.get("default") == []:
        del out["default"]  # an omitted list stays omitted (the models default to empty)
    return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's validation JSON schema (by alias), converted to a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def _root_schema(
    kind: str, spec: type[BaseModel], status: type[BaseModel], extra_rules: list, metadata: dict | None = None
) -> dict:
    schema: dict[str, Any] = {
        "type": "object",
        "description": f"{kind} of the TaskShard operator ({API_GROUP}/{API_VERSION}). "
        "Key-group ranges are half-open [start, end).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: taskshard.io/v1alpha1."},
            "kind": {"type": "string", "description": f"Kind of this object: {kind}."},
            # the apiserver forbids anything here but restrictions of name and generateName (not even a description)
            "metadata": metadata or {"type": "object"},
            "spec": structural_schema(spec),
            "status": structural_schema(status),
        },
    }
    if extra_rules:
        schema[_VALIDATIONS] = extra_rules
    return schema


SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.shards",
    "statusReplicasPath": ".status.shards",
    "labelSelectorPath": ".status.selector",
}
"""The Task's scale subresource: ``kubectl scale task NAME --replicas N`` (and a HorizontalPodAutoscaler or KEDA)
sets ``spec.shards``; the replicas it reads back are the active shards, the selector the shard pods'."""


def _crd(
    kind: str, plural: str, short: str, schema: dict, columns: list[dict], scale: dict | None = None
) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if scale is not None:
        subresources["scale"] = scale
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["taskshard-all"],  # not "taskshard": it would shadow the singular name
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _column(name: str, type_: str, path: str, description: str, priority: int = 0) -> dict[str, Any]:
    col = {"name": name, "type": type_, "jsonPath": path, "description": description}
    if priority:
        col["priority"] = priority
    return col


_AGE = _column("Age", "date", ".metadata.creationTimestamp", "Time since creation.")


def build_crds() -> dict[str, dict[str, Any]]:
    """``{file name: CRD object}`` for both kinds."""
    return {f"{API_GROUP}_tasks.yaml": _task_crd(), f"{API_GROUP}_taskshards.yaml": _shard_crd()}


def _task_crd() -> dict[str, Any]:
    """The Task CRD: its schema, its printer columns, the scale subresource."""
    return _crd(
        "Task",
        "tasks",
        "tsk",
        _root_schema("Task", TaskSpec, TaskStatus, [], metadata=TASK_METADATA_SCHEMA),
        [
            _column("Shards", "integer", ".status.shards", "Number of active shards."),
            _column(
                "Desired",
                "integer",
                ".spec.shards",
                "spec.shards, the desired active shards (kubectl scale); empty when the count is left to splits.",
            ),
            _column("Phase", "string", ".status.phase", "Lifecycle phase of the task."),
            _column(
                "Ready",
                "string",
                '.status.conditions[?(@.type=="Ready")].status',
                "True while every active shard runs.",
            ),
            _column("Rate", "number", ".status.live.rate", "Input rows committed per second, all shards."),
            _column("Lag", "integer", ".status.live.lag", "Input not yet processed, all shards."),
            _column("Key Groups", "integer", ".spec.maxKeyGroups", "maxKeyGroups of the task.", priority=1),
            _AGE,
        ],
        scale=SCALE_SUBRESOURCE,
    )


def _shard_crd() -> dict[str, Any]:
    """The TaskShard CRD: its schema and its printer columns."""
    return _crd(
        "TaskShard",
        "taskshards",
        "tss",
        _root_schema("TaskShard", TaskShardSpec, TaskShardStatus, ROOT_RULES),
        [
            _column("Task", "string", ".spec.taskRef.name", "The Task this shard belongs to."),
            _column(
                "Range",
                "string",
                ".metadata.labels.taskshard\\.io/key-groups",
                "Key-group range start-end, meaning [start, end).",
            ),
            _column("Phase", "string", ".status.phase", "Lifecycle phase of the shard."),
            _column(
                "Ready",
                "string",
                '.status.conditions[?(@.type=="Ready")].status',
                "True while the shard's driver pod runs its range (reason in the Ready condition).",
            ),
            _column("Rate", "number", ".status.live.rate", "Input rows committed per second (last minute)."),
            _column("Lag", "integer", ".status.live.lag", "Input not yet processed (Kafka: records; journal: bytes)."),
            _column("Last Batch", "integer", ".status.live.batchId", "Last committed micro-batch id."),
            _column("Restarts", "integer", ".status.restarts", "Driver pod restarts.", priority=1),
            _column(
                "Executors",
                "integer",
                ".status.executors.running",
                "Executor pods running (of status.executors.requested; why not: the ExecutorsReady condition).",
                priority=1,
            ),
            _AGE,
        ],
    )


CRD_FILES = tuple(build_crds())


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared sub-schemas out in full (no YAML anchors), as kubectl and humans expect."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_HEADER = "# Generated by hack/gen_crds.py from operator/taskshard_operator/models. Do not edit by hand.\n"


def render_crds() -> dict[str, str]:
    """``{file name: YAML text}`` exactly as ``hack/gen_crds.py`` writes them."""
    return {
        name: _HEADER + yaml.dump(crd, Dumper=_NoAliasDumper, sort_keys=True, width=120, allow_unicode=True)
        for name, crd in build_crds().items()
    }
