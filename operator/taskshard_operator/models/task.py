"""Task: the user's manifest (processor, source, sink, storage, key groups, Spark settings) and its status.

Single-object invariants are CEL rules in the CRD and mirrored by pydantic validators here: exactly one of
each kind (processor, source, sink, storage, volume), ``sum`` needs ``field``, ``initialShards <=
maxKeyGroups``, no ``spark.conf`` key the protocol owns (``spark_runtime.reserved_conf``); ``maxKeyGroups``,
``keyField`` and ``storage`` are immutable (changing them would orphan state).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, model_validator

from spark_runtime.keygroups import MAX_KEY_GROUPS_LIMIT
from spark_runtime.reserved_conf import RESERVED_SPARK_CONF, reserved_conf_message, reserved_conf_problems

from .base import (
    API_GROUP,
    API_VERSION,
    DNS_SUBDOMAIN_PATTERN,
    FreeFormObject,
    K8sModel,
    Quantity,
    cel,
    validations,
)
from .common import Condition

__all__ = [
    "BuiltinProcessor",
    "CheckpointRetention",
    "DirectorySink",
    "ExecutorsSpec",
    "JournalSource",
    "KafkaSink",
    "KafkaSource",
    "ProcessorSpec",
    "ResourceRequirements",
    "PersistentVolumeClaimRef",
    "EnvVar",
    "S3Storage",
    "ShardSummary",
    "SinkSpec",
    "SourceSpec",
    "SparkSpec",
    "StorageSpec",
    "Task",
    "TaskPhase",
    "TaskSpec",
    "TaskStatus",
    "VolumeSpec",
]

ABS_PATH = r"^/\S*$"
PYTHON_REF = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
KAFKA_TOPIC = r"^[A-Za-z0-9._-]+$"
KAFKA_SERVERS = r"^[^,\s]+:[0-9]+(,[^,\s]+:[0-9]+)*$"


def _exactly_one(obj: K8sModel, path: str, *names: str) -> None:
    """Python twin of the CEL exactly-one-of rules (``names`` are Python attribute names)."""
    chosen = [n for n in names if getattr(obj, n) is not None]
    if len(chosen) != 1:
        aliases = [type(obj).model_fields[n].alias or n for n in names]
        raise ValueError(f"{path}: exactly one of {', '.join(aliases)} must be set (got {len(chosen)})")


def _one_of_rule(path: str, a: str, b: str) -> dict[str, str]:
    return cel(
        f"has(self.{a}) != has(self.{b})",
        f"{path}: exactly one of {path}.{a} or {path}.{b} must be set",
    )


class BuiltinProcessor(StrEnum):
    """Processors shipped with the runtime."""

    COUNT = "count"
    """Count events per key."""
    SUM = "sum"
    """Sum the numeric event field ``processor.field`` per key."""


class ProcessorSpec(K8sModel):
    """The stateful per-key processor: a builtin or a Python class."""

    model_config = {
        "json_schema_extra": validations(
            _one_of_rule("spec.processor", "builtin", "python"),
            cel(
                "!has(self.builtin) || self.builtin != 'sum' || has(self.field)",
                "spec.processor.field is required when spec.processor.builtin is sum (the numeric event field "
                "to add up)",
                field_path=".field",
                reason="FieldValueRequired",
            ),
            cel(
                "!has(self.field) || (has(self.builtin) && self.builtin == 'sum')",
                "spec.processor.field is only valid with spec.processor.builtin: sum",
                field_path=".field",
                reason="FieldValueForbidden",
            ),
        )
    }

    builtin: BuiltinProcessor | None = Field(
        default=None, description="A builtin processor: count or sum. Exactly one of builtin or python."
    )
    field: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="For builtin sum only: the numeric event field to add up per key.",
    )
    python: str | None = Field(
        default=None,
        max_length=512,
        pattern=PYTHON_REF,
        description="Import path of a Python processor class, 'package.module:ClassName'. Exactly one of "
        "builtin or python.",
    )
    parameters: FreeFormObject | None = Field(
        default=None, description="Free-form parameters passed to the processor as a JSON object."
    )

    @model_validator(mode="after")
    def _check(self) -> ProcessorSpec:
        _exactly_one(self, "spec.processor", "builtin", "python")
        is_sum = self.builtin == BuiltinProcessor.SUM
        if is_sum and self.field is None:
            raise ValueError("spec.processor.field is required when spec.processor.builtin is sum")
        if self.field is not None and not is_sum:
            raise ValueError("spec.processor.field is only valid with spec.processor.builtin: sum")
        return self


class JournalSource(K8sModel):
    """A directory of append-only JSON-lines partition files (the embedded journal)."""

    path: str = Field(
        min_length=2, max_length=4096, pattern=ABS_PATH, description="Absolute path of the journal directory."
    )
    partitions: int = Field(default=1, ge=1, le=1024, description="Number of partition files (1..1024).")


class KafkaSource(K8sModel):
    """A Kafka topic."""

    bootstrap_servers: str = Field(
        max_length=2048, pattern=KAFKA_SERVERS, description="Comma-separated host:port list of Kafka brokers."
    )
    topic: str = Field(min_length=1, max_length=249, pattern=KAFKA_TOPIC, description="Kafka topic to read.")
    starting_offsets: Literal["earliest", "latest"] = Field(
        default="earliest", description="Where a fresh task starts reading: earliest or latest."
    )


class SourceSpec(K8sModel):
    """Where events come from: exactly one of journal or kafka."""

    model_config = {"json_schema_extra": validations(_one_of_rule("spec.source", "journal", "kafka"))}

    journal: JournalSource | None = Field(default=None, description="Read a local journal directory.")
    kafka: KafkaSource | None = Field(default=None, description="Read a Kafka topic.")

    @model_validator(mode="after")
    def _check(self) -> SourceSpec:
        _exactly_one(self, "spec.source", "journal", "kafka")
        return self


class DirectorySink(K8sModel):
    """Files in a directory."""

    path: str = Field(
        min_length=2, max_length=4096, pattern=ABS_PATH, description="Absolute path of the output directory."
    )
    format: Literal["jsonl", "parquet"] = Field(default="jsonl", description="File format: jsonl or parquet.")


class KafkaSink(K8sModel):
    """A Kafka topic."""

    bootstrap_servers: str = Field(
        max_length=2048, pattern=KAFKA_SERVERS, description="Comma-separated host:port list of Kafka brokers."
    )
    topic: str = Field(min_length=1, max_length=249, pattern=KAFKA_TOPIC, description="Kafka topic to write.")


class SinkSpec(K8sModel):
    """Where results go: exactly one of directory or kafka."""

    model_config = {"json_schema_extra": validations(_one_of_rule("spec.sink", "directory", "kafka"))}

    directory: DirectorySink | None = Field(default=None, description="Write files to a directory.")
    kafka: KafkaSink | None = Field(default=None, description="Write to a Kafka topic.")

    @model_validator(mode="after")
    def _check(self) -> SinkSpec:
        _exactly_one(self, "spec.sink", "directory", "kafka")
        return self


class S3Storage(K8sModel):
    """An S3-compatible bucket."""

    bucket: str = Field(
        min_length=3,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$",
        description="Bucket name (3..63 lowercase letters, digits, dots and dashes).",
    )
    prefix: str | None = Field(default=None, max_length=1024, description="Key prefix inside the bucket.")
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://\S+$",
        description="Endpoint URL (http:// or https://) of an S3-compatible service; default AWS.",
    )
    credentials_secret: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Secret in the Task's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
    )


class PersistentVolumeClaimRef(K8sModel):
    """A PersistentVolumeClaim in the Task's namespace."""

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the PersistentVolumeClaim (ReadWriteMany when shards run on several nodes).",
    )


class VolumeSpec(K8sModel):
    """The volume shard pods mount for the shared filesystem paths: exactly one of hostPath or pvc."""

    model_config = {
        "json_schema_extra": validations(_one_of_rule("spec.storage.volume", "hostPath", "persistentVolumeClaim"))
    }

    host_path: str | None = Field(
        default=None, max_length=4096, pattern=ABS_PATH, description="Absolute path on the node to mount."
    )
    persistent_volume_claim: PersistentVolumeClaimRef | None = Field(
        default=None, description="A PersistentVolumeClaim to mount."
    )
    mount_path: str = Field(
        default="/data",
        max_length=4096,
        pattern=ABS_PATH,
        description="Where the volume is mounted in shard pods (default /data); task paths live under it.",
    )

    @model_validator(mode="after")
    def _check(self) -> VolumeSpec:
        _exactly_one(self, "spec.storage.volume", "host_path", "persistent_volume_claim")
        return self


class StorageSpec(K8sModel):
    """Where recovery logs, snapshots and manifests live: exactly one of path or s3."""

    model_config = {"json_schema_extra": validations(_one_of_rule("spec.storage", "path", "s3"))}

    path: str | None = Field(
        default=None,
        min_length=2,
        max_length=4096,
        pattern=ABS_PATH,
        description="Absolute path of a shared filesystem directory (on the volume below).",
    )
    s3: S3Storage | None = Field(default=None, description="An S3-compatible bucket.")
    volume: VolumeSpec | None = Field(
        default=None, description="How shard pods mount the shared paths (storage, journal, output)."
    )

    @model_validator(mode="after")
    def _check(self) -> StorageSpec:
        _exactly_one(self, "spec.storage", "path", "s3")
        return self


class ResourceRequirements(K8sModel):
    """Compute resources of a Spark container (as in a Pod's container resources)."""

    requests: dict[str, Quantity] | None = Field(
        default=None,
        max_length=16,
        description="Minimum resources, e.g. {cpu: '1', memory: 2Gi}.",
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, max_length=16, description="Maximum resources, e.g. {memory: 2Gi}."
    )


class ExecutorsSpec(K8sModel):
    """Spark executors; 0 instances runs Spark in local mode inside the driver pod."""

    instances: int = Field(default=0, ge=0, le=64, description="Executor count (0..64); 0 = local mode.")
    resources: ResourceRequirements | None = Field(default=None, description="Resources of each executor.")


RESERVED_ENV = ("TASKSHARD_TASK", "TASKSHARD_SHARD", "POD_NAME", "POD_NAMESPACE")
"""Env vars the operator sets on every driver pod itself (a Task cannot override them)."""


class EnvVar(K8sModel):
    """An environment variable of the driver pod, as in a Pod's container ``env`` (value or valueFrom)."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                "!(has(self.value) && has(self.valueFrom))",
                "spec.spark.env: set value or valueFrom, not both",
            )
        )
    }

    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
        description="Variable name, e.g. TASKSHARD_EXTRA_JARS or AWS_REGION.",
    )
    value: str | None = Field(default=None, max_length=32768, description="The value.")
    value_from: FreeFormObject | None = Field(
        default=None, description="A source for the value: secretKeyRef, configMapKeyRef or fieldRef, as in a Pod."
    )

    @model_validator(mode="after")
    def _check(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"spec.spark.env {self.name!r}: set value or valueFrom, not both")
        if self.name in RESERVED_ENV:
            raise ValueError(
                f"spec.spark.env: {self.name!r} is set by the operator on every shard pod; choose another name"
            )
        return self


def _reserved_conf_rules() -> list[dict[str, str]]:
    """One CEL rule per key of ``RESERVED_SPARK_CONF`` (static messages cannot name a key found by a loop)."""
    return [
        cel(f"!('{key}' in self)", reserved_conf_message(key), reason="FieldValueForbidden")
        for key in RESERVED_SPARK_CONF
    ]


class SparkSpec(K8sModel):
    """Spark settings shared by every shard's driver pod; changing them rolls the shards (last-state)."""

    image: str = Field(min_length=1, max_length=1024, description="Container image of the shard runtime.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Image pull policy: Always, IfNotPresent or Never (Kubernetes default)."
    )
    resources: ResourceRequirements | None = Field(default=None, description="Resources of the driver pod.")
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description=(
            "ServiceAccount of the driver pod (default: the namespace's 'default', with no API token mounted "
            "unless executors run on Kubernetes). The chart creates 'taskshard-shard' in watched namespaces."
        ),
    )
    conf: dict[str, str] | None = Field(
        default=None,
        max_length=128,
        description="Extra Spark configuration; every key starts with 'spark.'. Keys the operator or the "
        "runtime set themselves (spark.master, the state store, s3a endpoint and credentials, executor placement) "
        "are refused.",
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": 4096, "description": "A Spark conf value."},
            **validations(
                cel(
                    "self.all(k, k.startsWith('spark.'))",
                    "spec.spark.conf: every key must start with 'spark.' (e.g. spark.sql.shuffle.partitions)",
                ),
                *_reserved_conf_rules(),
            ),
        },
    )
    executors: ExecutorsSpec | None = Field(default=None, description="Executors; default none (local mode).")
    env: list[EnvVar] | None = Field(
        default=None,
        max_length=64,
        description="Extra environment variables of the driver pod (e.g. TASKSHARD_EXTRA_JARS, AWS_REGION).",
    )
    trigger_interval: str = Field(
        default="1 second",
        max_length=64,
        pattern=r"^[0-9]{1,9} (milliseconds?|seconds?|minutes?|hours?)$",
        description="Micro-batch trigger interval, e.g. '500 milliseconds', '1 second', '2 minutes'.",
    )

    @model_validator(mode="after")
    def _check(self) -> SparkSpec:
        bad = [k for k in (self.conf or {}) if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"spec.spark.conf: every key must start with 'spark.' (got {bad[0]!r})")
        reserved = reserved_conf_problems(self.conf or {})
        if reserved:
            raise ValueError("\n".join(reserved))
        return self


class CheckpointRetention(StrEnum):
    """What happens to checkpoints and snapshots when the Task is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


class TaskSpec(K8sModel):
    """The user's manifest of a stream-processing task."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                "!has(self.initialShards) || self.initialShards <= self.maxKeyGroups",
                "spec.initialShards must be at most spec.maxKeyGroups (each shard needs one key group or more)",
                field_path=".initialShards",
            )
        )
    }

    max_key_groups: int = Field(
        ge=1,
        le=MAX_KEY_GROUPS_LIMIT,
        description=f"Number of key groups, 1..{MAX_KEY_GROUPS_LIMIT}: the most shards the task can ever have. "
        "keyGroup(key) = pmod(hash(key), maxKeyGroups). Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.maxKeyGroups is immutable: changing it would re-key all state")
        ),
    )
    initial_shards: int = Field(
        default=1,
        ge=1,
        le=MAX_KEY_GROUPS_LIMIT,
        description="Shards created with the task (1..maxKeyGroups, default 1); later, split shards to scale.",
    )
    key_field: str = Field(
        default="key",
        min_length=1,
        max_length=256,
        description="Event field holding the key (default 'key'); integer keys are used as decimal text. Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.keyField is immutable: changing it would re-key all state")
        ),
    )
    processor: ProcessorSpec = Field(description="The stateful per-key processor.")
    source: SourceSpec = Field(description="Where events come from.")
    sink: SinkSpec = Field(description="Where results go.")
    storage: StorageSpec = Field(
        description="Where recovery logs, snapshots and manifests live. Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.storage is immutable: existing checkpoints would be orphaned")
        ),
    )
    spark: SparkSpec = Field(description="Spark settings of the shard driver pods.")
    checkpoint_retention: CheckpointRetention = Field(
        default=CheckpointRetention.RETAIN,
        description="On Task deletion: Retain (default) keeps checkpoints and snapshots, Delete removes them.",
    )

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if self.initial_shards > self.max_key_groups:
            raise ValueError(
                f"spec.initialShards: {self.initial_shards} must be at most spec.maxKeyGroups ({self.max_key_groups})"
            )
        return self


class TaskPhase(StrEnum):
    """Lifecycle of a Task (``status.phase``), summarised from its active shards.

    ::

        Pending ──all active shards Running──> Running <──> Splitting (a shard is between
           │                                      │  ▲        SplitRequested and Split)
           │                                      ▼  │
           │                                    Degraded (an active shard is Failed or not Ready)
           └──invalid spec──> Failed        any ──deletion──> Stopping
    """

    PENDING = "Pending"
    """Shards are being created or have not started yet."""
    RUNNING = "Running"
    """Every active shard is Running."""
    SPLITTING = "Splitting"
    """At least one shard is splitting; the others run."""
    DEGRADED = "Degraded"
    """At least one active shard is Failed or not Ready; the operator is recovering it."""
    FAILED = "Failed"
    """The spec cannot be acted on (the Ready condition's message says why)."""
    STOPPING = "Stopping"
    """The Task is being deleted; shards are stopped and retention is applied."""


class ShardSummary(K8sModel):
    """One active shard of the Task (name, range, phase)."""

    name: str = Field(max_length=253, description="Name of the TaskShard.")
    key_groups: str = Field(max_length=32, description="Its range as 'start-end', meaning [start, end).")
    phase: str | None = Field(default=None, max_length=32, description="Its phase.")


class TaskStatus(K8sModel):
    """Observed state of a Task, written by the operator only (status subresource)."""

    phase: TaskPhase | None = Field(
        default=None, description="Lifecycle phase: Pending, Running, Splitting, Degraded, Failed or Stopping."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Conditions of the task (Ready, Tiled, Splitting), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the operator last acted on."
    )
    shards: int | None = Field(default=None, ge=0, description="Number of active shards (owning a range).")
    active_shards: list[ShardSummary] = Field(
        default_factory=list,
        max_length=MAX_KEY_GROUPS_LIMIT,
        description="The active shards in key-group order; their ranges tile [0, maxKeyGroups).",
    )
    template_hash: str | None = Field(
        default=None,
        max_length=64,
        description="Hash of the shard template (spark, processor, source, sink) the shards run; a change rolls them.",
    )


class Task(K8sModel):
    """A whole Task object (apiVersion, kind, metadata, spec, status)."""

    api_version: Literal["taskshard.io/v1alpha1"] = Field(
        default=f"{API_GROUP}/{API_VERSION}", description="taskshard.io/v1alpha1"
    )
    kind: Literal["Task"] = Field(default="Task", description="Task")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: TaskSpec = Field(description="The user's manifest.")
    status: TaskStatus | None = Field(default=None, description="Observed state of the task.")
