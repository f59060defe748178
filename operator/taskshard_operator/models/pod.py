"""Shard pod customisation: ``spec.spark.podTemplate`` (placement, pull secrets, labels, annotations, volumes) and
``spec.spark.volumeMounts`` (where the driver and executor containers mount those volumes).

The operator builds the shard pods itself (:mod:`taskshard_operator.builders`); these fields are merged into what
it builds, on the driver pod and on the executor pod template alike. What the hand-over protocol and the
"restricted" Pod Security profile own is refused by name, in the CRD (CEL) and in the model:

- ``podTemplate.spec``: ``containers``, ``initContainers``, ``securityContext``, ``serviceAccountName``,
  ``restartPolicy``, ``terminationGracePeriodSeconds`` (:data:`OWNED_POD_FIELDS`, each with where to set it instead);
- labels and annotations under ``taskshard.io/`` (the operator's selectors and protocol marks);
- the volume names and mount paths of the operator's own volumes (:data:`RESERVED_VOLUMES`,
  :data:`RESERVED_MOUNT_PATHS`); a mount names a volume of ``podTemplate.spec.volumes``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema, model_validator

from taskshard_operator import naming

from .base import FreeFormObject, K8sModel, cel, validations
from .common import LocalObjectRef

PREFIX = "spec.spark.podTemplate"

OWNED_POD_FIELDS: dict[str, str] = {
    "containers": "the driver container is built from spec.spark: image, resources, env, volumeMounts",
    "initContainers": "shard pods run the runtime alone",
    "securityContext": "shard pods run under Pod Security 'restricted', as uid 10001 with a read-only root",
    "serviceAccountName": "set spec.spark.serviceAccountName",
    "restartPolicy": "the operator restarts and replaces driver pods itself",
    "terminationGracePeriodSeconds": "the drain on pod deletion needs the operator's grace period",
}
"""Pod fields the operator owns, with where to set what the user wants instead."""

RESERVED_VOLUMES = ("config", "tmp", "storage", "spark-auth")
"""Names of the volumes the operator adds to shard pods."""
RESERVED_MOUNT_PATHS = ("/tmp", naming.CONFIG_DIR, naming.SPARK_AUTH_DIR)
"""Mount paths of the operator's volumes (the storage volume's path is checked on the whole spec)."""
OWNED_PREFIX = f"{naming.DOMAIN}/"


def owned_field_message(name: str) -> str:
    return f"{PREFIX}.spec.{name} is set by the operator ({OWNED_POD_FIELDS[name]}); remove it"


_ANY_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": "Refused."}
_OWNED_SCHEMAS: dict[str, dict[str, Any]] = {
    "containers": {"type": "array", "items": _ANY_OBJECT},
    "initContainers": {"type": "array", "items": _ANY_OBJECT},
    "securityContext": _ANY_OBJECT,
    "serviceAccountName": {"type": "string"},
    "restartPolicy": {"type": "string"},
    "terminationGracePeriodSeconds": {"type": "integer"},
}
"""Each owned field's Pod type, declared only so that the CRD's rules can see it and refuse it by name."""


def _owned(name: str) -> Any:
    schema = {**_OWNED_SCHEMAS[name], "description": f"Refused: {OWNED_POD_FIELDS[name]}."}
    return Field(default=None, json_schema_extra=lambda s: (s.clear(), s.update(schema)))


def _no_owned_keys(where: str) -> dict[str, str]:
    matching = f"self.filter(k, k.startsWith('{OWNED_PREFIX}'))"
    return cel(
        f"size({matching}) == 0",
        f"{where}: keys under {OWNED_PREFIX} are the operator's; choose another prefix",
        reason="FieldValueForbidden",
        message_expression=f'"{where}[\\"" + {matching}[0] + "\\"]: keys under {OWNED_PREFIX} are the operator\'s; '
        'choose another prefix"',
    )


LabelValue = Annotated[str, Field(max_length=63, description="A label value.")]
AnnotationValue = Annotated[str, Field(max_length=65536, description="An annotation value.")]
NodeLabelValue = Annotated[str, Field(max_length=63, description="The node label's value.")]
Toleration = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": "A toleration, as in a Pod."}
    ),
]
TopologySpreadConstraint = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "description": "A topology spread constraint, as in a Pod.",
        }
    ),
]


def reserved_message(where: str, what: str, value: str) -> str:
    """E.g. ``spec.spark.volumeMounts: the path "/tmp" is the operator's`` (the CRD's messageExpression too)."""
    return f'{where}: the {what} "{value}" is the operator\'s'


def _not_reserved(reserved: tuple[str, ...], where: str, what: str) -> dict[str, Any]:
    """The CEL rule refusing a string field's value that is one of the operator's ``reserved``."""
    return validations(
        cel(
            f"!(self in {list(reserved)})",
            f"{where}: the {what}s {', '.join(reserved)} are the operator's",
            reason="FieldValueForbidden",
            message_expression=f'"{where}: the {what} \\"" + self + "\\" is the operator\'s"',
        )
    )


class PodTemplateMetadata(K8sModel):
    """Labels and annotations added to every shard pod (driver and executors)."""

    labels: dict[str, LabelValue] | None = Field(
        default=None,
        max_length=32,
        description="Extra pod labels (keys under taskshard.io/ are refused).",
        json_schema_extra=validations(_no_owned_keys(f"{PREFIX}.metadata.labels")),
    )
    annotations: dict[str, AnnotationValue] | None = Field(
        default=None,
        max_length=64,
        description="Extra pod annotations (keys under taskshard.io/ are refused).",
        json_schema_extra=validations(_no_owned_keys(f"{PREFIX}.metadata.annotations")),
    )

    @model_validator(mode="after")
    def _check(self) -> PodTemplateMetadata:
        for kind, values in (("labels", self.labels), ("annotations", self.annotations)):
            owned = [k for k in values or {} if k.startswith(OWNED_PREFIX)]
            if owned:
                raise ValueError(
                    f'{PREFIX}.metadata.{kind}["{owned[0]}"]: keys under {OWNED_PREFIX} are the operator\'s; '
                    "choose another prefix"
                )
        return self


def _volume_schema(schema: dict[str, Any]) -> None:
    """A named object whose other fields (one volume source) the apiserver keeps as they are."""
    schema.pop("additionalProperties", None)
    schema["x-kubernetes-preserve-unknown-fields"] = True


class PodVolume(K8sModel):
    """A volume of the shard pods, as in a Pod's ``volumes`` (a name and one volume source)."""

    model_config = {"extra": "allow", "json_schema_extra": _volume_schema}

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=f"Volume name (not one of the operator's: {', '.join(RESERVED_VOLUMES)}).",
        json_schema_extra=_not_reserved(RESERVED_VOLUMES, f"{PREFIX}.spec.volumes", "name"),
    )

    @model_validator(mode="after")
    def _check(self) -> PodVolume:
        if self.name in RESERVED_VOLUMES:
            raise ValueError(reserved_message(f"{PREFIX}.spec.volumes", "name", self.name))
        return self


class PodTemplateSpec(K8sModel):
    """Pod-level fields of every shard pod (driver and executors); the rest of the pod is the operator's."""

    model_config = {
        "json_schema_extra": validations(
            *(cel(f"!has(self.{n})", owned_field_message(n), reason="FieldValueForbidden") for n in OWNED_POD_FIELDS),
            cel(
                "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
                f"{PREFIX}.spec.volumes: each name once",
                reason="FieldValueDuplicate",
            ),
        )
    }

    node_selector: dict[str, NodeLabelValue] | None = Field(
        default=None, max_length=32, description="Node labels a shard pod's node must have."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=32, description="Tolerations, as in a Pod (key, operator, value, effect)."
    )
    affinity: FreeFormObject | None = Field(
        default=None, description="Node and pod (anti-)affinity, as in a Pod's affinity."
    )
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None, max_length=8, description="Topology spread constraints, as in a Pod."
    )
    image_pull_secrets: list[LocalObjectRef] | None = Field(
        default=None, max_length=8, description="Secrets to pull the shard image with."
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="PriorityClass."
    )
    volumes: list[PodVolume] | None = Field(
        default=None, max_length=16, description="Extra volumes; mount them with spec.spark.volumeMounts."
    )
    containers: Any = _owned("containers")
    init_containers: Any = _owned("initContainers")
    security_context: Any = _owned("securityContext")
    service_account_name: Any = _owned("serviceAccountName")
    restart_policy: Any = _owned("restartPolicy")
    termination_grace_period_seconds: Any = _owned("terminationGracePeriodSeconds")

    @model_validator(mode="after")
    def _check(self) -> PodTemplateSpec:
        for name, field in type(self).model_fields.items():
            alias = field.alias or name
            if alias in OWNED_POD_FIELDS and getattr(self, name) is not None:
                raise ValueError(owned_field_message(alias))
        names = [v.name for v in self.volumes or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f'{PREFIX}.spec.volumes: "{twice[0]}" is named twice; each name once')
        return self

    def volume_names(self) -> set[str]:
        return {v.name for v in self.volumes or []}


class PodTemplate(K8sModel):
    """What the operator merges into every shard pod it builds (driver and executors)."""

    metadata: PodTemplateMetadata | None = Field(default=None, description="Extra labels and annotations.")
    spec: PodTemplateSpec | None = Field(default=None, description="Placement, pull secrets, volumes.")


class VolumeMount(K8sModel):
    """Where the driver and executor containers mount a volume of ``spec.spark.podTemplate.spec.volumes``."""

    name: str = Field(min_length=1, max_length=63, description="A volume of spec.spark.podTemplate.spec.volumes.")
    mount_path: str = Field(
        min_length=2,
        max_length=1024,
        pattern=r"^/",
        description=f"Absolute path (not one of the operator's: {', '.join(RESERVED_MOUNT_PATHS)}, the storage path).",
        json_schema_extra=_not_reserved(RESERVED_MOUNT_PATHS, "spec.spark.volumeMounts", "path"),
    )
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(default=None, max_length=1024, description="A path inside the volume.")

    @model_validator(mode="after")
    def _check(self) -> VolumeMount:
        if self.mount_path in RESERVED_MOUNT_PATHS:
            raise ValueError(reserved_message("spec.spark.volumeMounts", "path", self.mount_path))
        return self


__all__ = [
    "OWNED_POD_FIELDS",
    "RESERVED_MOUNT_PATHS",
    "RESERVED_VOLUMES",
    "PodTemplate",
    "PodTemplateMetadata",
    "PodTemplateSpec",
    "PodVolume",
    "VolumeMount",
]
