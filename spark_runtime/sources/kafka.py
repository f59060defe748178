"""The Kafka source: a shard reads the partitions that can hold its key groups and keeps its key groups natively.

Design (see spark_runtime/README.md, "Kafka"), two modes:

- **Partitioned by key** (``partitionedByKey: true`` with the topic's ``partitions``): every record of a key is
  in one partition (the producer keys records by the key field, as Kafka's default partitioner does), so key
  groups nest in partitions (:mod:`spark_runtime.keygroups`): partition ``p`` holds key groups
  ``[p * B, (p + 1) * B)``. A shard assigns exactly the partitions whose block meets its range; read
  amplification is about 1. The partition count is part of the mapping: a topic whose count differs from the
  declared one stops the shard at its preflight and before every batch is written (``PartitionCountChanged``,
  :meth:`KafkaReader.before_batch`), so nothing is processed under a wrong mapping.
- **Read everything** (default): Kafka's partitioning is the producers' business and independent of key groups,
  so each shard subscribes to the whole topic and filters ``pmod(hash(key), maxKeyGroups)`` in Spark right after
  parsing (no Python on the path). The price is read amplification: with N shards every record is fetched N
  times (measured in docs/benchmarks.md).

Parsing is native too (Spark's VARIANT functions), with exactly the record contract of
:mod:`spark_runtime.records`: the value is one JSON object; the key field must be a JSON string (used as is)
or integer (its decimal text); each processor field must have its declared JSON type (``?`` makes it
optional); a value over ``MAX_RECORD_BYTES`` (1 MiB, never parsed) or a key over ``MAX_KEY_BYTES`` is invalid too.
Invalid records are not processed; the shard that owns the key group of their key (or, without a
key, ``pmod(hash(NULL), n)``, as for the journal) counts them in the observed metric ``deadLetters``. They stay
in the topic at their partition/offset, which Kafka's retention keeps.

Positions: Spark's Kafka offsets ``{"<topic>": {"<partition>": <next offset>}}``, always **concrete** (never
Kafka's symbolic ``-2``/``-1``). A successor starts exactly at its parent's committed positions (per
partition), so it reads exactly the records the parent did not commit. A fresh shard resolves
its start once, before its first query (:meth:`KafkaReader.resolve_start_positions`, Kafka's ``ListOffsets``):
``earliest`` is each partition's first offset; ``latest`` is the first offset at or after the operator-set
``startingTimestamp`` (the Task's creation time; a partition with no later record: its end), so all shards of a
task agree on where "latest" was, however far apart they start. The runtime persists that answer
(``start-positions.json``) and starts the query exactly there, so a drain before the first commit hands its
children concrete offsets too: a child never starts at *its own* "latest" and skips what was produced in
between. (Record timestamps are the producers' CreateTime unless the topic uses LogAppendTime; with skewed
producer clocks use ``earliest``.)

Reading: our own data source (:mod:`spark_runtime.sources.kafka_stream`, confluent-kafka), which ends every
micro-batch at exact offsets. So the drain marker holds new batches back (the drain stops at a batch boundary),
and a catching-up successor's batches stop at its parents' committed positions (``supports_catch_up``): Kafka
splits and merges hand over as the journal's do. Spark's Kafka connector is still on the classpath for the
preflight's admin client and the sink.

Observed metrics per micro-batch (in the query's progress): ``taskshard_source`` = ``rowsRead``,
``bytesRead`` (key + value bytes fetched), ``deadLetters``; the runtime adds them up in ``progress.json``.
A committed batch whose progress a stop cut off is recounted by :meth:`KafkaReader.recount`.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from spark_runtime.kafka_client import (
    KafkaCredentialsMissing,
    client_properties,
    known_to_librdkafka,
    librdkafka_properties,
)
from spark_runtime.keygroups import KeyGrouping
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.protocol import HELD_COLUMN, HELD_RIGHT_COLUMN
from spark_runtime.records import MAX_KEY_BYTES, MAX_RECORD_BYTES, RECORD_TIME, RecordSpec
from spark_runtime.sources.base import SourceContext

__all__ = ["KafkaReader", "kafka_start_offsets", "kafka_topic_partitions", "parse_kafka_records"]

log = logging.getLogger(__name__)

SOURCE_METRICS = "taskshard_source"
FORMAT = "taskshard_kafka"
"""Our Kafka data source's name (:mod:`spark_runtime.sources.kafka_stream`)."""
_INTEGER_TYPES = r"^(BIGINT|INT|SMALLINT|TINYINT|DECIMAL\(\d+,0\))$"
_NUMBER_TYPES = r"^(BIGINT|INT|SMALLINT|TINYINT|DECIMAL\(\d+,\d+\)|DOUBLE|FLOAT)$"


def _path(name: str) -> str:
    """The VARIANT path of a top-level field (bracket notation, so any field name but one with both quotes)."""
    if "'" not in name:
        return f"$['{name}']"
    if '"' not in name:
        return f'$["{name}"]'
    raise ValueError(f"field {name!r}: the Kafka source cannot address a field name with both kinds of quotes")


def parse_kafka_records(
    raw: Any,
    spec: RecordSpec,
    grouping: KeyGrouping | int,
    start: int,
    end: int,
    *,
    held: bool = False,
    held_boundary: int | None = None,
) -> tuple[Any, Any]:
    """``(flagged, dead_owned)`` for a Kafka DataFrame ``raw``: ``flagged`` has the source contract's columns
    plus ``_ok`` (the record is valid) and ``_bytes`` (key + value bytes fetched); ``dead_owned`` is a boolean
    column, true for the invalid records this shard owns (it counts them). ``grouping``: the Task's
    :class:`KeyGrouping` (an int: ``maxKeyGroups``, not nested). ``held``: ``raw`` has a catching-up shard's
    :data:`~spark_runtime.protocol.HELD_COLUMN` (and from ``held_boundary`` on its right parent's
    :data:`~spark_runtime.protocol.HELD_RIGHT_COLUMN`): they are kept, and a held invalid record is its parent's
    to count, not this shard's."""
    if not isinstance(grouping, KeyGrouping):
        grouping = KeyGrouping(grouping)
    from pyspark.sql import functions as F

    held_names = [HELD_COLUMN] + ([HELD_RIGHT_COLUMN] if held_boundary is not None else []) if held else []
    fits = F.coalesce(F.octet_length("value"), F.lit(0)) <= MAX_RECORD_BYTES  # else too_large, never parsed
    parsed = raw.select(
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("bigint").alias("offset"),
        *([F.unix_millis(F.col("timestamp")).alias("_ts")] if spec.record_time else []),
        F.when(fits, F.col("value").cast("string")).alias("_raw"),
        (F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0))).alias("_bytes"),
        *held_names,
    ).withColumn("_v", F.try_parse_json("_raw"))
    v = F.col("_v")

    def typ(path: str) -> Any:
        return F.schema_of_variant(F.variant_get(v, path, "variant"))

    key_path = _path(spec.key_field)
    key_type = typ(key_path)
    key_ok = (key_type == "STRING") | key_type.rlike(_INTEGER_TYPES)
    key = F.when(key_ok, F.variant_get(v, key_path, "string"))
    key_ok = key_ok & (F.octet_length(key) <= MAX_KEY_BYTES)  # a longer key: too_large (owned by its key group)
    ok = F.schema_of_variant(v).startswith("OBJECT") & key_ok
    columns = [key.alias("key"), F.col("partition"), F.col("offset")]
    for f in spec.fields:
        path = _path(f.name)
        t = typ(path)
        present = t.isNotNull() & (t != "VOID")
        if f.type == "string":
            good, value = t == "STRING", F.variant_get(v, path, "string")
        elif f.type == "long":
            value = F.try_variant_get(v, path, "bigint")
            good = t.rlike(_INTEGER_TYPES) & value.isNotNull()  # integers beyond the 64-bit range do not fit
        elif f.type == "double":
            good, value = t.rlike(_NUMBER_TYPES), F.try_variant_get(v, path, "double")
        elif f.type == "boolean":
            good, value = t == "BOOLEAN", F.variant_get(v, path, "boolean")
        else:  # json: any value, as its JSON text
            good, value = F.lit(True), F.to_json(F.variant_get(v, path, "variant"))
        field_ok = F.when(present, good).otherwise(F.lit(f.optional))
        ok = ok & F.coalesce(field_ok, F.lit(False))
        columns.append(F.when(present, value).cast(f.spark_type).alias(f.name))
    if spec.raw_value:
        columns.append(F.col("_raw").alias("value"))
    if spec.record_time:
        columns.append(F.col("_ts").alias(RECORD_TIME))
    flagged = parsed.select(*columns, *held_names, F.coalesce(ok, F.lit(False)).alias("_ok"), F.col("_bytes"))
    kg = F.expr(grouping.sql("key", "partition"))
    dead_owned = (~F.col("_ok")) & kg.between(start, end - 1)
    if held:
        parent_held = F.col(HELD_COLUMN)
        if held_boundary is not None:
            parent_held = F.when(kg < held_boundary, parent_held).otherwise(F.col(HELD_RIGHT_COLUMN))
        dead_owned = dead_owned & ~parent_held
    return flagged, dead_owned


def kafka_topic_partitions(
    spark: Any, servers: str, topic: str, field: str, *, timeout_s: int = 15, client: dict[str, str] | None = None
) -> int:
    """The number of partitions of ``topic``; raise :class:`EnvironmentProblem` when the brokers cannot be
    reached (reason ``KafkaUnreachable``), refuse the credentials (``KafkaAuthenticationFailed``, field
    ``<side>.kafka.credentialsSecret``) or the topic does not exist (``TopicMissing``, field ``field``).
    ``client``: the side's Kafka client properties (:mod:`spark_runtime.kafka_client`).

    Uses the Kafka admin client on the driver's JVM (the connector's ``kafka-clients``), so the check speaks
    exactly what the connector will."""
    jvm = spark._jvm
    admin_cls = jvm.org.apache.kafka.clients.admin.Admin
    if type(admin_cls).__name__ == "JavaPackage":
        raise EnvironmentProblem(
            "KafkaConnectorMissing",
            field.rsplit(".", 1)[0],
            "Spark's Kafka connector (spark-sql-kafka-0-10 and kafka-clients) is not on the driver's classpath; "
            "set TASKSHARD_EXTRA_JARS to its jars (the shard image ships them under /opt/taskshard/jars)",
        )
    from py4j.protocol import Py4JJavaError

    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    admin = _admin(spark, servers, timeout_s, client)
    side = field.rsplit(".", 1)[0]
    try:
        try:
            names = admin.listTopics().names().get(timeout_s, seconds)
        except Py4JJavaError as exc:
            error = _java_error(exc)
            if any(kind in error for kind in ("AuthenticationException", "SaslAuthentication", "SslAuthentication")):
                raise EnvironmentProblem(
                    "KafkaAuthenticationFailed",
                    f"{side}.credentialsSecret",
                    f"{side}.credentialsSecret: the Kafka brokers {servers!r} refused the client's credentials or "
                    f"TLS handshake ({error}); check the Secret's username, password, ca.crt, tls.crt and tls.key "
                    f"and {side}.options (security.protocol, sasl.mechanism)",
                ) from None
            raise EnvironmentProblem(
                "KafkaUnreachable",
                f"{side}.bootstrapServers",
                f"{side}.bootstrapServers: cannot reach the Kafka brokers {servers!r} within {timeout_s}s ({error})",
            ) from None
        if not names.contains(topic):
            raise EnvironmentProblem(
                "TopicMissing",
                field,
                f"{field}: topic {topic!r} does not exist on {servers!r} (existing topics: "
                f"{sorted(str(n) for n in names)[:20]}); create it, or fix {field}",
            )
        desc = admin.describeTopics(jvm.java.util.Collections.singletonList(topic)).allTopicNames()
        return int(desc.get(timeout_s, seconds).get(topic).partitions().size())
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(2))


def _admin(spark: Any, servers: str, timeout_s: int, client: dict[str, str] | None = None) -> Any:
    """A Kafka admin client on the driver's JVM with the side's client properties (close it after use)."""
    jvm = spark._jvm
    props = jvm.java.util.Properties()
    for key, value in (client or {}).items():
        props.setProperty(key, value)
    props.setProperty("bootstrap.servers", servers)
    props.setProperty("request.timeout.ms", str(timeout_s * 1000))
    props.setProperty("default.api.timeout.ms", str(timeout_s * 1000))
    return jvm.org.apache.kafka.clients.admin.Admin.create(props)


def kafka_start_offsets(
    spark: Any,
    servers: str,
    topic: str,
    partitions: list[int],
    starting_offsets: str,
    starting_timestamp: int | None,
    *,
    timeout_s: int = 15,
    client: dict[str, str] | None = None,
) -> dict[str, int]:
    """Concrete start offsets ``{"<partition>": offset}`` of ``partitions`` of ``topic`` (Kafka's
    ``ListOffsets``): ``earliest`` gives each partition's first offset; ``latest`` with ``starting_timestamp``
    (epoch ms) the first offset whose record timestamp is at or after it, or the partition's end when it has no
    such record (Spark's ``startingOffsetsByTimestampStrategy: latest``); ``latest`` without one the end."""
    jvm = spark._jvm
    spec_cls = jvm.org.apache.kafka.clients.admin.OffsetSpec
    partition_cls = jvm.org.apache.kafka.common.TopicPartition
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS

    def list_offsets(admin: Any, wanted: dict[int, Any]) -> dict[int, int]:
        request = jvm.java.util.HashMap()
        for p, spec in wanted.items():
            request.put(partition_cls(topic, p), spec)
        answer = admin.listOffsets(request).all().get(timeout_s, seconds)
        return {p: int(answer.get(partition_cls(topic, p)).offset()) for p in wanted}

    admin = _admin(spark, servers, timeout_s, client)
    try:
        if starting_offsets == "earliest":
            first = {p: spec_cls.earliest() for p in partitions}
        elif starting_timestamp is not None:
            first = {p: spec_cls.forTimestamp(int(starting_timestamp)) for p in partitions}
        else:
            first = {p: spec_cls.latest() for p in partitions}
        offsets = list_offsets(admin, first)
        no_record = {p: spec_cls.latest() for p, o in offsets.items() if o < 0}  # nothing at or after the time
        if no_record:
            offsets.update(list_offsets(admin, no_record))
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(2))
    bad = {p: o for p, o in offsets.items() if o < 0}
    if bad:  # pragma: no cover - Kafka answers an end offset for every existing partition
        raise RuntimeError(f"Kafka gave no start offset for partitions {bad} of {topic!r}")
    return {str(p): o for p, o in sorted(offsets.items())}


def _java_error(exc: Any) -> str:
    try:
        err = exc.java_exception
        while err.getCause() is not None:
            err = err.getCause()
        return f"{err.getClass().getSimpleName()}: {err.getMessage()}"
    except Exception:  # pragma: no cover - best effort description
        return str(exc).splitlines()[0][:300]


class KafkaReader:
    """A Kafka topic as a :class:`spark_runtime.sources.base.Source` (see the module docstring)."""

    kind = "kafka"
    supports_drain_marker = True
    supports_catch_up = True
    """Our data source ends batches at exact offsets: a successor follows its parents (catch-up hand-over)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        starting_offsets: str = "earliest",
        starting_timestamp: int | None = None,
        *,
        declared_partitions: int | None = None,
        read_partitions: list[int] | None = None,
        options: dict[str, str] | None = None,
    ) -> None:
        self.options = dict(options or {})
        """The Task's ``source.kafka.options`` (credentials are added from the environment: :attr:`client`)."""
        self._client: dict[str, str] | None = None
        self._consumer: dict[str, Any] | None = None
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.starting_offsets = starting_offsets
        self.starting_timestamp = starting_timestamp
        self.declared_partitions = declared_partitions
        """With key groups nested in partitions: the partition count the mapping is built on; else None."""
        self.read_partitions = read_partitions
        """The partitions this shard assigns (nested); None: it subscribes to the whole topic."""
        self.partitions: int | None = None

    @property
    def client(self) -> dict[str, str]:
        """The consumer's and admin client's properties: the options and the credentials of the pod's environment
        (:func:`spark_runtime.kafka_client.client_properties`); raises :class:`EnvironmentProblem`
        ``KafkaCredentialsMissing`` naming the field when the options ask for credentials the pod lacks."""
        if self._client is None:
            try:
                self._client = client_properties(self.options, "source")
            except KafkaCredentialsMissing as exc:
                raise EnvironmentProblem(
                    "KafkaCredentialsMissing", "source.kafka.credentialsSecret", str(exc)
                ) from None
        return self._client

    def _topic_partitions(self, spark: Any) -> int:
        return kafka_topic_partitions(
            spark, self.bootstrap_servers, self.topic, "source.kafka.topic", client=self.client
        )

    def check(self, spark: Any) -> None:
        """Preflight (raises :class:`EnvironmentProblem`): the brokers answer and accept the credentials, the topic
        exists and, with key groups nested in partitions, it has the declared partition count."""
        self.partitions = self._topic_partitions(spark)
        self._check_partition_count(self.partitions, "before its first batch")

    def before_batch(self, spark: Any, batch_id: int) -> None:
        """See :class:`spark_runtime.sources.base.GuardsBatches`: a nested shard stops when the topic's
        partition count is no longer the declared one. One metadata request per batch."""
        if self.declared_partitions is None:
            return
        count = self._topic_partitions(spark)
        self._check_partition_count(count, f"before writing batch {batch_id}")

    def _check_partition_count(self, count: int, when: str) -> None:
        if self.declared_partitions is None or count == self.declared_partitions:
            return
        raise EnvironmentProblem(
            "PartitionCountChanged",
            "source.kafka.partitions",
            f"source.kafka.partitions: topic {self.topic!r} has {count} partitions, but the Task's key groups are "
            f"nested in {self.declared_partitions} (partitionedByKey); keys may have moved between partitions, so "
            f"the shard stopped {when} rather than process under a wrong mapping (nothing of that batch was "
            "written or committed); create a new Task for the new partition count",
        )

    def _partitions_read(self) -> list[int]:
        if self.read_partitions is not None:
            return list(self.read_partitions)
        return list(range(self.partitions or 0))

    def resolve_start_positions(self, spark: Any) -> dict[str, Any]:
        """Where a fresh shard starts, as concrete offsets per partition (see the module docstring); runs the
        preflight first when it has not run. The runtime asks once per shard and persists the answer."""
        if self.partitions is None:
            self.check(spark)
        assert self.partitions is not None
        offsets = kafka_start_offsets(
            spark,
            self.bootstrap_servers,
            self.topic,
            self._partitions_read(),
            self.starting_offsets,
            self.starting_timestamp if self.starting_offsets == "latest" else None,
            client=self.client,
        )
        return {self.topic: offsets}

    def counted_nothing_filled(
        self, every: list[dict[str, Any]], partitions: int | None = None
    ) -> list[dict[str, Any]]:
        """See :class:`spark_runtime.sources.GainsPartitions`: with ``subscribe`` (every shard reads every partition),
        a partition one parent's positions lack, which another parent's name (or which exists, below
        ``partitions``), appeared after that parent stopped: it counted nothing there, so its key groups' records
        in it start at offset 0. With ``assign`` (key groups nested in partitions) a shard names exactly its own
        partitions: unchanged."""
        if self.read_partitions is not None:
            return [dict(p) for p in every]
        names = {str(n) for p in every for n in (p.get(self.topic) or {})}
        names |= {str(n) for n in range(partitions or 0)}
        return [
            {self.topic: {n: int((p.get(self.topic) or {}).get(n, 0)) for n in sorted(names, key=int)}} for p in every
        ]

    def owns_offset(self, offset: dict[str, Any]) -> bool:
        return isinstance(offset, dict) and set(offset) == {self.topic}

    def partition_offsets(self, positions: dict[str, Any]) -> dict[int, int]:
        """Kafka positions are the next offset to read per partition: a record at ``offset >= position`` is after."""
        return {int(p): int(o) for p, o in (positions.get(self.topic) or {}).items()}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bootstrapServers": self.bootstrap_servers,
            "topic": self.topic,
            "partitions": self.partitions,
        }

    def validate_positions(self, positions: dict[str, Any]) -> dict[str, Any]:
        """Check ``positions`` (a manifest's, or this shard's own; concrete offsets only) and return the part this
        shard reads: with key groups nested in partitions, exactly its partitions (each must be named)."""
        if set(positions) != {self.topic}:
            raise ValueError(
                f"restore positions are of topics {sorted(positions)} but source.kafka.topic is {self.topic!r}; "
                "a child must read the parent's topic"
            )
        per_partition = positions[self.topic]
        if not isinstance(per_partition, dict) or not per_partition:
            raise ValueError(f"restore positions of {self.topic!r} must map partitions to offsets: {per_partition}")
        bad = {
            k: v
            for k, v in per_partition.items()
            if not re.match(r"^\d+$", str(k)) or not isinstance(v, int) or isinstance(v, bool) or v < 0
        }
        if bad:
            raise ValueError(
                f"positions of {self.topic!r} must be concrete Kafka offsets (>= 0 per partition), got {bad}; "
                "symbolic ones (-2 earliest, -1 latest) would mean a different record to each reader"
            )
        if self.read_partitions is None:
            return {self.topic: dict(per_partition)}
        missing = [p for p in self.read_partitions if str(p) not in per_partition]
        if missing:
            raise ValueError(
                f"positions of {self.topic!r} name partitions {sorted(per_partition, key=int)} but this shard reads "
                f"{self.read_partitions} (missing {missing}); a child must read a part of its parent's partitions"
            )
        return {self.topic: {str(p): per_partition[str(p)] for p in self.read_partitions}}

    def stream(self, spark: Any, ctx: SourceContext) -> Any:
        """The shard's records through our own Kafka data source (:mod:`spark_runtime.sources.kafka_stream`),
        which ends each micro-batch at exact offsets: a catching-up successor's batches stop at its parents'
        committed positions, and the drain marker holds new batches back."""
        from spark_runtime.sources.kafka_stream import KafkaDataSource

        spark.dataSource.register(KafkaDataSource)
        raw = spark.readStream.format(FORMAT).options(**self._stream_options(ctx)).load()
        flagged, dead_owned = _parse(raw, ctx)
        observed = flagged.observe(SOURCE_METRICS, *_metric_columns(dead_owned))
        return observed.where("_ok").drop("_ok", "_bytes")

    def _stream_options(self, ctx: SourceContext, **extra: str) -> dict[str, str]:
        """The data source's options for the shard of ``ctx``."""
        start = ctx.start_positions
        if start is not None:
            # Every partition of a subscribed topic named: one that appeared after the parent stopped was counted
            # by nobody yet (GainsPartitions).
            (start,) = self.counted_nothing_filled([start], self.partitions)
        s3 = ctx.drain_marker.s3
        return {
            "topic": self.topic,
            "kafkaClientSecret": json.dumps(self.consumer_properties),
            "readPartitions": ",".join(str(p) for p in self.read_partitions or []),
            "startPositions": json.dumps(start) if start is not None else "",
            "startingOffsets": self.starting_offsets,
            "maxOffsetsPerTrigger": str(ctx.max_records_per_trigger or 0),
            "drainMarker": ctx.drain_marker.uri(),
            "fencedBy": ctx.fenced_by.uri() if ctx.fenced_by is not None else "",
            "catchUpState": ctx.catch_up_state.uri() if ctx.catch_up_state is not None else "",
            "heldBoundary": str(ctx.held_boundary) if ctx.held_boundary is not None else "",
            **(s3.options() if s3 is not None else {}),
            **extra,
        }

    @property
    def consumer_properties(self) -> dict[str, Any]:
        """The reader's librdkafka properties: :attr:`client` for librdkafka
        (:func:`spark_runtime.kafka_client.librdkafka_properties`), without the JVM-only ones (logged once)."""
        if self._consumer is None:
            try:
                props = librdkafka_properties(self.options, "source")
            except KafkaCredentialsMissing as exc:
                raise EnvironmentProblem(
                    "KafkaCredentialsMissing", "source.kafka.credentialsSecret", str(exc)
                ) from None
            props = {"isolation.level": "read_uncommitted", **props, "bootstrap.servers": self.bootstrap_servers}
            from confluent_kafka import KafkaException

            try:
                kept, dropped = known_to_librdkafka(props)
            except KafkaException as exc:
                raise EnvironmentProblem(
                    "KafkaOptionInvalid", "source.kafka.options", f"source.kafka.options: {exc.args[0]}"
                ) from None
            if dropped:
                log.info("source.kafka.options: %s apply to the JVM clients only (the reader is librdkafka)", dropped)
            self._consumer = {**kept, "log_level": 3}
        return self._consumer

    def recount(self, spark: Any, ctx: SourceContext, start: dict[str, Any], end: dict[str, Any]) -> dict | None:
        """The source metrics (``rowsRead``, ``bytesRead``, ``deadLetters``) of the records from positions
        ``start`` to ``end`` (a committed batch's range), counted by a batch read of exactly that range with the
        stream's own parsing. None when ``start`` is not a set of offsets (``latest``, or a timestamp)."""
        flagged = self._parsed_range(spark, ctx, start, end)
        if flagged is None:
            return None
        if flagged is False:
            return {"rowsRead": 0, "bytesRead": 0, "deadLetters": 0}
        frame, dead_owned = flagged
        row = frame.agg(*_metric_columns(dead_owned)).first()
        return {name: int(row[name] or 0) for name in ("rowsRead", "bytesRead", "deadLetters")}

    def read_range(self, spark: Any, ctx: SourceContext, start: dict[str, Any], end: dict[str, Any]) -> Any:
        """The valid records from positions ``start`` to ``end`` (a batch read of that range, the stream's own
        parsing); raises ``ValueError`` when ``start`` is not a set of offsets."""
        flagged = self._parsed_range(spark, ctx, start, end)
        if flagged is None:
            raise ValueError(f"source.kafka: positions {start} are not offsets; the range cannot be read again")
        if flagged is False:
            return spark.createDataFrame([], ctx.record_spec.ddl())
        frame, _ = flagged
        return frame.where("_ok").drop("_ok", "_bytes")

    def _parsed_range(self, spark: Any, ctx: SourceContext, start: dict[str, Any], end: dict[str, Any]) -> Any:
        """``(parsed records, owned-dead-letter column)`` from ``start`` to ``end``; False for an empty range, None
        when ``start`` is not a set of offsets."""
        begin = {str(p): int(o) for p, o in (start.get(self.topic) or {}).items()}
        stop = {str(p): int(o) for p, o in (end.get(self.topic) or {}).items()}
        if not stop or any(o == -1 for o in begin.values()):
            return None
        if {p: begin.get(p, -2) for p in stop} == stop:
            return False
        from spark_runtime.sources.kafka_stream import KafkaDataSource, read_range_here

        ranged = {"rangeFrom": json.dumps({self.topic: begin}), "rangeTo": json.dumps({self.topic: stop})}
        options = self._stream_options(ctx, **ranged)
        table = read_range_here(options)  # a short range: no Python data source query to start
        if table is not None:
            return _parse(spark.createDataFrame(table), ctx)
        spark.dataSource.register(KafkaDataSource)
        return _parse(spark.read.format(FORMAT).options(**options).load(), ctx)


def _parse(raw: Any, ctx: SourceContext) -> tuple[Any, Any]:
    """:func:`parse_kafka_records` for the shard of ``ctx`` (its range, and its held columns when it catches up)."""
    return parse_kafka_records(
        raw,
        ctx.record_spec,
        ctx.key_grouping,
        ctx.range_start,
        ctx.range_end,
        held=ctx.catch_up_state is not None,
        held_boundary=ctx.held_boundary,
    )


def _metric_columns(dead_owned: Any) -> list[Any]:
    """The source metrics over the parsed records: all rows read, their key + value bytes, and the invalid
    records this shard owns (the stream observes them; :meth:`KafkaReader.recount` aggregates them)."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("rowsRead"),
        F.coalesce(F.sum("_bytes"), F.lit(0)).cast("bigint").alias("bytesRead"),
        F.coalesce(F.sum(F.when(dead_owned, 1).otherwise(0)), F.lit(0)).cast("bigint").alias("deadLetters"),
    ]
