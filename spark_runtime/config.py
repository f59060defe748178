"""The shard runtime's configuration: ``shard.json`` (or YAML), written by the operator, validated here.

Pure pydantic v2; this module imports neither pyspark nor kopf, because the operator validates the config
it builds with :class:`ShardConfig` before it writes the ConfigMap.

Shape (camelCase on the wire; Python attributes are snake_case)::

    {
      "task": "orders", "shard": "orders-0-64", "namespace": "default",
      "maxKeyGroups": 128, "keyGroups": {"start": 0, "end": 64}, "keyField": "key",
      "processor": {"builtin": "count"},                      # or {"builtin": "sum", "field": "amount"}
                                                              # or {"python": "pkg.mod:Class", "parameters": {...}}
      "source": {"journal": {"path": "/data/journal/orders", "partitions": 4}},
      "sink": {"directory": {"path": "/data/output/orders", "format": "jsonl"}},
      "storage": {"path": "/data/state"},
      "restoreFrom": {"parent": "orders-0-128", "manifest": "/data/state/.../manifest.json"},   # or null
      "mergeFrom": [{"parent": "orders-0-64", "manifest": ...}, {"parent": "orders-64-128", ...}],  # or null
      "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4"},
                "triggerInterval": "1 second"},
      "terminationMessagePath": "/dev/termination-log",
      "expectedBatch": 41,            # the last batch the operator saw committed, or null (RecoveryLogMissing)
      "allowFreshStart": false,       # the user's decision to start over when the recovery log is gone
      "metricsPort": 9108             # the live metrics endpoint (spark_runtime.live); 0: none
    }

``processor``, ``source``, ``sink`` and ``storage`` have exactly the shapes of the Task spec
(docs/design-contracts.md), so the operator copies them verbatim. Unknown fields are rejected.

This module is the single definition of those four objects: every field's name, type, limits, patterns and
default, and every cross-field validator, is written here (:class:`ProcessorSpec`, :class:`SourceSpec`,
:class:`SinkSpec`, :class:`StorageSpec` and their parts). The operator's Task models
(``taskshard_operator.models.task``) subclass these and add only what is Kubernetes-specific: descriptions and
CEL rules for the CRD schema, and the ``spec.`` prefix of the field paths in messages (``FIELD_PATH``). Two
classes extend the Task's shape with what only a shard config carries: :class:`ShardKafkaSource`
(``startingTimestamp``, set by the operator) and :class:`ShardSourceSpec`. This module never imports the operator,
kopf or kubernetes.

Sources of configuration (:func:`load_config`): a file (``--config``), else the environment variable
``TASKSHARD_CONFIG`` (a path) or ``TASKSHARD_CONFIG_JSON`` (the JSON text itself). Errors are raised as
:class:`ConfigError`, whose message lists every problem as ``<field path>: <value> ...: <what is valid>``.
"""

from __future__ import annotations

import json
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from spark_runtime import live
from spark_runtime.kafka_client import reserved_option_problems
from spark_runtime.keygroups import MAX_KEY_GROUPS_LIMIT, InvalidRangeError, KeyGrouping, KeyGroupRange
from spark_runtime.protocol import DEFAULT_SNAPSHOTS_KEPT
from spark_runtime.reserved_conf import Owner, reserved_conf_problems

__all__ = [
    "BuiltinProcessor",
    "ConfigError",
    "DirectorySink",
    "JournalSource",
    "KafkaSink",
    "KafkaSource",
    "KeyGroupsSpec",
    "PersistentVolumeClaimRef",
    "ProcessorSpec",
    "REHEARSE_CONF",
    "RestoreFrom",
    "S3Storage",
    "ShardConfig",
    "ShardKafkaSource",
    "ShardSourceSpec",
    "SinkSpec",
    "SourceSpec",
    "SparkSettings",
    "StorageSpec",
    "VolumeSpec",
    "WindowEmit",
    "WindowKind",
    "WindowSpec",
    "load_config",
    "parse_config",
    "parse_trigger_interval",
    "time_problems",
]

PYTHON_REF = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
"""``package.module:Class`` (a Python processor)."""
ABS_PATH = r"^/\S*$"
"""An absolute path without whitespace (journal, output and storage directories, volume paths)."""
KAFKA_TOPIC = r"^[A-Za-z0-9._-]+$"
KAFKA_SERVERS = r"^[^,\s]+:[0-9]+(,[^,\s]+:[0-9]+)*$"
"""A comma-separated ``host:port`` list."""
S3_BUCKET = r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$"
HTTP_URL = r"^https?://\S+$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An RFC 1123 subdomain: the name of most Kubernetes objects (at most 253 characters)."""
JOURNAL_PARTITIONS_LIMIT = 1024
KAFKA_PARTITIONS_LIMIT = 10000
TRIGGER_INTERVAL = r"^[0-9]{1,9} (milliseconds?|seconds?|minutes?|hours?)$"
NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_TRIGGER_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000}


class ConfigError(ValueError):
    """An invalid shard config. ``problems`` holds one ``"<path>: <message>"`` string per problem."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        where = f" in {source}" if source else ""
        super().__init__(f"invalid shard config{where}:\n  " + "\n  ".join(problems))


class _Model(BaseModel):
    """Base of the config models: camelCase aliases, unknown fields rejected, frozen values. These are the
    conventions of the operator's ``K8sModel`` too, which the Task models combine with the models here."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    def to_json_dict(self) -> dict[str, Any]:
        """The camelCase JSON form (``None`` fields dropped), as the operator writes it."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------- processor


class BuiltinProcessor(StrEnum):
    """Processors shipped with the runtime."""

    COUNT = "count"
    """Count events per key (result: bigint)."""
    SUM = "sum"
    """Sum the numeric event field ``processor.field`` per key (result: double)."""
    MIN = "min"
    """The smallest value of the numeric event field ``processor.field`` per key (result: double)."""
    MAX = "max"
    """The largest value of the numeric event field ``processor.field`` per key (result: double)."""

    @property
    def needs_field(self) -> bool:
        """Whether it reads ``processor.field`` (all but count)."""
        return self is not BuiltinProcessor.COUNT


class WindowKind(StrEnum):
    """The builtin processors' event-time windows."""

    TUMBLING = "tumbling"
    """Fixed windows of ``sizeSeconds`` aligned to the epoch; each record is in one."""
    SLIDING = "sliding"
    """Windows of ``sizeSeconds`` starting every ``slideSeconds``; a record is in every one that covers it."""
    SESSION = "session"
    """Per key, a window that closes after ``gapSeconds`` without a record; it grows while records come."""


class WindowEmit(StrEnum):
    """When a builtin window's result is written."""

    FINAL = "final"
    """Once, when the watermark passes the window's end (Spark's append mode)."""
    UPDATES = "updates"
    """After every batch that changed it, the last one final (Spark's update mode)."""


MAX_WINDOW_SECONDS = 7 * 86_400
"""The longest window size, slide and session gap (a week)."""


def _millis(seconds: float | None) -> int:
    return int(round((seconds or 0) * 1000))


class WindowSpec(_Model):
    """An event-time window for a builtin processor (needs the Task's ``eventTime``): ``tumbling`` with
    ``sizeSeconds``, ``sliding`` with ``sizeSeconds`` and ``slideSeconds`` (at most the size), or ``session`` with
    ``gapSeconds``; ``emit`` says when results are written."""

    FIELD_PATH: ClassVar[str] = "processor.window"

    type: WindowKind
    size_seconds: float | None = Field(default=None, ge=0.001, le=MAX_WINDOW_SECONDS)
    slide_seconds: float | None = Field(default=None, ge=0.001, le=MAX_WINDOW_SECONDS)
    gap_seconds: float | None = Field(default=None, ge=0.001, le=MAX_WINDOW_SECONDS)
    emit: WindowEmit = WindowEmit.FINAL

    @property
    def size_ms(self) -> int:
        return _millis(self.size_seconds)

    @property
    def slide_ms(self) -> int:
        """The slide (a tumbling window's is its size)."""
        return _millis(self.slide_seconds) if self.type == WindowKind.SLIDING else self.size_ms

    @property
    def gap_ms(self) -> int:
        return _millis(self.gap_seconds)

    def describe(self) -> str:
        """``tumbling-60000ms``, ``sliding-60000ms-20000ms`` or ``session-30000ms`` (part of the state format: a
        snapshot restores only into the same windows)."""
        if self.type == WindowKind.SESSION:
            return f"session-{self.gap_ms}ms"
        if self.type == WindowKind.SLIDING:
            return f"sliding-{self.size_ms}ms-{self.slide_ms}ms"
        return f"tumbling-{self.size_ms}ms"

    @model_validator(mode="after")
    def _check(self) -> Self:
        p = self.FIELD_PATH
        wanted = {
            WindowKind.TUMBLING: {"sizeSeconds"},
            WindowKind.SLIDING: {"sizeSeconds", "slideSeconds"},
            WindowKind.SESSION: {"gapSeconds"},
        }[self.type]
        given = {
            "sizeSeconds": self.size_seconds,
            "slideSeconds": self.slide_seconds,
            "gapSeconds": self.gap_seconds,
        }
        for name, value in given.items():
            if name in wanted and value is None:
                raise ValueError(f"{p}.{name} is required with {p}.type: {self.type.value}")
            if name not in wanted and value is not None:
                raise ValueError(f"{p}.{name} ({value}) is not valid with {p}.type: {self.type.value}")
        if self.type == WindowKind.SLIDING and self.slide_ms > self.size_ms:
            raise ValueError(
                f"{p}.slideSeconds ({self.slide_seconds}) must be at most {p}.sizeSeconds ({self.size_seconds})"
            )
        return self


class ProcessorSpec(_Model):
    """The stateful per-key processor: exactly one of ``builtin`` or ``python``; ``field`` with (and only with)
    ``builtin: sum``, ``min`` or ``max``; ``window`` with a builtin only."""

    FIELD_PATH: ClassVar[str] = "processor"
    """Where the object sits in the document being parsed; messages name its fields under it (the operator's
    Task model: ``spec.processor``)."""

    builtin: BuiltinProcessor | None = None
    field: str | None = Field(default=None, min_length=1, max_length=256)
    python: str | None = Field(default=None, max_length=512, pattern=PYTHON_REF)
    parameters: dict[str, Any] | None = None
    window: WindowSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        p = self.FIELD_PATH
        if (self.builtin is None) == (self.python is None):
            raise ValueError(
                "exactly one of builtin (count | sum | min | max) or python ('package.module:Class') must be set "
                f"(got builtin={_v(self.builtin)}, python={_v(self.python)})"
            )
        if self.builtin is not None and self.builtin.needs_field and self.field is None:
            raise ValueError(
                f"{p}.field is required with builtin: {self.builtin.value} (the numeric event field it reads)"
            )
        if self.field is not None and (self.builtin is None or not self.builtin.needs_field):
            raise ValueError(f"{p}.field ({self.field!r}) is only valid with builtin: sum, min or max")
        if self.window is not None and self.builtin is None:
            raise ValueError(
                f"{p}.window is only valid with a builtin: a Python processor keeps its own windows with timers"
            )
        return self


# ---------------------------------------------------------------- event time

MAX_TIME_BOUND_SECONDS = 7 * 86_400
"""The largest out-of-orderness and allowed lateness (a week): state for windows and timers is kept that long."""


class EventTimeSpec(_Model):
    """The records' event time and the watermark's bounds: a record field holding epoch milliseconds or seconds,
    or the Kafka record's timestamp (exactly one); the watermark trails the largest event time seen by
    ``maxOutOfOrdernessSeconds``; a record before ``watermark - allowedLatenessSeconds`` is late (a dead letter,
    reason ``late``)."""

    FIELD_PATH: ClassVar[str] = "eventTime"

    field: str | None = Field(default=None, min_length=1, max_length=256)
    kafka_timestamp: bool = False
    format: Literal["epochMillis", "epochSeconds"] = "epochMillis"
    max_out_of_orderness_seconds: float = Field(ge=0, le=MAX_TIME_BOUND_SECONDS)
    allowed_lateness_seconds: float = Field(default=0, ge=0, le=MAX_TIME_BOUND_SECONDS)

    @property
    def delay_ms(self) -> int:
        return int(round(self.max_out_of_orderness_seconds * 1000))

    @property
    def lateness_ms(self) -> int:
        return int(round(self.allowed_lateness_seconds * 1000))

    @property
    def field_type(self) -> str:
        """The record type the field is read as (a record whose field fails it is a dead letter)."""
        return "long" if self.format == "epochMillis" else "double"

    @model_validator(mode="after")
    def _one_clock(self) -> Self:
        if (self.field is None) == (not self.kafka_timestamp):
            raise ValueError(
                f"{self.FIELD_PATH}: exactly one of field (an event field) or kafkaTimestamp: true (the Kafka record's "
                f"timestamp) must be set (got field={_v(self.field)}, kafkaTimestamp={self.kafka_timestamp})"
            )
        return self

    def millis_sql(self, column: str) -> str:
        """SQL for the event time in epoch milliseconds from the field's column."""
        if self.format == "epochMillis":
            return f"cast(`{column}` as bigint)"
        return f"cast(round(`{column}` * 1000) as bigint)"


EVENT_TIME_NEEDS_PYTHON = (
    "eventTime needs a Python processor (processor.python) or a builtin with processor.window: a builtin without "
    "a window has no notion of time"
)
WINDOW_NEEDS_EVENT_TIME = "processor.window needs eventTime (the watermark that closes the windows)"
WINDOW_NO_LATENESS = (
    "eventTime.allowedLatenessSeconds must be 0 with processor.window: a window closes (and is written) when the "
    "watermark passes its end, and a record for a closed window is late; raise eventTime.maxOutOfOrdernessSeconds "
    "to wait longer"
)
EVENT_TIME_KAFKA_ONLY = "eventTime.kafkaTimestamp needs source.kafka (the journal's records have no timestamp)"


def time_problems(processor: ProcessorSpec, event_time: EventTimeSpec | None) -> list[str]:
    """What is wrong with the processor's and the event time's combination (messages name fields relative to
    ``spec``; empty: nothing)."""
    if event_time is not None and processor.python is None and processor.window is None:
        return [EVENT_TIME_NEEDS_PYTHON]
    if processor.window is not None and event_time is None:
        return [WINDOW_NEEDS_EVENT_TIME]
    if processor.window is not None and event_time is not None and event_time.lateness_ms:
        return [WINDOW_NO_LATENESS]
    return []


# ---------------------------------------------------------------- source


class JournalSource(_Model):
    """The embedded journal: ``<path>/p<N>.jsonl`` for N in ``0..partitions-1``, append-only JSON lines."""

    path: str = Field(min_length=2, max_length=4096, pattern=ABS_PATH)
    partitions: int = Field(default=1, ge=1, le=JOURNAL_PARTITIONS_LIMIT)
    partitioned_by_key: bool = False
    """Key groups nested in partitions (:mod:`spark_runtime.keygroups`): the journal's own producer keeps one key
    in one partition, so a shard reads only the partition files whose key-group block meets its range."""


KafkaOptions = dict[str, Annotated[str, Field(max_length=4096, description="A Kafka client property's value.")]]
"""Kafka client properties: ``name: value`` (names as Kafka spells them: checked by
:func:`spark_runtime.kafka_client.reserved_option_problems`)."""


class KafkaSource(_Model):
    """A Kafka topic, as a Task declares it (``spec.source.kafka``); the shard config adds the operator-set
    ``startingTimestamp`` (:class:`ShardKafkaSource`)."""

    FIELD_PATH: ClassVar[str] = "source.kafka"
    """Where the object sits in the document being parsed; messages name its fields under it (the operator's
    Task model: ``spec.source.kafka``)."""

    bootstrap_servers: str = Field(max_length=2048, pattern=KAFKA_SERVERS)
    topic: str = Field(min_length=1, max_length=249, pattern=KAFKA_TOPIC)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    partitioned_by_key: bool = False
    """Records of one key are always in one partition (keyed by the key field): key groups nest in partitions
    and a shard reads only the partitions whose block meets its range (``partitions`` is then required)."""
    partitions: int | None = Field(default=None, ge=1, le=KAFKA_PARTITIONS_LIMIT)
    """The topic's partition count, part of the key-group mapping with ``partitionedByKey``: a topic whose count
    differs stops the shard (``PartitionCountChanged``) before anything is processed under a wrong mapping."""
    options: KafkaOptions | None = Field(default=None, max_length=64)
    """Kafka client properties (consumer and admin client), e.g. ``security.protocol``
    (:mod:`spark_runtime.kafka_client`: the keys the runtime owns, and secrets, are refused by name)."""
    credentials_secret: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """A Secret with the client's credentials (keys ``username``, ``password``, ``ca.crt``, ``tls.crt``,
    ``tls.key``)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems = reserved_option_problems(self.options, f"{self.FIELD_PATH}.options")
        if problems:
            raise ValueError("; ".join(problems))
        if self.partitioned_by_key and self.partitions is None:
            raise ValueError(
                f"{self.FIELD_PATH}.partitions is required with partitionedByKey: true (the topic's partition "
                "count is part of the key-group mapping: a shard refuses to run, reason PartitionCountChanged, "
                "when the topic's real count differs)"
            )
        if self.partitions is not None and not self.partitioned_by_key:
            raise ValueError(
                f"{self.FIELD_PATH}.partitions ({self.partitions}) is only used with partitionedByKey: true; "
                "remove it, or set partitionedByKey: true if the topic is keyed by the key field"
            )
        return self


class ShardKafkaSource(KafkaSource):
    """``source.kafka`` of a shard config: the Task's :class:`KafkaSource` plus ``startingTimestamp`` (epoch ms),
    set by the operator, not the user: for ``startingOffsets: latest`` it is the Task's creation time, so every
    shard of the task starts at the same records however far apart the shards start (each partition at its first
    record at or after that time)."""

    starting_timestamp: int | None = Field(default=None, ge=0)


class SourceSpec(_Model):
    """Where events come from: exactly one of ``journal`` or ``kafka``."""

    journal: JournalSource | None = None
    kafka: KafkaSource | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        _exactly_one(journal=self.journal, kafka=self.kafka)
        return self

    @property
    def kind(self) -> Literal["journal", "kafka"]:
        return "journal" if self.journal is not None else "kafka"

    @property
    def nested_partitions(self) -> int | None:
        """The partition count key groups are nested in (``partitionedByKey: true``), else None."""
        spec = self.journal or self.kafka
        return spec.partitions if spec is not None and spec.partitioned_by_key else None

    @property
    def field_path(self) -> str:
        return f"source.{self.kind}"


class ShardSourceSpec(SourceSpec):
    """``source`` of a shard config: a Kafka source may carry the operator-set ``startingTimestamp``."""

    kafka: ShardKafkaSource | None = None


# ---------------------------------------------------------------- sink


class DirectorySink(_Model):
    """Files in a directory."""

    path: str = Field(min_length=2, max_length=4096, pattern=ABS_PATH)
    format: Literal["jsonl", "parquet"] = "jsonl"


class KafkaSink(_Model):
    """A Kafka topic."""

    FIELD_PATH: ClassVar[str] = "sink.kafka"

    bootstrap_servers: str = Field(max_length=2048, pattern=KAFKA_SERVERS)
    topic: str = Field(min_length=1, max_length=249, pattern=KAFKA_TOPIC)
    options: KafkaOptions | None = Field(default=None, max_length=64)
    """Kafka client properties (producer and admin client), as :attr:`KafkaSource.options`."""
    credentials_secret: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """A Secret with the client's credentials, as :attr:`KafkaSource.credentials_secret`."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems = reserved_option_problems(self.options, f"{self.FIELD_PATH}.options")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class SinkSpec(_Model):
    """Where results go: exactly one of ``directory`` or ``kafka``."""

    directory: DirectorySink | None = None
    kafka: KafkaSink | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        _exactly_one(directory=self.directory, kafka=self.kafka)
        return self


# ---------------------------------------------------------------- storage


class S3Storage(_Model):
    """An S3-compatible bucket. Credentials come from the environment only (:mod:`spark_runtime.storage`)."""

    bucket: str = Field(min_length=3, max_length=63, pattern=S3_BUCKET)
    prefix: str | None = Field(default=None, max_length=1024)
    endpoint: str | None = Field(default=None, max_length=2048, pattern=HTTP_URL)
    credentials_secret: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)


class PersistentVolumeClaimRef(_Model):
    """A PersistentVolumeClaim in the Task's namespace."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)


class VolumeSpec(_Model):
    """The volume shard pods mount for the shared filesystem paths: exactly one of ``hostPath`` or
    ``persistentVolumeClaim``. The operator mounts it; the runtime validates it and otherwise ignores it."""

    host_path: str | None = Field(default=None, max_length=4096, pattern=ABS_PATH)
    persistent_volume_claim: PersistentVolumeClaimRef | None = None
    mount_path: str = Field(default="/data", max_length=4096, pattern=ABS_PATH)

    @model_validator(mode="after")
    def _check(self) -> Self:
        _exactly_one(hostPath=self.host_path, persistentVolumeClaim=self.persistent_volume_claim)
        return self


class StorageSpec(_Model):
    """Where recovery logs, snapshots and manifests live: exactly one of ``path`` (a shared filesystem directory)
    or ``s3``."""

    path: str | None = Field(default=None, min_length=2, max_length=4096, pattern=ABS_PATH)
    s3: S3Storage | None = None
    volume: VolumeSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        _exactly_one(path=self.path, s3=self.s3)
        return self


# ---------------------------------------------------------------- the rest


class KeyGroupsSpec(_Model):
    """The shard's key-group range ``[start, end)``."""

    start: int = Field(ge=0, lt=MAX_KEY_GROUPS_LIMIT)
    end: int = Field(gt=0, le=MAX_KEY_GROUPS_LIMIT)

    @model_validator(mode="after")
    def _check(self) -> KeyGroupsSpec:
        if self.start >= self.end:
            raise ValueError(f"start ({self.start}) must be < end ({self.end}); the range is [start, end)")
        return self

    def to_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.start, self.end)


REHEARSE_CONF = "spark.taskshard.rehearse"
"""Spark conf key: ``false`` skips a restoring child's standby rehearsal (see :class:`SparkSettings`)."""


class RestoreFrom(_Model):
    """A split child's parent: its name and where its state is.

    ``manifest`` is the parent's snapshot manifest (it must exist), or the parent's drain summary
    ``.../shards/<parent>/drained.json`` (what the operator sets), which names the manifest: until that file exists
    the child is on standby (warm, processing nothing; see :mod:`spark_runtime.shard`)."""

    parent: str = Field(min_length=1, max_length=253)
    manifest: str = Field(min_length=1, max_length=4096)


class SparkSettings(_Model):
    """Spark settings of this shard's driver. ``conf`` keys must start with ``spark.``, and the keys the runtime sets
    itself (``spark_runtime.reserved_conf``, owner runtime: ``spark.master``, the state store, s3a endpoint and
    credentials) are refused by :class:`ShardConfig`; the keys the operator owns are expected here.

    Runtime tuning keys read from ``conf`` (all optional): ``spark.taskshard.maxBytesPerTrigger`` (journal
    bytes admitted per micro-batch, over all partitions; default unlimited) and
    ``spark.taskshard.partitionBytes`` (the largest byte range one Spark task reads; default 32 MiB) and
    ``spark.taskshard.keyGroupMetrics`` (``true``: count input rows per key group, the load map; see
    :mod:`spark_runtime.live`) and ``spark.taskshard.stateMapSeconds`` (with the load map: how often to count state
    rows per key group, the state map; default 60, 0: never; :mod:`spark_runtime.state_map`) and
    ``spark.taskshard.rehearse`` (``false``: a child that hands over by restore, a split child or a merged shard of
    a Task with event time or timers, skips its standby rehearsal and tells its parents it is ready as soon as its
    SparkSession runs: the hand-over starts minutes sooner on a busy machine, and its first batch runs on a colder
    JVM, a longer processing gap; default ``true``; :mod:`spark_runtime.rehearsal`).
    """

    master: str = Field(default="local[2]", min_length=1, max_length=1024)
    conf: dict[str, str] = Field(default_factory=dict)
    trigger_interval: str = Field(default="1 second", max_length=64)

    @field_validator("conf", mode="before")
    @classmethod
    def _conf_strings(cls, value: Any) -> Any:
        # Spark conf values are strings; accept numbers/booleans written without quotes in YAML.
        if isinstance(value, dict):
            return {k: _conf_value(v) for k, v in value.items()}
        return value

    @field_validator("conf")
    @classmethod
    def _conf_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"every key must start with 'spark.' (got {bad[0]!r}), e.g. spark.sql.shuffle.partitions")
        return value

    @field_validator("trigger_interval")
    @classmethod
    def _trigger(cls, value: str) -> str:
        if not re.match(TRIGGER_INTERVAL, value):
            raise ValueError(
                f"{value!r} is not a trigger interval; write '<n> <unit>' with unit milliseconds, seconds, "
                "minutes or hours, e.g. '500 milliseconds' or '1 second'"
            )
        return value


class ShardConfig(_Model):
    """Everything one shard pod needs to run (see the module docstring for the JSON shape)."""

    task: str = Field(min_length=1, max_length=253, pattern=NAME)
    shard: str = Field(min_length=1, max_length=253, pattern=NAME)
    namespace: str = Field(default="default", min_length=1, max_length=253)
    task_uid: str | None = Field(default=None, min_length=1, max_length=128)
    """The Task's ``metadata.uid`` (set by the operator): the identity its storage directory must hold
    (:mod:`spark_runtime.identity`); None skips the check."""
    max_key_groups: int = Field(ge=1, le=MAX_KEY_GROUPS_LIMIT)
    key_groups: KeyGroupsSpec
    key_field: str = Field(default="key", min_length=1, max_length=256)
    processor: ProcessorSpec
    event_time: EventTimeSpec | None = None
    source: ShardSourceSpec
    sink: SinkSpec
    storage: StorageSpec
    restore_from: RestoreFrom | None = None
    merge_from: list[RestoreFrom] | None = Field(default=None, min_length=2, max_length=2)
    """A merged child's two parents, left (lower key groups) first: adjacent shards whose ranges together are
    exactly ``keyGroups`` (checked against their manifests before anything is processed;
    :mod:`spark_runtime.merge`). Excludes ``restoreFrom``."""
    spark: SparkSettings = Field(default_factory=SparkSettings)
    termination_message_path: str = Field(default="/dev/termination-log", min_length=1, max_length=4096)
    expected_batch: int | None = Field(default=None, ge=-1)
    """The last batch the operator has seen this shard commit (``status.lastCheckpoint.batchId``): a recovery log
    that ends before it is missing or older, and the shard refuses to start (``RecoveryLogMissing``) instead of
    starting over from scratch. None: no batch seen yet."""
    ready_file: str | None = Field(default=None, min_length=1, max_length=4096)
    """Created once the shard writes to its sink (a split child: once it took over from its parent) and removed
    at start; the pod's readiness probe tests it. None: no such file."""
    heartbeat_file: str | None = Field(default=None, min_length=1, max_length=4096)
    """Touched at least every :data:`spark_runtime.shard.HEARTBEAT_SECONDS` while the runtime's poll loop runs,
    removed when a drain or stop begins (a long export is bounded by the pod's grace period, not this); the pod's
    liveness probe restarts a driver whose loop stopped (blocked in a storage call, a hung driver thread). None: no
    such file."""
    allow_fresh_start: bool = False
    """The user's decision (TaskShard annotation ``taskshard.io/allow-fresh-start: "true"``) to start a shard
    whose recovery log is missing or older than ``expectedBatch`` over from its source's start positions."""
    snapshots_kept: int = Field(default=DEFAULT_SNAPSHOTS_KEPT, ge=0, le=1000)
    """Complete snapshots of its own (savepoints, pre-copies) a running shard keeps; older ones are removed at its
    start (:mod:`spark_runtime.snapshot.retention`; the Task's ``spec.history.snapshots``)."""
    metrics_port: int = Field(default=live.METRICS_PORT, ge=0, le=65535)
    """The port of the live metrics endpoint (``http://<pod IP>:<metricsPort>/metrics``, Prometheus text; names
    in :mod:`spark_runtime.live`), served while ``run`` runs. 0 disables the endpoint."""

    @model_validator(mode="after")
    def _check(self) -> ShardConfig:
        if self.key_groups.end > self.max_key_groups:
            raise ValueError(
                f"keyGroups.end: {self.key_groups.end} must be <= maxKeyGroups ({self.max_key_groups}); "
                f"the range [{self.key_groups.start}, {self.key_groups.end}) must lie inside [0, maxKeyGroups)"
            )
        if self.source.nested_partitions is not None:
            try:
                KeyGrouping(self.max_key_groups, self.source.nested_partitions)
            except InvalidRangeError as exc:
                raise ValueError(f"{self.source.field_path}.partitionedByKey: {exc}") from None
        reserved = reserved_conf_problems(self.spark.conf, path="spark.conf", owners=(Owner.RUNTIME,))
        if reserved:
            raise ValueError("\n".join(reserved))
        enabled = self.spark.conf.get(live.KEY_GROUP_METRICS_CONF)
        if enabled is not None and enabled.lower() not in ("true", "false"):
            raise ValueError(
                f"spark.conf.{live.KEY_GROUP_METRICS_CONF}: {enabled!r} is invalid: expected true or false"
            )
        live.state_map_seconds(self.spark.conf)  # raises ValueError naming the key for a bad value
        rehearse = self.spark.conf.get(REHEARSE_CONF)
        if rehearse is not None and rehearse.lower() not in ("true", "false"):
            raise ValueError(f"spark.conf.{REHEARSE_CONF}: {rehearse!r} is invalid: expected true or false")
        for message in time_problems(self.processor, self.event_time):
            raise ValueError(message)
        if self.event_time is not None and self.event_time.kafka_timestamp and self.source.kafka is None:
            raise ValueError(EVENT_TIME_KAFKA_ONLY)
        if self.merge_from is not None:
            if self.restore_from is not None:
                raise ValueError("restoreFrom and mergeFrom exclude each other: a shard has one parent or two")
            names = [p.parent for p in self.merge_from]
            if len(set(names)) != len(names):
                raise ValueError(f"mergeFrom: names the same parent twice ({names[0]!r}); a merge joins two shards")
        return self

    @property
    def rehearse(self) -> bool:
        """Whether a standby child rehearses its restore plan (``spark.taskshard.rehearse``, default true)."""
        return self.spark.conf.get(REHEARSE_CONF, "true").lower() == "true"

    @property
    def parents(self) -> list[RestoreFrom]:
        """The shard's parents: none, a split parent, or a merge's two (left first)."""
        if self.merge_from is not None:
            return list(self.merge_from)
        return [self.restore_from] if self.restore_from is not None else []

    @property
    def range(self) -> KeyGroupRange:
        """The shard's key-group range as a :class:`KeyGroupRange`."""
        return self.key_groups.to_range()

    @property
    def key_grouping(self) -> KeyGrouping:
        """How records map to key groups: nested in the source's partitions with ``partitionedByKey``."""
        return KeyGrouping(self.max_key_groups, self.source.nested_partitions)

    @property
    def partitions_to_read(self) -> list[int] | None:
        """The source partitions this shard reads (None: all of them)."""
        return self.key_grouping.partitions_to_read(self.range)

    @property
    def trigger_ms(self) -> int:
        return parse_trigger_interval(self.spark.trigger_interval)


# ---------------------------------------------------------------- helpers


def _conf_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if value is None or isinstance(value, str | dict | list) else str(value)


def _v(value: Any) -> str:
    return "null" if value is None else repr(str(value))


def _exactly_one(**options: Any) -> None:
    chosen = [name for name, value in options.items() if value is not None]
    if len(chosen) != 1:
        names = " or ".join(options)
        raise ValueError(f"exactly one of {names} must be set (got {len(chosen)}: {chosen or 'none'})")


def parse_trigger_interval(text: str) -> int:
    """``"500 milliseconds"`` -> 500, ``"1 second"`` -> 1000, ``"2 minutes"`` -> 120000."""
    m = re.match(TRIGGER_INTERVAL, text)
    if not m:
        raise ValueError(f"trigger interval {text!r} is invalid, e.g. '1 second'")
    number, unit = text.split(" ")
    return int(number) * _TRIGGER_UNITS_MS[unit.rstrip("s")]


def _loc_path(loc: tuple[Any, ...]) -> str:
    """pydantic's ``loc`` tuple -> ``keyGroups.end`` / ``processor`` (aliases are already camelCase)."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif str(item).startswith(("function-", "model-")):  # validator frames, not fields
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(root)"


def _lookup(data: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    cur = data
    for item in loc:
        if isinstance(cur, dict) and item in cur:
            cur = cur[item]
        elif isinstance(cur, list) and isinstance(item, int) and 0 <= item < len(cur):
            cur = cur[item]
        else:
            return False, None
    return True, cur


def _format_errors(exc: ValidationError, data: Any) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        path = _loc_path(loc)
        found, value = _lookup(data, loc)
        msg = err.get("msg", "invalid")
        msg = msg.removeprefix("Value error, ")
        if not loc:  # a whole-config check: each line of its message starts with the field path already
            problems.extend(msg.splitlines())
        elif err.get("type") == "missing":
            problems.append(f"{path}: required field is missing")
        elif err.get("type") == "extra_forbidden":
            problems.append(f"{path}: unknown field (value {json.dumps(value, default=str)[:200]})")
        elif found:
            problems.append(f"{path}: {json.dumps(value, default=str)[:200]} is invalid: {msg}")
        else:
            problems.append(f"{path}: {msg}")
    return problems


def parse_config(data: Any, source: str | None = None) -> ShardConfig:
    """Validate a parsed JSON/YAML object; raise :class:`ConfigError` naming every bad field and value."""
    if not isinstance(data, dict):
        raise ConfigError([f"(root): expected a JSON object, got {type(data).__name__}"], source)
    try:
        return ShardConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, data), source) from None


def _parse_text(text: str, source: str) -> Any:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError([f"(file): not valid JSON: {exc}"], source) from None
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a project dependency
        raise ConfigError(["(file): not JSON, and PyYAML is not installed to read YAML"], source) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"(file): not valid JSON or YAML: {exc}"], source) from None


def load_config(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> ShardConfig:
    """Load the config from ``path``; without one, from ``$TASKSHARD_CONFIG`` (a path) or
    ``$TASKSHARD_CONFIG_JSON`` (inline JSON). JSON and YAML files are both accepted."""
    env = os.environ if env is None else env
    if path is None:
        path = env.get("TASKSHARD_CONFIG") or None
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([f"(file): cannot read {str(p)!r}: {exc.strerror or exc}"], str(p)) from None
        return parse_config(_parse_text(text, str(p)), str(p))
    inline = env.get("TASKSHARD_CONFIG_JSON")
    if inline:
        return parse_config(_parse_text(inline, "$TASKSHARD_CONFIG_JSON"), "$TASKSHARD_CONFIG_JSON")
    raise ConfigError(["(file): no config given; pass --config FILE or set TASKSHARD_CONFIG / TASKSHARD_CONFIG_JSON"])
