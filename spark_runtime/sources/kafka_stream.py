"""The Kafka topic as a PySpark Python Data Source (``taskshard_kafka``), read with confluent-kafka (librdkafka).

Spark's own Kafka source cannot end a micro-batch at offsets it is given, which a catching-up successor needs:
it follows its parent's committed positions and may not read past them (:mod:`spark_runtime.handover`). This
reader can, and otherwise returns what Spark's does: the raw columns ``key``, ``value`` (binary), ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, parsed natively afterwards
(:func:`spark_runtime.sources.kafka.parse_kafka_records`). Measured on the 2-core machine (1,000,000 records,
``groupBy(key).count()``, runs alternated): 0.98x the records/s of Spark's source, about 10 % more Spark-side CPU
and far less broker CPU.

Positions are Spark's Kafka offsets ``{"<topic>": {"<partition>": <next offset>}}``; a batch reads
``[start, end)`` of each partition, one Spark task per partition.

1. ``latestOffset`` (driver side): per partition, the high watermark (the last stable offset under
   ``isolation.level=read_committed``), with ``subscribe`` the topic's current partitions (a new one from
   offset 0: nobody counted it), capped by ``maxOffsetsPerTrigger`` spread over the partitions; unchanged
   while the drain marker exists or the runtime is fenced; a catching-up shard's ends are capped at its
   ``catch-up.json`` limit (:func:`spark_runtime.protocol.clamp`; a partition the limit does not name stays
   at its start);
2. ``partitions``: one range per partition, cut at a catching-up shard's parents' final positions, each
   with its held flags (:data:`spark_runtime.protocol.HELD_COLUMN`, a merged shard's
   :data:`spark_runtime.protocol.HELD_RIGHT_COLUMN` too), decided when the batch is planned;
3. ``read`` (a Python worker): a consumer assigned to the one partition at ``start`` reads until ``end``.
   Offsets need not be dense (transaction markers, aborted or compacted records): a range is done when a
   record at ``end - 1`` or later arrived, the consumer's position reached ``end``, or the broker reported the
   partition's end at or after ``end``; ``end`` is always a watermark seen earlier, so one of them happens.
   A start below the partition's first offset (retention deleted records the shard never read) fails the batch
   (``auto.offset.reset=error``), as ``failOnDataLoss`` does for Spark's source: nothing is skipped silently.

The consumer's client properties come from :func:`spark_runtime.kafka_client.librdkafka_properties` (TLS and
SASL credentials from the pod's environment) in the option ``kafkaClientSecret`` (a name Spark's redaction hides
from plans and logs). No consumer group is joined and nothing is committed to Kafka: positions live in the
shard's recovery log.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from spark_runtime.protocol import (
    HELD_COLUMN,
    HELD_RIGHT_COLUMN,
    CatchUpPhase,
    CatchUpState,
    MergeCatchUpState,
    clamp,
    held_columns,
    held_cuts,
    held_flags,
    read_catch_up,
)
from spark_runtime.records import MAX_RECORD_BYTES
from spark_runtime.storage import S3Settings, location

__all__ = ["FORMAT", "RAW_SCHEMA", "KafkaDataSource", "KafkaRange", "read_range_here", "topic_state"]

FORMAT = "taskshard_kafka"
RAW_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, timestampType int"
)
"""The raw columns, as Spark's Kafka source names and types them."""
CONSUME_BATCH = 10_000
"""Records per ``consume`` call (also the largest Arrow batch)."""
CONSUME_WAIT_S = 0.2
READ_TIMEOUT_S = 120.0
"""How long a task may get nothing before it fails (records deleted under it, or the broker gone)."""
READ_HERE_MAX_OFFSETS = 100_000
"""The largest range (offsets over all partitions) :func:`read_range_here` reads in the calling process."""
READ_HERE_MAX_BYTES = 64 << 20
"""The most Arrow bytes :func:`read_range_here` holds before it leaves the range to a Spark batch read (a record
may be up to 1 MiB, so an offset count alone does not bound the driver's memory)."""
READ_HERE_CONSUMES_PER_CAP = 8
""":func:`read_range_here` asks each ``consume`` for at most ``READ_HERE_MAX_BYTES / 8`` of records (at the
largest record size seen so far), so it passes its cap by one such batch at most, not by a whole
``consume(CONSUME_BATCH)``."""
ARROW_BYTES_PER_RECORD = 40
"""A record's Arrow bytes beyond its key, value and topic name: the key, value and topic offsets, partition,
offset, timestamp and timestamp type (36 bytes) and the held flags' bits."""


def topic_state(state: CatchUpState | MergeCatchUpState, topic: str) -> CatchUpState | MergeCatchUpState:
    """``state`` with its positions reduced to ``topic``'s ``{partition: offset}``, so the partition names are the
    position names (the flat form the cap, the cuts and the held flags are decided on)."""

    def flat(positions: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if positions is None else {str(p): int(o) for p, o in (positions.get(topic) or {}).items()}

    if isinstance(state, MergeCatchUpState):
        left, right = state.limits
        final_left, final_right = state.finals
        return dataclasses.replace(
            state, limits=(flat(left), flat(right)), finals=(flat(final_left), flat(final_right))
        )
    return dataclasses.replace(state, limit=flat(state.limit), final=flat(state.final))


class KafkaRange(InputPartition):
    """Offsets ``[start, end)`` of ``partition``, with a catching-up shard's held flags for the whole range."""

    def __init__(self, partition: int, start: int, end: int, held: bool = False, held_right: bool = False) -> None:
        super().__init__((partition, start, end, held, held_right))
        self.partition = partition
        self.start = start
        self.end = end
        self.held = held
        self.held_right = held_right


def _consumer(conf: dict[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            **conf,
            # No group is joined (assign only) and nothing is committed; librdkafka wants a group.id anyway.
            "group.id": "taskshard-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )


class _Watermarks:
    """Driver-side look-ups (partitions, watermarks) with one cached consumer, never pickled."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        self.conf = conf
        self.topic = topic
        self._consumer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"conf": self.conf, "topic": self.topic, "_consumer": None}

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = _consumer(self.conf)
        return self._consumer

    def partitions(self) -> list[int]:
        meta = self._client().list_topics(self.topic, timeout=30).topics.get(self.topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"source.kafka.topic: topic {self.topic!r}: {meta.error if meta else 'no metadata'}")
        return sorted(meta.partitions)

    def marks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """``{partition: (first offset, end)}``; the end is the last stable offset under read_committed."""
        from confluent_kafka import TopicPartition

        client = self._client()
        return {
            p: client.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30, cached=False) for p in partitions
        }

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _schema(held: list[str]) -> Any:
    """The Arrow schema of :data:`RAW_SCHEMA` plus the ``held`` columns."""
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            *[(name, pa.bool_()) for name in held],
        ]
    )


def _record_batch(msgs: list[Any], offsets: list[int], part: KafkaRange, topic: str, schema: Any) -> Any:
    """``msgs`` (records of ``part``, at ``offsets``) as one Arrow record batch of ``schema``."""
    import numpy as np
    import pyarrow as pa

    n = len(msgs)
    stamps = np.array([m.timestamp() for m in msgs], dtype=np.int64).reshape(n, 2)
    flags = {HELD_COLUMN: part.held, HELD_RIGHT_COLUMN: part.held_right}
    columns = [
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(part.partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(stamps[:, 1] * 1000, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(stamps[:, 0] - 1, pa.int32()),  # librdkafka: 1 create, 2 log append; Spark: 0, 1
        *[pa.repeat(pa.scalar(flags[f.name], pa.bool_()), n) for f in list(schema)[7:]],
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def consume_count(wanted: int, batch_bytes: int | None, largest_record: int | None) -> int:
    """How many records one ``consume`` asks for: ``wanted`` (the range's rest, at most :data:`CONSUME_BATCH`),
    and with a ``batch_bytes`` budget no more than fit it at ``largest_record`` bytes each (none seen yet:
    :data:`MAX_RECORD_BYTES`, the largest valid record), never fewer than 1."""
    count = min(CONSUME_BATCH, wanted)
    if batch_bytes is not None:
        count = min(count, batch_bytes // max(1, largest_record or MAX_RECORD_BYTES))
    return max(1, count)


def read_partition(
    conf: dict[str, Any], topic: str, part: KafkaRange, held: list[str], batch_bytes: int | None = None
) -> Iterator[Any]:
    """The records of ``part`` as Arrow record batches of :data:`RAW_SCHEMA` plus the ``held`` columns.

    With ``batch_bytes`` each batch holds about that many Arrow bytes at most: a ``consume`` asks for as many
    records as fit at the largest record seen so far (its key, value and topic plus
    :data:`ARROW_BYTES_PER_RECORD`; before the first, :data:`MAX_RECORD_BYTES`, the largest valid one), and
    librdkafka pre-fetches no more than that budget either."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    start, end, p = part.start, part.end, part.partition
    if end <= start:
        return
    schema = _schema(held)
    largest: int | None = None  # the largest record's Arrow bytes seen, with a batch_bytes budget
    overhead = ARROW_BYTES_PER_RECORD + len(topic.encode())
    if batch_bytes is not None:  # librdkafka's own pre-fetch queue (64 MiB by default) stays within the budget too
        conf = {"queued.max.messages.kbytes": max(1, batch_bytes >> 10), **conf}
    consumer = _consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, p, start)])
        seen = start
        deadline = time.monotonic() + READ_TIMEOUT_S
        done = False
        while not done:
            # Never ask for more than the range still holds: consume() waits for that many or the timeout.
            count = consume_count(end - seen, batch_bytes, largest)
            msgs = consumer.consume(num_messages=count, timeout=CONSUME_WAIT_S)
            for m in [m for m in msgs if m.error() is not None]:
                err = m.error()
                if err.code() == KafkaError._PARTITION_EOF:
                    done = done or m.offset() >= end
                elif err.fatal() or not err.retriable():
                    raise KafkaException(err)
            msgs = [m for m in msgs if m.error() is None]
            if msgs:
                if batch_bytes is not None:
                    sizes = (len(m.key() or b"") + len(m.value() or b"") + overhead for m in msgs)
                    largest = max(largest or 0, *sizes)
                offsets = [m.offset() for m in msgs]
                seen = offsets[-1] + 1
                if offsets[-1] >= end - 1:
                    done = True
                    n = bisect.bisect_left(offsets, end)
                    msgs, offsets = msgs[:n], offsets[:n]
                if msgs:
                    yield _record_batch(msgs, offsets, part, topic, schema)
                deadline = time.monotonic() + READ_TIMEOUT_S
            elif not done:
                (position,) = consumer.position([TopicPartition(topic, p)])
                if position.offset >= end:  # past a trailing gap (a transaction marker, aborted records)
                    done = True
                elif time.monotonic() > deadline:
                    raise TimeoutError(
                        f"source.kafka: reading {topic}[{p}] offsets [{start}, {end}) got nothing past "
                        f"{position.offset} for {READ_TIMEOUT_S:.0f}s (records deleted under the reader, or the "
                        "broker gone?)"
                    )
    finally:
        consumer.close()


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. Options are strings (set by :meth:`spark_runtime.sources.kafka.KafkaReader.stream`)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.topic = options["topic"]
        self.conf = json.loads(options["kafkaclientsecret"])
        read = options.get("readpartitions") or ""
        self.read_partitions = [int(p) for p in read.split(",")] if read else None
        self.start_positions = json.loads(options.get("startpositions") or "null")
        self.starting = options.get("startingoffsets") or "earliest"
        self.max_rows = int(options.get("maxoffsetspertrigger") or 0)
        s3 = S3Settings.from_options(options)
        self.drain_marker = location(options["drainmarker"], s3) if options.get("drainmarker") else None
        self.fenced_by = location(options["fencedby"], s3) if options.get("fencedby") else None
        self.catch_up = location(options["catchupstate"], s3) if options.get("catchupstate") else None
        self.merged = bool(options.get("heldboundary"))
        self.marks = _Watermarks(self.conf, self.topic)
        self.target: dict[str, int] | None = None
        self.latest: dict[str, Any] | None = None

    # ---- driver side

    def _partitions(self) -> list[int]:
        return list(self.read_partitions) if self.read_partitions is not None else self.marks.partitions()

    def initialOffset(self) -> dict:
        if self.start_positions is not None:
            return {self.topic: {str(p): int(o) for p, o in self.start_positions[self.topic].items()}}
        marks = self.marks.marks(self._partitions())  # no resolved start (the runtime always passes one)
        latest = self.starting == "latest"
        return {self.topic: {str(p): high if latest else low for p, (low, high) in marks.items()}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {str(p): high for p, (_, high) in self.marks.marks(self._partitions()).items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = {str(p): int(o) for p, o in (start.get(self.topic) or {}).items()}
        if (self.drain_marker is not None and self.drain_marker.exists()) or (
            self.fenced_by is not None and self.fenced_by.exists()
        ):
            return {self.topic: begin}  # draining or fenced: admit nothing new, so no micro-batch starts
        ends = dict(begin)
        marks = self.marks.marks(self._partitions())
        self.latest = {self.topic: {str(p): high for p, (_, high) in marks.items()}}
        for p, (_, high) in marks.items():
            name = str(p)
            end = high if self.target is None else min(high, self.target.get(name, high))
            ends[name] = max(begin.get(name, 0), end)  # a new partition: from 0 (nobody counted it)
        if isinstance(limit, ReadMaxRows):
            share = max(1, int(limit.max_rows) // max(1, len(ends)))
            ends = {name: min(end, begin.get(name, 0) + share) for name, end in ends.items()}
        state = self._state()
        if state is not None and state.limit is not None and state.phase != CatchUpPhase.LIVE:
            ends = clamp(ends, begin, state.limit)  # catching up: never past the parents' positions
        return {self.topic: ends}

    def reportLatestOffset(self) -> dict | None:
        """The partitions' ends at the last planning (uncapped): the progress' ``latestOffset``, from which the
        runtime reports the shard's Kafka lag (:mod:`spark_runtime.metrics`)."""
        return self.latest

    def _state(self) -> CatchUpState | MergeCatchUpState | None:
        if self.catch_up is None or not self.catch_up.exists():
            return None
        return topic_state(read_catch_up(self.catch_up.read_json()), self.topic)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """One range per partition; a catching-up shard's are cut at its parents' final positions, so each range
        is held or not as a whole. The same range and the same final positions give the same ranges."""
        state = self._state()
        begin, stop = start.get(self.topic) or {}, end.get(self.topic) or {}
        ranges: list[InputPartition] = []
        for name, e in sorted(stop.items(), key=lambda kv: int(kv[0])):
            s, e = int(begin.get(name, 0)), int(e)
            bounds = [s, *(c for c in held_cuts(state, name) if s < c < e), e]
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                if hi > lo:
                    ranges.append(KafkaRange(int(name), lo, hi, *held_flags(state, name, lo)))
        return ranges

    def commit(self, end: dict) -> None:  # positions live in Spark's offset log
        return None

    def stop(self) -> None:
        self.marks.close()

    # ---- executor side

    @property
    def held_names(self) -> list[str]:
        """The held columns a catching-up shard's records carry (none once it is not catching up)."""
        return [name for name, _ in held_columns(self.catch_up is not None, self.merged)]

    def read(self, partition: KafkaRange) -> Iterator[Any]:  # type: ignore[override]
        return read_partition(self.conf, self.topic, partition, self.held_names)


class KafkaRangeReader(DataSourceReader):
    """``spark.read.format("taskshard_kafka")``: the records from positions ``rangeFrom`` to ``rangeTo`` (JSON; a
    partition ``rangeFrom`` does not name is read from its first offset), with a catching-up shard's held flags."""

    def __init__(self, options: dict[str, str]) -> None:
        self.stream = KafkaStreamReader(options)
        self.start = json.loads(options["rangefrom"])
        self.end = json.loads(options["rangeto"])

    def partitions(self) -> list[InputPartition]:
        topic = self.stream.topic
        begin = dict(self.start.get(topic) or {})
        missing = [int(p) for p in (self.end.get(topic) or {}) if p not in begin]
        if missing:
            begin.update({str(p): low for p, (low, _) in self.stream.marks.marks(missing).items()})
            self.stream.marks.close()
        ranges = self.stream.partitions({topic: begin}, self.end)
        return ranges or [KafkaRange(-1, 0, 0)]  # Spark wants at least one partition

    def read(self, partition: KafkaRange) -> Iterator[Any]:  # type: ignore[override]
        if partition.partition < 0:
            return iter(())
        return self.stream.read(partition)


def read_range_here(options: dict[str, str]) -> Any | None:
    """The records of a range read (:class:`KafkaRangeReader`'s ``options``) as one Arrow table, read in the
    calling process (the driver), or None when the range spans more than :data:`READ_HERE_MAX_OFFSETS` offsets or
    its records more than :data:`READ_HERE_MAX_BYTES`.

    The same records, held flags and schema as ``spark.read.format(FORMAT)``, without what a Python data source
    query costs before it reads a record: a Python runner process to plan it, 1-5 s on a 2-core machine. A
    catch-up child's fence batch reads its own range again this way (a few seconds of input at most)."""
    import pyarrow as pa

    reader = KafkaRangeReader({k.lower(): v for k, v in options.items()})
    try:
        parts = [p for p in reader.partitions() if isinstance(p, KafkaRange) and p.partition >= 0]
    finally:
        reader.stream.marks.close()
    if sum(p.end - p.start for p in parts) > READ_HERE_MAX_OFFSETS:
        return None
    read_bytes = [0]  # over every partition's thread; each stops at its next batch once past the cap
    lock = threading.Lock()

    stream = reader.stream
    batch_bytes = max(1, READ_HERE_MAX_BYTES // READ_HERE_CONSUMES_PER_CAP)

    def read(part: KafkaRange) -> list[Any] | None:
        out = []
        for batch in read_partition(stream.conf, stream.topic, part, stream.held_names, batch_bytes):
            with lock:
                read_bytes[0] += batch.nbytes
                if read_bytes[0] > READ_HERE_MAX_BYTES:
                    return None
            out.append(batch)
        return out

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(parts)))) as pool:  # librdkafka waits without the GIL
        per_part = list(pool.map(read, parts))
    if any(batches is None for batches in per_part):
        return None
    batches = [b for part_batches in per_part for b in part_batches or []]
    return pa.Table.from_batches(batches, schema=_schema(stream.held_names))


class KafkaDataSource(DataSource):
    """``spark.readStream.format("taskshard_kafka")`` (and ``spark.read`` for exact ranges)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        held = held_columns(bool(self.options.get("catchUpState")), bool(self.options.get("heldBoundary")))
        return RAW_SCHEMA + "".join(f", `{name}` {kind}" for name, kind in held)

    def _options(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.options.items()}

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(self._options())

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaRangeReader(self._options())
