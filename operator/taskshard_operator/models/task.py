"""Task: the user's manifest (processor, source, sink, storage, key groups, Spark settings) and its status.

The processor, source, sink and storage are defined once, in ``spark_runtime.config`` (the shard runtime's config
models, which the operator copies into each shard's ``shard.json``): every field's name, type, limits, default and
cross-field validator is written there. The models here subclass them (with :class:`K8sModel`) and add only what
the Kubernetes API needs: descriptions and CEL rules (:func:`k8s_schema`), the ``spec.`` prefix of the field paths
in messages (``FIELD_PATH``), sub-objects typed as these subclasses, and the CRD type of free-form parameters.

Single-object invariants are CEL rules in the CRD and mirrored by pydantic validators (those of the
sub-objects are the runtime's, inherited; those of the whole spec are here): exactly one of each kind (processor,
source, sink, storage, volume), ``sum`` needs ``field``, ``initialShards <= maxKeyGroups`` and
``shards <= maxKeyGroups``, no ``spark.conf``
key the protocol owns (``spark_runtime.reserved_conf``), with ``partitionedByKey`` a ``maxKeyGroups`` that is a
multiple of the source's partition count (and, for Kafka, that count declared); ``maxKeyGroups``, ``keyField``,
``storage``, ``partitionedByKey`` and, with it, the partition count are immutable (changing them would orphan or
re-key state).
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from spark_runtime import config, kafka_client
from spark_runtime.config import JOURNAL_PARTITIONS_LIMIT, KAFKA_PARTITIONS_LIMIT, BuiltinProcessor
from spark_runtime.keygroups import MAX_KEY_GROUPS_LIMIT
from spark_runtime.protocol import DEFAULT_SNAPSHOTS_KEPT, RUN_CACHE_BYTES_ENV
from spark_runtime.reserved_conf import (
    RESERVED_SPARK_CONF,
    RESERVED_SPARK_CONF_PATTERNS,
    reserved_conf_message,
    reserved_conf_problems,
)
from taskshard_operator import local_disk, memory, naming
from taskshard_operator.memory import MIN_POD_MEMORY_MIB

from .base import (
    API_GROUP,
    API_VERSION,
    FreeFormObject,
    K8sModel,
    Quantity,
    cel,
    k8s_schema,
    validations,
)
from .common import TASK_CONDITION_TYPES, Condition, LiveCommon, enumerate_values
from .pod import PodTemplate, VolumeMount
from .shard import SplitBy

__all__ = [
    "BuiltinProcessor",
    "CheckpointRetention",
    "DirectorySink",
    "ExecutorsSpec",
    "JournalSource",
    "KafkaSink",
    "KafkaSource",
    "EventTimeSpec",
    "ProcessorSpec",
    "WindowSpec",
    "ResourceRequirements",
    "PersistentVolumeClaimRef",
    "EnvVar",
    "HandoverSpec",
    "S3Storage",
    "AutoscaleSpec",
    "ScaleUpRate",
    "ScalingDecision",
    "TaskAutoscale",
    "ShardSummary",
    "SinkSpec",
    "SourceSpec",
    "SparkSpec",
    "StorageSpec",
    "Task",
    "TaskPhase",
    "TaskScaling",
    "TaskSpec",
    "TaskStatus",
    "VolumeSpec",
]


def _one_of_rule(path: str, a: str, b: str) -> dict[str, str]:
    return cel(
        f"has(self.{a}) != has(self.{b})",
        f"{path}: exactly one of {path}.{a} or {path}.{b} must be set",
    )


class WindowSpec(config.WindowSpec, K8sModel):
    """A builtin processor's event-time window."""

    FIELD_PATH: ClassVar[str] = "spec.processor.window"
    model_config = k8s_schema(
        cel(
            "self.type != 'tumbling' || (has(self.sizeSeconds) && !has(self.slideSeconds) && !has(self.gapSeconds))",
            "spec.processor.window: type tumbling takes sizeSeconds (and neither slideSeconds nor gapSeconds)",
        ),
        cel(
            "self.type != 'sliding' || (has(self.sizeSeconds) && has(self.slideSeconds) && !has(self.gapSeconds))",
            "spec.processor.window: type sliding takes sizeSeconds and slideSeconds (and not gapSeconds)",
        ),
        cel(
            "self.type != 'session' || (has(self.gapSeconds) && !has(self.sizeSeconds) && !has(self.slideSeconds))",
            "spec.processor.window: type session takes gapSeconds (and neither sizeSeconds nor slideSeconds)",
        ),
        cel(
            "!has(self.slideSeconds) || !has(self.sizeSeconds) || self.slideSeconds <= self.sizeSeconds",
            "spec.processor.window.slideSeconds must be at most spec.processor.window.sizeSeconds",
            field_path=".slideSeconds",
        ),
        type="tumbling (fixed windows of sizeSeconds), sliding (windows of sizeSeconds starting every "
        "slideSeconds) or session (per key, closed after gapSeconds without a record).",
        size_seconds="tumbling and sliding: the window's length.",
        slide_seconds="sliding: how often a window starts (at most sizeSeconds).",
        gap_seconds="session: the inactivity that closes a key's session.",
        emit="final (default): each window's result once, when the watermark passes its end. updates: after every "
        "batch that changed the window; the last one is final.",
    )


class ProcessorSpec(config.ProcessorSpec, K8sModel):
    """The stateful per-key processor: a builtin or a Python class."""

    FIELD_PATH: ClassVar[str] = "spec.processor"
    model_config = k8s_schema(
        _one_of_rule("spec.processor", "builtin", "python"),
        cel(
            "!has(self.builtin) || self.builtin == 'count' || has(self.field)",
            "spec.processor.field is required when spec.processor.builtin is sum, min or max (the numeric event "
            "field it reads)",
            field_path=".field",
            reason="FieldValueRequired",
        ),
        cel(
            "!has(self.field) || (has(self.builtin) && self.builtin != 'count')",
            "spec.processor.field is only valid with spec.processor.builtin: sum, min or max",
            field_path=".field",
            reason="FieldValueForbidden",
        ),
        cel(
            "!has(self.window) || has(self.builtin)",
            "spec.processor.window is only valid with a builtin: a Python processor keeps its own windows with timers",
            field_path=".window",
            reason="FieldValueForbidden",
        ),
        builtin="A builtin processor: count, sum, min or max (per key, or per key and window with window). Exactly "
        "one of builtin or python.",
        field="For builtin sum, min and max: the numeric event field they read.",
        python="Import path of a Python processor class, 'package.module:ClassName'. Exactly one of builtin or python.",
    )

    parameters: FreeFormObject | None = Field(
        default=None, description="Free-form parameters passed to the processor as a JSON object."
    )
    """The runtime's ``dict[str, Any]``, typed for the CRD: kept as is by the apiserver (no pruning)."""
    window: WindowSpec | None = Field(  # type: ignore[assignment]
        default=None,
        description="For a builtin: aggregate per key and event-time window, run as Spark's native windowed "
        "aggregation (needs spec.eventTime). Cannot change on an existing Task.",
    )


class EventTimeSpec(config.EventTimeSpec, K8sModel):
    """The records' event time and the watermark's bounds."""

    FIELD_PATH: ClassVar[str] = "spec.eventTime"
    model_config = k8s_schema(
        cel(
            "has(self.field) != (has(self.kafkaTimestamp) && self.kafkaTimestamp)",
            "spec.eventTime: exactly one of spec.eventTime.field or spec.eventTime.kafkaTimestamp: true must be set",
        ),
        field="The event field holding each record's event time (a record without it, or not a number, is a dead "
        "letter). Events reach a Python processor with a column event_time (epoch milliseconds). Exactly one of "
        "field or kafkaTimestamp.",
        kafka_timestamp="true: the Kafka record's timestamp is the event time (the producer's CreateTime, or the "
        "broker's LogAppendTime when the topic says so). Needs spec.source.kafka.",
        format="With field: epochMillis (default) or epochSeconds (may have a fraction).",
        max_out_of_orderness_seconds="How far behind the largest event time seen the watermark trails (the "
        "out-of-orderness the Task tolerates). The watermark only moves forward, also across splits and merges.",
        allowed_lateness_seconds="A record whose event time is before watermark - allowedLatenessSeconds is late: "
        "a dead letter with reason late, counted once, never passed to the processor (default 0).",
    )


# ---------------------------------------------------------------- key groups nested in partitions
#
# With ``partitionedByKey: true`` (every record of a key is in one partition of the source), P partitions and
# G = maxKeyGroups, partition p holds the key groups [p*G/P, (p+1)*G/P) and a shard reads only the partitions whose
# block meets its range (spark_runtime.keygroups). So G must be a multiple of P (admission: CEL on TaskSpec, twin
# in TaskSpec._check), and the flag and P are immutable (transition rules on the source objects): changing either
# would move keys to other key groups, i.e. re-key all state.


def _cel_partitioned(obj: str) -> str:
    """CEL: the journal or kafka object ``obj`` declares ``partitionedByKey: true``."""
    return f"(has({obj}.partitionedByKey) && {obj}.partitionedByKey)"


def _cel_any_partitioned(source: str) -> str:
    """CEL: the source object ``source`` (journal or kafka) is partitioned by the key."""
    return (
        f"(has({source}.journal) && {_cel_partitioned(source + '.journal')}) || "
        f"(has({source}.kafka) && {_cel_partitioned(source + '.kafka')})"
    )


def _near_multiples(max_key_groups: int, partitions: int) -> list[int]:
    """The multiples of ``partitions`` next to ``max_key_groups`` that are valid maxKeyGroups (one or two)."""
    lower = max_key_groups // partitions * partitions
    return [v for v in (lower, lower + partitions) if 0 < v <= MAX_KEY_GROUPS_LIMIT]


def not_a_multiple_message(max_key_groups: int, kind: str, partitions: int) -> str:
    """The error of a ``maxKeyGroups`` that ``partitions`` does not divide (CEL builds the same text: see
    :func:`_multiple_rule`), e.g. ``spec.maxKeyGroups (128) must be a multiple of spec.source.kafka.partitions
    (3) when partitionedByKey is true: e.g. 126 or 129, or set partitions to a divisor of 128``."""
    near = " or ".join(map(str, _near_multiples(max_key_groups, partitions)))
    return (
        f"spec.maxKeyGroups ({max_key_groups}) must be a multiple of spec.source.{kind}.partitions ({partitions}) "
        f"when partitionedByKey is true: e.g. {near}, or set partitions to a divisor of {max_key_groups}"
    )


def _multiple_rule(kind: str) -> dict[str, str]:
    """The TaskSpec rule: with ``source.<kind>.partitionedByKey``, maxKeyGroups is a multiple of its partitions.

    The messageExpression is :func:`not_a_multiple_message` in CEL: the multiples of P around G are
    ``lower = G - G % P`` and ``lower + P``; only the valid ones are shown (``lower`` is 0 when G < P, and when
    ``lower + P`` passes the limit ``lower`` is positive, since P <= 10000 < limit). It uses ``format``, not
    ``+`` and ``string()``: the apiserver estimates a converted int as an unbounded string and refuses the
    concatenation's cost.
    """
    src, g = f"self.source.{kind}", "self.maxKeyGroups"
    p = f"{src}.partitions"
    lower = f"{g} - {g} % {p}"
    near = (
        f"{g} < {p} ? '%d'.format([{p}]) : {lower} + {p} > {MAX_KEY_GROUPS_LIMIT} ? '%d'.format([{lower}]) "
        f": '%d or %d'.format([{lower}, {lower} + {p}])"
    )
    return cel(
        f"!has({src}) || !{_cel_partitioned(src)} || !has({p}) || {g} % {p} == 0",
        f"spec.maxKeyGroups must be a multiple of spec.source.{kind}.partitions when partitionedByKey is true "
        "(each partition holds maxKeyGroups / partitions key groups): choose a multiple of partitions, or set "
        "partitions to a divisor of maxKeyGroups",
        field_path=".maxKeyGroups",
        message_expression=(
            f"'spec.maxKeyGroups (%d) must be a multiple of spec.source.{kind}.partitions (%d) when "
            "partitionedByKey is true: e.g. %s, or set partitions to a divisor of %d'"
            f".format([{g}, {p}, {near}, {g}])"
        ),
    )


def _immutable_partitioning_rules(kind: str, default_partitions: int, instead: str) -> list[dict[str, str]]:
    """Transition rules on ``spec.source.<kind>``: ``partitionedByKey`` never changes, and while it is true
    neither does ``partitions``. On the object, not the fields: ``oldSelf`` of a field exists only when the old
    object had the field, and the partition count is immutable only together with the flag."""
    new, old = _cel_partitioned("self"), _cel_partitioned("oldSelf")
    count = "(has({0}.partitions) ? {0}.partitions : " + str(default_partitions) + ")"
    why = "which key groups each partition holds, so changing it would re-key all state"
    return [
        cel(
            f"{new} == {old}",
            f"spec.source.{kind}.partitionedByKey is immutable: it decides {why}; create a new Task instead",
            field_path=".partitionedByKey",
        ),
        cel(
            f"!({new} && {old}) || {count.format('self')} == {count.format('oldSelf')}",
            f"spec.source.{kind}.partitions is immutable while partitionedByKey is true: the partition count "
            f"decides {why}; {instead}",
            field_path=".partitions",
        ),
    ]


class _PartitionedSource(K8sModel):
    """Mixin of the source kinds that may be partitioned by the key (the field is the runtime model's).

    ``partitionedByKey: false`` (the default) is left out of :meth:`to_k8s`: a Task that does not use the mode
    keeps the template hash and shard config it had before the field existed (an operator upgrade rolls no
    shard) and runs on runtimes that predate the field. ``True`` is always written.
    """

    @model_serializer(mode="wrap")
    def _omit_unpartitioned(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if not self.partitioned_by_key:  # the runtime model's field
            data.pop("partitionedByKey", None)
            data.pop("partitioned_by_key", None)
        return data


class JournalSource(config.JournalSource, _PartitionedSource):
    """A directory of append-only JSON-lines partition files (the embedded journal)."""

    model_config = k8s_schema(
        *_immutable_partitioning_rules(
            "journal", config.JournalSource.model_fields["partitions"].default, "create a new Task instead"
        ),
        path="Absolute path of the journal directory.",
        partitions=f"Number of partition files (1..{JOURNAL_PARTITIONS_LIMIT}). Immutable with partitionedByKey.",
        partitioned_by_key="True when every record of a key is in one partition file (the journal's producer "
        "writes them so): partition p then holds the key groups [p*maxKeyGroups/partitions, "
        "(p+1)*maxKeyGroups/partitions) and a shard reads only the files whose block meets its range. maxKeyGroups "
        "must be a multiple of partitions. Immutable, and so are partitions while it is true.",
    )


KAFKA_OPTIONS_DOC = (
    "Kafka client properties passed through to the clients, e.g. security.protocol: SASL_SSL, sasl.mechanism: "
    "SCRAM-SHA-512. Keys the runtime owns (bootstrap.servers, group.id, serializers, enable.auto.commit, "
    "auto.offset.reset, acks, enable.idempotence, transactional.id) and secrets (sasl.jaas.config, *password, "
    "inline keys and certificates) are refused by name: credentials come from credentialsSecret."
)
KAFKA_SECRET_DOC = (
    "A Secret in the Task's namespace with the Kafka client's credentials, each key optional: username and "
    "password (SASL PLAIN or SCRAM, with options sasl.mechanism), ca.crt (the CA of the brokers' certificates, "
    "PEM), tls.crt and tls.key (a client certificate and its PKCS#8 key, PEM). security.protocol defaults from "
    "what is there (SASL_SSL, SASL_PLAINTEXT or SSL) unless options sets it."
)


def _kafka_options_rules(side: str) -> list[dict[str, str]]:
    """CEL rules: ``options`` may not set a key the runtime owns (one rule per key, naming it) or any ``*password``
    (the model refuses keys case-insensitively and names each; rules stay cheap for the apiserver's budget)."""
    field = f"spec.{side}.kafka.options"
    rules = [
        cel(
            f"!has(self.options) || !('{key}' in self.options)",
            f"{field}.{key}: this Kafka client property is set by {owner}; remove it from {field}",
            field_path=".options",
            reason="FieldValueForbidden",
        )
        for key, owner in kafka_client.RESERVED.items()
    ]
    return rules


def _kafka_password_rule(side: str) -> dict[str, list[dict[str, str]]]:
    """The rule on ``options`` itself (it iterates the map): no key ending in ``password``."""
    return {
        "options": [
            cel(
                "self.all(k, !k.endsWith('password'))",
                f"spec.{side}.kafka.options: a key ending in 'password' holds a secret; credentials come from "
                f"spec.{side}.kafka.credentialsSecret",
                reason="FieldValueForbidden",
            )
        ]
    }


class KafkaSource(config.KafkaSource, _PartitionedSource):
    """A Kafka topic."""

    FIELD_PATH: ClassVar[str] = "spec.source.kafka"
    model_config = k8s_schema(
        *_kafka_options_rules("source"),
        cel(
            f"!{_cel_partitioned('self')} || has(self.partitions)",
            "spec.source.kafka.partitions is required when spec.source.kafka.partitionedByKey is true: the "
            "topic's partition count is part of the key-group mapping (a shard refuses to run, reason "
            "PartitionCountChanged, when the topic's real count differs)",
            field_path=".partitions",
            reason="FieldValueRequired",
        ),
        cel(
            f"!has(self.partitions) || {_cel_partitioned('self')}",
            "spec.source.kafka.partitions is only used with spec.source.kafka.partitionedByKey: true; remove "
            "it, or set partitionedByKey: true if the topic is keyed by the key field",
            field_path=".partitions",
            reason="FieldValueForbidden",
        ),
        *_immutable_partitioning_rules(
            "kafka", 0, "for a topic with another partition count, create a new Task instead"
        ),
        bootstrap_servers="Comma-separated host:port list of Kafka brokers.",
        topic="Kafka topic to read.",
        starting_offsets="Where a fresh task starts reading: earliest or latest.",
        partitioned_by_key="True when the topic is keyed by the key field (every record of a key in one partition): "
        "partition p then holds the key groups [p*maxKeyGroups/partitions, (p+1)*maxKeyGroups/partitions) and a "
        "shard reads only the partitions whose block meets its range. Needs partitions; maxKeyGroups must be a "
        "multiple of it. Immutable.",
        partitions=f"The topic's partition count (1..{KAFKA_PARTITIONS_LIMIT}), required with and only allowed "
        "with partitionedByKey: it is part of the key-group mapping, so a shard refuses to run (reason "
        "PartitionCountChanged) when the topic's real count differs. Immutable.",
        options=KAFKA_OPTIONS_DOC,
        credentials_secret=KAFKA_SECRET_DOC,
        field_rules=_kafka_password_rule("source"),
    )


class SourceSpec(config.SourceSpec, K8sModel):
    """Where events come from: exactly one of journal or kafka."""

    model_config = k8s_schema(
        _one_of_rule("spec.source", "journal", "kafka"),
        cel(
            f"has(self.journal) == has(oldSelf.journal) || "
            f"!({_cel_any_partitioned('self')} || {_cel_any_partitioned('oldSelf')})",
            "spec.source cannot switch between journal and kafka when either has partitionedByKey: true: the "
            "partitions decide which key groups each holds, so the switch would re-key all state; create a new "
            "Task instead",
        ),
    )

    journal: JournalSource | None = Field(default=None, description="Read a local journal directory.")
    kafka: KafkaSource | None = Field(default=None, description="Read a Kafka topic.")


class DirectorySink(config.DirectorySink, K8sModel):
    """Files in a directory."""

    model_config = k8s_schema(
        path="Absolute path of the output directory.",
        format="File format: jsonl or parquet.",
    )


class KafkaSink(config.KafkaSink, K8sModel):
    """A Kafka topic."""

    FIELD_PATH: ClassVar[str] = "spec.sink.kafka"
    model_config = k8s_schema(
        *_kafka_options_rules("sink"),
        field_rules=_kafka_password_rule("sink"),
        bootstrap_servers="Comma-separated host:port list of Kafka brokers.",
        topic="Kafka topic to write.",
        options=KAFKA_OPTIONS_DOC,
        credentials_secret=KAFKA_SECRET_DOC,
    )


class SinkSpec(config.SinkSpec, K8sModel):
    """Where results go: exactly one of directory or kafka."""

    model_config = k8s_schema(_one_of_rule("spec.sink", "directory", "kafka"))

    directory: DirectorySink | None = Field(default=None, description="Write files to a directory.")
    kafka: KafkaSink | None = Field(default=None, description="Write to a Kafka topic.")


class S3Storage(config.S3Storage, K8sModel):
    """An S3-compatible bucket."""

    model_config = k8s_schema(
        bucket="Bucket name (3..63 lowercase letters, digits, dots and dashes).",
        prefix="Key prefix inside the bucket.",
        endpoint="Endpoint URL (http:// or https://) of an S3-compatible service; default AWS.",
        credentials_secret="Secret in the Task's namespace with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
    )


class PersistentVolumeClaimRef(config.PersistentVolumeClaimRef, K8sModel):
    """A PersistentVolumeClaim in the Task's namespace."""

    model_config = k8s_schema(
        claim_name="Name of the PersistentVolumeClaim (ReadWriteMany when shards run on several nodes).",
    )


class VolumeSpec(config.VolumeSpec, K8sModel):
    """The volume shard pods mount for the shared filesystem paths: exactly one of hostPath or pvc."""

    model_config = k8s_schema(
        _one_of_rule("spec.storage.volume", "hostPath", "persistentVolumeClaim"),
        host_path="Absolute path on the node to mount.",
        mount_path="Where the volume is mounted in shard pods (default /data); task paths live under it.",
    )

    persistent_volume_claim: PersistentVolumeClaimRef | None = Field(
        default=None, description="A PersistentVolumeClaim to mount."
    )


class StorageSpec(config.StorageSpec, K8sModel):
    """Where recovery logs, snapshots and manifests live: exactly one of path or s3."""

    model_config = k8s_schema(
        _one_of_rule("spec.storage", "path", "s3"),
        path="Absolute path of a shared filesystem directory (on the volume below).",
    )

    s3: S3Storage | None = Field(default=None, description="An S3-compatible bucket.")
    volume: VolumeSpec | None = Field(
        default=None, description="How shard pods mount the shared paths (storage, journal, output)."
    )


def _memory_at_least(map_name: str) -> str:
    return f"quantity(string(self.{map_name}['memory'])).compareTo(quantity('{MIN_POD_MEMORY_MIB}Mi')) >= 0"


class ResourceRequirements(K8sModel):
    """Compute resources of a Spark container (as in a Pod's container resources)."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                f"(has(self.limits) && 'memory' in self.limits) ? {_memory_at_least('limits')} : "
                f"(!has(self.requests) || !('memory' in self.requests) || {_memory_at_least('requests')})",
                f"spec.spark.resources, spec.spark.executors.resources: {memory.TOO_SMALL}",
            )
        )
    }

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


RESERVED_ENV = ("TASKSHARD_TASK", "TASKSHARD_SHARD", "POD_NAME", "POD_NAMESPACE", RUN_CACHE_BYTES_ENV)
"""Env vars the operator sets on every driver pod itself (a Task cannot override them; the run cache's budget
follows ``spec.spark.tmpSizeLimit``)."""


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


DEFAULT_MOUNT_PATH = "/data"
"""Where shard pods mount ``spec.storage.volume`` when it names no ``mountPath``."""
STORAGE_MOUNT_TAKEN = (
    "spec.spark.volumeMounts: the storage volume's mount path (spec.storage.volume.mountPath) is the operator's"
)
UNKNOWN_MOUNT = "spec.spark.volumeMounts: every mount names a volume of spec.spark.podTemplate.spec.volumes"
UI_CONF = "spark.ui.enabled"
UI_IN_CONF = (
    f'spec.spark.conf["{UI_CONF}"]: the web UI is turned on by spec.spark.ui: true, not by spark.conf (it may only '
    'say "false", the default)'
)


def _reserved_conf_rules() -> list[dict[str, str]]:
    """One CEL rule per key of ``RESERVED_SPARK_CONF`` (static messages cannot name a key found by a loop), and one
    per pattern of ``RESERVED_SPARK_CONF_PATTERNS`` whose message names the first matching key."""
    exact = [
        cel(f"!('{key}' in self)", reserved_conf_message(key), reason="FieldValueForbidden")
        for key in RESERVED_SPARK_CONF
    ]
    by_pattern = []
    for pattern, reserved in RESERVED_SPARK_CONF_PATTERNS.items():
        matching = f"self.filter(k, k.matches(r'{pattern}'))"
        by_pattern.append(
            cel(
                f"size({matching}) == 0",
                f"spec.spark.conf: a key matching {pattern} is reserved: {reserved.why}; remove the key",
                reason="FieldValueForbidden",
                message_expression=(
                    f'"spec.spark.conf[\\"" + {matching}[0] + "\\"] is reserved: '
                    f'{reserved.why.replace(chr(34), chr(39))}; remove the key"'
                ),
            )
        )
    return exact + by_pattern


class SparkSpec(K8sModel):
    """Spark settings shared by every shard's driver pod; changing them rolls the shards (last-state)."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.podTemplate) && "
                "has(self.podTemplate.spec) && has(self.podTemplate.spec.volumes) && "
                "self.podTemplate.spec.volumes.exists(v, v.name == m.name))",
                UNKNOWN_MOUNT,
                field_path=".volumeMounts",
            ),
            cel(
                "!has(self.tmpSizeLimit) || "
                f"quantity(string(self.tmpSizeLimit)).compareTo(quantity('{local_disk.MIN_TMP_MIB}Mi')) >= 0",
                f"spec.spark.tmpSizeLimit: {local_disk.TOO_SMALL}",
                field_path=".tmpSizeLimit",
            ),
        )
    }

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
            "ServiceAccount of the driver pod, with no API token mounted unless executors run on Kubernetes "
            "(default: the chart's shard ServiceAccount, 'taskshard-shard', in the namespaces where the chart "
            "created it; else the namespace's 'default')."
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
                cel(
                    f"!('{UI_CONF}' in self) || self['{UI_CONF}'] == 'false'",
                    UI_IN_CONF,
                    reason="FieldValueForbidden",
                ),
            ),
        },
    )
    executors: ExecutorsSpec | None = Field(default=None, description="Executors; default none (local mode).")
    ui: bool = Field(
        default=False,
        description="Serve Spark's web UI on the driver's port 4040 (default false: off). The UI shows the "
        "shard's configuration and has links that kill jobs, and anyone who reaches the pod reaches it; turn it on "
        "only to debug, and reach it with kubectl port-forward.",
    )
    env: list[EnvVar] | None = Field(
        default=None,
        max_length=64,
        description="Extra environment variables of the driver pod (e.g. TASKSHARD_EXTRA_JARS, AWS_REGION).",
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="Merged into every shard pod, driver and executors: nodeSelector, tolerations, affinity, "
        "topologySpreadConstraints, imagePullSecrets, priorityClassName, volumes, labels and annotations. The "
        "fields the operator owns (containers, securityContext, serviceAccountName, ...) are refused by name.",
    )
    volume_mounts: list[VolumeMount] | None = Field(
        default=None,
        max_length=16,
        description="Mounts of spec.spark.podTemplate.spec.volumes in the driver and executor containers.",
    )
    tmp_size_limit: Quantity | None = Field(
        default=None,
        description=f"Size limit of the /tmp emptyDir of every shard pod, driver and executors (default "
        f"{local_disk.DEFAULT_TMP_SIZE_LIMIT}, at least {local_disk.MIN_TMP_MIB}Mi): the run cache keeps a quarter "
        "of it; RocksDB's working copies and Spark's local files use the rest. A pod past it is evicted.",
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
        volumes = self.pod_template.spec.volume_names() if self.pod_template and self.pod_template.spec else set()
        unknown = [m.name for m in self.volume_mounts or [] if m.name not in volumes]
        if unknown:
            raise ValueError(f'spec.spark.volumeMounts: "{unknown[0]}": {UNKNOWN_MOUNT.split(": ", 1)[1]}')
        small = local_disk.too_small(self.tmp_size_limit)
        if small:
            raise ValueError(small)
        ui = (self.conf or {}).get(UI_CONF)
        if ui is not None and ui != "false":
            raise ValueError(f'spec.spark.conf["{UI_CONF}"]: {json.dumps(ui)}: {UI_IN_CONF.split(": ", 1)[1]}')
        return self


SHARDS_LIMIT_REASON = "each shard owns one key group or more, so a Task has at most maxKeyGroups shards"


def shards_over_limit_message(shards: int, max_key_groups: int) -> str:
    """The error of a ``spec.shards`` above ``maxKeyGroups`` (the CRD's CEL messageExpression builds the same text),
    e.g. ``spec.shards: 9999 must be at most spec.maxKeyGroups (16): each shard owns ...``."""
    return f"spec.shards: {shards} must be at most spec.maxKeyGroups ({max_key_groups}): {SHARDS_LIMIT_REASON}"


AUTOSCALE_SECONDS_LIMIT = 86_400


class AutoscaleSpec(K8sModel):
    """``spec.autoscale``: the operator sizes the Task itself (``taskshard_operator.autoscale`` has the rules)."""

    model_config = {
        "json_schema_extra": validations(
            cel(
                "self.minShards <= self.maxShards",
                "spec.autoscale.minShards must be at most spec.autoscale.maxShards",
                field_path=".minShards",
                message_expression=(
                    "'spec.autoscale.minShards: %d must be at most spec.autoscale.maxShards (%d)'"
                    ".format([self.minShards, self.maxShards])"
                ),
            ),
        )
    }

    min_shards: int = Field(
        default=1, ge=1, le=MAX_KEY_GROUPS_LIMIT, description="The fewest active shards (default 1)."
    )
    max_shards: int = Field(
        ge=1, le=MAX_KEY_GROUPS_LIMIT, description="The most active shards (at most spec.maxKeyGroups)."
    )
    target_lag_seconds: int = Field(
        default=60,
        ge=1,
        le=AUTOSCALE_SECONDS_LIMIT,
        description="The most seconds any shard may need to work off its lag (status.live.lagSeconds) before the "
        "Task grows by one shard (default 60). It shrinks by one when every shard's lag is at most a quarter of "
        "it (and the rate dropped well below the one that made the autoscaler grow it).",
    )
    stabilization_seconds: int = Field(
        default=60,
        ge=0,
        le=AUTOSCALE_SECONDS_LIMIT,
        description="How long the lag must stay above the target (or the Task cold) without a break, on a quiet "
        "Task, before the autoscaler acts (default 60).",
    )
    cooldown_seconds: int = Field(
        default=300,
        ge=0,
        le=AUTOSCALE_SECONDS_LIMIT,
        description="The least seconds between the autoscaler's last change and a scale-down (default 300); a "
        "scale-up waits only for the stabilization.",
    )

    @model_validator(mode="after")
    def _check(self) -> AutoscaleSpec:
        if self.min_shards > self.max_shards:
            raise ValueError(
                f"spec.autoscale.minShards: {self.min_shards} must be at most spec.autoscale.maxShards "
                f"({self.max_shards})"
            )
        return self


MERGE_STALL_SECONDS = 600
SPLIT_STALL_SECONDS = 900
NO_PROGRESS_SECONDS = 300


class HandoverSpec(K8sModel):
    """``spec.handover``: bounds of the Task's hand-overs (splits and merges)."""

    merge_stall_seconds: int = Field(
        default=MERGE_STALL_SECONDS,
        ge=30,
        le=AUTOSCALE_SECONDS_LIMIT,
        description="How long an accepted merge may take before its shards and the Task show Degraded=True, reason "
        "MergeStalled, naming what it waits for (default 600). While one parent has drained and the other has "
        "not, the first one's range has no output; with Kafka retention a merge that never ends loses input. A "
        "merge stays withdrawable (remove spec.merge) until a parent has drained.",
    )
    split_stall_seconds: int = Field(
        default=SPLIT_STALL_SECONDS,
        ge=30,
        le=AUTOSCALE_SECONDS_LIMIT,
        description="How long an accepted split may go without its parent draining before the parent and the Task "
        "show Degraded=True, reason SplitStalled, naming what it waits for (default 900): children that cannot "
        "start, or that never catch up with a saturated parent. A split stays withdrawable (remove spec.split: "
        "the parent keeps its range) until the parent has drained.",
    )


AUTOSCALE_EXCLUDES_SHARDS = (
    "spec.shards and spec.autoscale exclude each other: with spec.autoscale the operator chooses the shard count "
    "itself (status.autoscale.desiredShards); remove spec.shards, or spec.autoscale to set the count by hand "
    "(kubectl scale task NAME --replicas N)"
)


class HistorySpec(K8sModel):
    """How much of a Task's history the operator and its shards keep: retired TaskShards, and running shards' own
    snapshots."""

    retired_shards: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="Split parents and merged-away shards kept per Task, the newest by their final checkpoint "
        "(default 10). Older ones are pruned once every successor has committed a batch of its own: a prune pod "
        "removes their recovery logs and snapshots (storage on S3 or on spec.storage.volume; their lineage and "
        "drain records stay), then their TaskShards are deleted.",
    )
    snapshots: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description=f"Snapshots of its own a running shard keeps: the newest complete ones, by batch (default "
        f"{DEFAULT_SNAPSHOTS_KEPT}). A shard writes one at each SIGTERM stop (a savepoint) and one for each split it "
        "hands over (the pre-copy); older ones are removed when its pod starts. The pre-copy of a hand-over in "
        "progress is always kept, and a shard that drained keeps all of its own (its successors restore them).",
    )


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
            ),
            cel(
                "!has(self.shards) || self.shards <= self.maxKeyGroups",
                f"spec.shards must be at most spec.maxKeyGroups: {SHARDS_LIMIT_REASON}",
                field_path=".shards",
                message_expression=(
                    f"'spec.shards: %d must be at most spec.maxKeyGroups (%d): {SHARDS_LIMIT_REASON}'"
                    ".format([self.shards, self.maxKeyGroups])"
                ),
            ),
            cel(
                "!has(self.autoscale) || self.autoscale.maxShards <= self.maxKeyGroups",
                "spec.autoscale.maxShards must be at most spec.maxKeyGroups",
                field_path=".autoscale.maxShards",
                message_expression=(
                    f"'spec.autoscale.maxShards: %d must be at most spec.maxKeyGroups (%d): {SHARDS_LIMIT_REASON}'"
                    ".format([self.autoscale.maxShards, self.maxKeyGroups])"
                ),
            ),
            cel(
                "!has(self.autoscale) || !has(self.shards)",
                AUTOSCALE_EXCLUDES_SHARDS,
                field_path=".shards",
                reason="FieldValueForbidden",
            ),
            _multiple_rule("journal"),
            _multiple_rule("kafka"),
            cel(
                "!has(self.eventTime) || has(self.processor.python) || has(self.processor.window)",
                f"spec.{config.EVENT_TIME_NEEDS_PYTHON}",
                field_path=".eventTime",
                reason="FieldValueForbidden",
            ),
            cel(
                "!has(self.processor.window) || has(self.eventTime)",
                f"spec.{config.WINDOW_NEEDS_EVENT_TIME}",
                field_path=".processor.window",
                reason="FieldValueRequired",
            ),
            cel(
                "!has(self.processor.window) || !has(self.eventTime) || !has(self.eventTime.allowedLatenessSeconds)"
                " || self.eventTime.allowedLatenessSeconds == 0.0",
                f"spec.{config.WINDOW_NO_LATENESS}",
                field_path=".eventTime.allowedLatenessSeconds",
            ),
            cel(
                "!has(self.eventTime) || !has(self.eventTime.kafkaTimestamp) || !self.eventTime.kafkaTimestamp"
                " || has(self.source.kafka)",
                f"spec.{config.EVENT_TIME_KAFKA_ONLY}",
                field_path=".eventTime.kafkaTimestamp",
                reason="FieldValueForbidden",
            ),
            cel(
                "has(self.processor.window) == has(oldSelf.processor.window) && (!has(self.processor.window) || "
                "self.processor.window == oldSelf.processor.window)",
                "spec.processor.window cannot be added, removed or changed on an existing Task: its shards' state is "
                "kept per window (create a new Task)",
                field_path=".processor.window",
            ),
            cel(
                "!has(self.spark.volumeMounts) || !has(self.storage.volume) || self.spark.volumeMounts.all(m, "
                f"m.mountPath != (has(self.storage.volume.mountPath) ? self.storage.volume.mountPath : "
                f"'{DEFAULT_MOUNT_PATH}'))",
                STORAGE_MOUNT_TAKEN,
                field_path=".spark.volumeMounts",
            ),
            cel(
                "has(self.eventTime) == has(oldSelf.eventTime)",
                "spec.eventTime cannot be added to or removed from an existing Task: its shards' checkpoints keep "
                "their time mode (create a new Task)",
                field_path=".eventTime",
            ),
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
        description="Shards created with the task (1..maxKeyGroups, default 1). Immutable: to scale a running "
        "task, set spec.shards (kubectl scale task NAME --replicas N) or split a shard (kubectl edit taskshard "
        "NAME: spec.split.requested: true).",
        json_schema_extra=validations(
            cel(
                "self == oldSelf",
                "spec.initialShards is immutable: it only sets the shards a new task starts with, and changing it "
                "would create shards over ranges that running shards own; to scale, set spec.shards (kubectl scale "
                "task NAME --replicas N) or split a shard (kubectl edit taskshard NAME: spec.split.requested: true)",
            )
        ),
    )
    shards: int | None = Field(
        default=None,
        ge=1,
        le=MAX_KEY_GROUPS_LIMIT,
        description="The desired number of active shards (1..maxKeyGroups), the replicas of the scale subresource "
        "(kubectl scale task NAME --replicas N, a HorizontalPodAutoscaler, KEDA). While it is above the active "
        "shards, the operator splits one shard at a time: the one with the most input rows over the last five "
        "minutes, by load when it has a load map, else at the midpoint. While it is below, it merges one pair of "
        "adjacent shards at a time: the pair with the fewest input rows, else the narrowest. Unset (default): "
        "the operator never changes the shard count on its own. Not part of the shard template: changing it rolls "
        "no shard.",
    )
    autoscale: AutoscaleSpec | None = Field(
        default=None,
        description="The operator sizes the Task itself on its shards' lag: one split when the worst lag stays "
        "above targetLagSeconds, one merge of the coldest adjacent pair when the Task stays cold past the "
        "cooldown, within [minShards, maxShards]; every decision is an event and in status.autoscale. Excludes "
        "spec.shards.",
    )
    handover: HandoverSpec | None = Field(
        default=None, description="Bounds of the Task's hand-overs (defaults apply when unset)."
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
    event_time: EventTimeSpec | None = Field(
        default=None,
        description="Event time: the field holding each record's time, the watermark's out-of-orderness and the "
        "allowed lateness (a Python processor only). Late records are dead letters (reason late). Cannot be added "
        "to or removed from an existing Task (the shards' checkpoints keep their time mode).",
    )
    source: SourceSpec = Field(description="Where events come from.")
    sink: SinkSpec = Field(description="Where results go.")
    storage: StorageSpec = Field(
        description="Where recovery logs, snapshots and manifests live. Immutable.",
        json_schema_extra=validations(
            cel("self == oldSelf", "spec.storage is immutable: existing checkpoints would be orphaned")
        ),
    )
    spark: SparkSpec = Field(description="Spark settings of the shard driver pods.")
    history: HistorySpec | None = Field(
        default=None, description="Retired TaskShards kept per Task (default: the newest 10)."
    )
    checkpoint_retention: CheckpointRetention = Field(
        default=CheckpointRetention.RETAIN,
        description="On Task deletion: Retain (default) keeps checkpoints and snapshots, Delete removes them.",
    )
    no_progress_seconds: int = Field(
        default=NO_PROGRESS_SECONDS,
        ge=30,
        le=AUTOSCALE_SECONDS_LIMIT,
        description="How long a shard's batch may run without committing before the shard and its Task show "
        "Ready=False and Degraded=True, reason NoProgress (default 300): a hung batch, a source that cannot be "
        "read, a processor that never returns. The autoscaler holds while a shard shows it. Set it above the "
        "longest batch you expect (a first batch that restores a large state takes longest). Not part of the shard "
        "template: changing it rolls no shard.",
    )
    suspend: bool = Field(
        default=False,
        description="true stops every shard at a micro-batch boundary with a savepoint and keeps no pods (shards "
        "show phase Suspended and keep their ranges; a split in progress finishes first, a new split request "
        "waits); false (default) resumes each shard from its recovery log, exactly where it stopped.",
    )

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if self.initial_shards > self.max_key_groups:
            raise ValueError(
                f"spec.initialShards: {self.initial_shards} must be at most spec.maxKeyGroups ({self.max_key_groups})"
            )
        if self.shards is not None and self.shards > self.max_key_groups:
            raise ValueError(shards_over_limit_message(self.shards, self.max_key_groups))
        if self.autoscale is not None:
            if self.shards is not None:
                raise ValueError(AUTOSCALE_EXCLUDES_SHARDS)
            if self.autoscale.max_shards > self.max_key_groups:
                raise ValueError(
                    f"spec.autoscale.maxShards: {self.autoscale.max_shards} must be at most spec.maxKeyGroups "
                    f"({self.max_key_groups}): {SHARDS_LIMIT_REASON}"
                )
        for message in config.time_problems(self.processor, self.event_time):
            raise ValueError(f"spec.{message}")
        if self.event_time is not None and self.event_time.kafka_timestamp and self.source.kafka is None:
            raise ValueError(f"spec.{config.EVENT_TIME_KAFKA_ONLY}")
        for field, resources in (
            ("spec.spark.resources", self.spark.resources),
            ("spec.spark.executors.resources", self.spark.executors.resources if self.spark.executors else None),
        ):
            small = memory.too_small(field, resources)
            if small:
                raise ValueError(small)
        volume = self.storage.volume
        storage_path = (volume.mount_path or DEFAULT_MOUNT_PATH) if volume is not None else None
        if any(m.mount_path == storage_path for m in self.spark.volume_mounts or []):
            raise ValueError(
                f'{STORAGE_MOUNT_TAKEN.split(": ", 1)[0]}: "{storage_path}": {STORAGE_MOUNT_TAKEN.split(": ", 1)[1]}'
            )
        partitions = self.source.nested_partitions
        if partitions is not None and self.max_key_groups % partitions:
            raise ValueError(not_a_multiple_message(self.max_key_groups, self.source.kind, partitions))
        return self


class TaskPhase(StrEnum):
    """Lifecycle of a Task (``status.phase``), summarised from its active shards.

    ::

        Pending ──all active shards Running──> Running <──> Splitting (a shard is between
           │                                      │  ▲        SplitRequested and Split; Merging likewise)
           │                                      ▼  │
           │                                    Degraded (an active shard is Failed or not Ready)
           └──invalid spec──> Failed        any ──deletion──> Stopping
                                            any ──spec.suspend: true──> Suspended ──false──> Pending
    """

    PENDING = "Pending"
    """Shards are being created or have not started yet."""
    RUNNING = "Running"
    """Every active shard is Running."""
    SPLITTING = "Splitting"
    """At least one shard is splitting; the others run."""
    MERGING = "Merging"
    """Two shards are merging into one (and none is splitting); the others run."""
    DEGRADED = "Degraded"
    """At least one active shard is Failed or not Ready; the operator is recovering it."""
    FAILED = "Failed"
    """The spec cannot be acted on (the Ready condition's message says why)."""
    STOPPING = "Stopping"
    """The Task is being deleted; shards are stopped and retention is applied."""
    SUSPENDED = "Suspended"
    """``spec.suspend`` is true: the shards stop (or stopped) at a batch boundary and keep no pods."""


class ShardSummary(K8sModel):
    """One active shard of the Task (name, range, phase)."""

    name: str = Field(max_length=253, description="Name of the TaskShard.")
    key_groups: str = Field(max_length=32, description="Its range as 'start-end', meaning [start, end).")
    phase: str | None = Field(default=None, max_length=32, description="Its phase.")


class ScalingDecision(StrEnum):
    """What the operator last decided about ``spec.shards`` (``status.scaling.decision``; see
    ``taskshard_operator.scaling``)."""

    NO_CHANGE = "NoChange"
    """The active shards are as many as ``spec.shards``."""
    WAIT = "Wait"
    """Another shard count is wanted, but no split or merge can start now (a hand-over in progress, a shard not
    running and emitting, a roll, a suspension): the next one starts once that is over."""
    SPLIT = "Split"
    """More shards are wanted: the operator set ``spec.split`` on ``status.scaling.shard``."""
    MERGE = "Merge"
    """Fewer shards are wanted: the operator set ``spec.merge`` on ``status.scaling.shard``, naming
    ``status.scaling.mergeWith``."""


class TaskScaling(K8sModel):
    """The operator's last decision about ``spec.shards`` (absent while spec.shards is unset)."""

    desired_shards: int = Field(ge=1, le=MAX_KEY_GROUPS_LIMIT, description="spec.shards the decision was made for.")
    active_shards: int = Field(ge=0, le=MAX_KEY_GROUPS_LIMIT, description="Active shards when it was made.")
    decision: ScalingDecision = Field(description=f"The decision: {enumerate_values(ScalingDecision)}.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason, as in the Scaled condition.",
    )
    message: str = Field(default="", max_length=32768, description="What was decided and why.")
    shard: str | None = Field(
        default=None,
        max_length=253,
        description="Decision Split: the TaskShard whose spec.split was set; Merge: the one whose spec.merge was set.",
    )
    by: SplitBy | None = Field(default=None, description="Decision Split: how its split point is chosen.")
    merge_with: str | None = Field(
        default=None, max_length=253, description="Decision Merge: the right shard the shard merges with."
    )
    last_transition_time: datetime = Field(
        description="When the decision, its reason, spec.shards or the shard last changed (RFC 3339 date-time)."
    )


class ScaleUpRate(K8sModel):
    """The Task's rate when the autoscaler grew it to ``shards``."""

    shards: int = Field(ge=1, le=MAX_KEY_GROUPS_LIMIT, description="The count it grew to.")
    rate: float = Field(ge=0, description="The Task's input rows per second then.")


class TaskDisruptionBudget(K8sModel):
    """The Task's PodDisruptionBudget as the operator last set it."""

    name: str = Field(max_length=253, description="Its name: <task>-shards.")
    min_available: int = Field(ge=0, description="Driver pods a node drain leaves running: the shards minus one.")


class TaskAutoscale(K8sModel):
    """The autoscaler's last decision and its memory (absent without spec.autoscale)."""

    desired_shards: int = Field(ge=1, le=MAX_KEY_GROUPS_LIMIT, description="The shard count the autoscaler wants.")
    reason: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z][A-Za-z0-9]*$",
        description="CamelCase reason: LagAboveTarget, LoadBelowTarget, LagWithinTarget, Stabilizing, CatchingUp, "
        "CoolingDown, "
        "AtMaxShards, AtMinShards, BelowMinShards, AboveMaxShards, ScalingInProgress, ScalingStuck, Waiting, "
        "NoSignal.",
    )
    message: str = Field(default="", max_length=32768, description="What was decided and why.")
    worst_lag_seconds: int | None = Field(
        default=None, ge=0, description="The largest lagSeconds of the active shards the decision saw."
    )
    hot_since: datetime | None = Field(default=None, description="Since when the lag is above the target.")
    lag_at_hot_since: int | None = Field(default=None, ge=0, description="The worst lagSeconds at hotSince.")
    cold_since: datetime | None = Field(default=None, description="Since when the Task is cold.")
    last_scale_time: datetime | None = Field(default=None, description="When the autoscaler last changed the count.")
    scale_up_rates: list[ScaleUpRate] | None = Field(
        default=None,
        max_length=MAX_KEY_GROUPS_LIMIT,
        description="The rates at which the autoscaler grew the Task to each count it still has.",
    )
    last_transition_time: datetime = Field(description="When the reason or the desired count last changed.")


class LiveCounts(K8sModel):
    """Counters of one TaskShard as the Task remembers them, or of the deleted ones together."""

    dead_letters: int = Field(default=0, ge=0, description="Dead letters.")
    late_records: int | None = Field(default=None, ge=0, description="Late records (only with spec.eventTime).")


class ShardLiveCounts(LiveCounts):
    """The highest counters one TaskShard of the Task has shown."""

    name: str = Field(max_length=253, description="Name of the TaskShard.")


class TaskLiveCounters(K8sModel):
    """What the Task's deadLetters and lateRecords add up (``taskshard_operator.live.LifeCounts``): they count
    over the Task's life and never fall, though shards hand over, retire and are deleted."""

    shards: list[ShardLiveCounts] = Field(
        default_factory=list,
        description="The highest counts each TaskShard of the Task (active and retired) has shown, by name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    deleted: LiveCounts = Field(
        default_factory=LiveCounts,
        description="The counts of the Task's TaskShards deleted since (history retention), each folded in once.",
    )


class TaskLive(LiveCommon):
    """The Task's figures from its shards' ``status.live`` (written at most once per scrape interval): rate and lag
    of its active shards, the watermark of its slowest range, dead letters and late records over its life."""

    dead_letters: int = Field(
        default=0,
        ge=0,
        description="Dead letters over the Task's life: all its shards' (retired and deleted ones too, see "
        "counters); it never falls.",
    )
    watermark: datetime | None = Field(
        default=None,
        description="The lowest event-time watermark over every key-group range (only with spec.eventTime): how far "
        "the whole Task has come in event time. While a range's shard has not reported one yet (a successor just "
        "after a hand-over), the Task keeps its previous value; it never goes back.",
    )
    late_records: int | None = Field(
        default=None,
        ge=0,
        description="Records later than the watermark allows over the Task's life (only with spec.eventTime): all "
        "its shards' dead letters with reason late (retired and deleted shards too, see counters); it never falls.",
    )
    shards_reporting: int = Field(default=0, ge=0, description="How many active shards the sum covers.")
    counters: TaskLiveCounters | None = Field(
        default=None, description="What deadLetters and lateRecords add up: per TaskShard, and the deleted ones."
    )


class TaskStatus(K8sModel):
    """Observed state of a Task, written by the operator only (status subresource)."""

    phase: TaskPhase | None = Field(default=None, description=f"Lifecycle phase: {enumerate_values(TaskPhase)}.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description=f"Conditions of the task ({enumerate_values(TASK_CONDITION_TYPES)}), one per type.",
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
    live: TaskLive | None = Field(
        default=None,
        description="Rate and lag summed over its active shards, the watermark of its slowest range, and dead "
        "letters and late records over its life.",
    )
    selector: str | None = Field(
        default=None,
        max_length=512,
        description="Label selector of the Task's shard pods (and TaskShards): the scale subresource's "
        "labelSelectorPath, which a HorizontalPodAutoscaler uses to find the pods it measures.",
    )
    scaling: TaskScaling | None = Field(
        default=None, description="The last decision about spec.shards (absent while spec.shards is unset)."
    )
    autoscale: TaskAutoscale | None = Field(
        default=None, description="The autoscaler's last decision and memory (absent without spec.autoscale)."
    )
    disruption_budget: TaskDisruptionBudget | None = Field(
        default=None,
        description="The PodDisruptionBudget of the Task's driver pods (a node drain evicts one at a time).",
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


TASK_METADATA_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "maxLength": naming.TASK_NAME_LIMIT,
            "pattern": naming.TASK_NAME_PATTERN,
        }
    },
}
"""The only part of ``metadata`` a CRD schema may restrict: the Task's name (checked by the apiserver; no
description allowed there). See :data:`taskshard_operator.naming.TASK_NAME_LIMIT` for why."""
