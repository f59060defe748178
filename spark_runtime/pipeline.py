"""The shard's Spark plan: source -> native key-group filter -> keyed state -> ``(key, key_group, result)``
(the export of that state as a key-group-indexed snapshot is :mod:`spark_runtime.snapshot.export`'s).

Two processing kinds share the source, the filter, the seeding and the sink:

``builtin`` (count, sum, min, max)
    Spark's native streaming aggregation ``groupBy(key).agg(sum(delta))`` (delta = 1 for count, the field
    for sum; ``min``/``max`` of the field), state in the RocksDB state store. Seeded by one seed row per key whose
    delta is the parent's total. State rows in the checkpoint: key ``{key}``, value ``{sum}``; snapshot columns
    ``key, value``. With ``processor.window``: per key and event-time window (:mod:`spark_runtime.windows`).
``python``
    One Python call per key group per batch with a pandas DataFrame of many keys (the user's processor,
    :mod:`spark_runtime.engine.api`), over one of two state layouts (:mod:`spark_runtime.engine`): ``runs``
    (``transformWithStateInPandas``; a batch costs the keys it touches; every new checkpoint) or ``blob``
    (``applyInPandasWithState`` with one Arrow table per key group; checkpoints that hold it). Seeded by one blob
    per key group. Snapshot columns ``key`` + the state columns (the same for both layouts).

Both snapshots are Parquet under ``state/key_group=<n>/`` (one directory per key group, one file per
directory), so a child reads only its key groups' files.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from spark_runtime import live
from spark_runtime.config import BuiltinProcessor, EventTimeSpec, ShardConfig, WindowSpec
from spark_runtime.engine.api import (
    ProcessorError,
    load_processor,
    processor_result_columns,
    processor_state_schema,
    processor_time_domain,
    processor_ttl_ms,
)
from spark_runtime.engine.schema import StateSchema
from spark_runtime.engine.step import EVENT_TIME, LATE
from spark_runtime.protocol import HELD_COLUMN, HELD_RIGHT_COLUMN, SkipRule
from spark_runtime.records import RECORD_TIME, RecordSpec
from spark_runtime.windows import WINDOW_RESULT_COLUMNS, window_frame

__all__ = ["Plan", "build_output_frame", "key_group_column", "make_plan", "owned_records", "results_past_fence"]

STATE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Plan:
    """What the shard computes, derived from ``config.processor`` (no Spark needed)."""

    kind: str  # "builtin" | "python"
    record_spec: RecordSpec
    state_format: str
    """``builtin-count/v1``, ``builtin-sum/v1`` or ``python/v1``: snapshots restore only into the same format."""
    state_columns: list[tuple[str, str]]
    """Snapshot columns besides ``key`` (and the ``key_group`` partition column)."""
    result_type: str
    python_ref: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    delta_expr_field: str | None = None  # builtin sum: the summed field
    schema: StateSchema | None = None
    """The Python processor's state schema (with defaults; None for the builtins)."""
    result_columns: list[tuple[str, str]] = field(default_factory=lambda: [("result", "bigint")])
    """The output's result columns ``(name, type)`` (the builtins and a plain ``result_type``: one, ``result``)."""
    ttl_ms: int | None = None
    """The Python processor's state TTL (None: none)."""
    layout: str = "runs"
    """The Python processor's state layout in the checkpoint: ``runs`` or ``blob`` (:mod:`spark_runtime.engine`)."""
    cache_dir: str = ""
    """Where the runs layout keeps local copies of runs (empty: the process's own temporary directory)."""
    state_buckets: int = 0
    """The runs layout's buckets of key groups: its grouping key (:func:`spark_runtime.engine.stateful.bucket_sql`)."""
    range_start: int = 0
    range_end: int = 0
    event_time: EventTimeSpec | None = None
    """The Task's event time (a Python processor only)."""
    timers: str | None = None
    """The processor's timers: ``event``, ``processing`` or None."""
    watermark_floor_ms: int = 0
    """A split or merged shard's parents' final watermark (docs/split-protocol.md, "Time across hand-overs")."""
    builtin: BuiltinProcessor | None = None
    """The builtin processor (None: a Python one)."""
    window: WindowSpec | None = None
    """A builtin's event-time window (:mod:`spark_runtime.windows`)."""

    @property
    def time_mode(self) -> str:
        """The stateful operator's ``timeMode``: ``EventTime`` with event time, ``ProcessingTime`` for
        processing-time timers, else ``None``."""
        if self.event_time is not None:
            return "EventTime"
        return "ProcessingTime" if self.timers == "processing" else "None"

    @property
    def uses_time(self) -> bool:
        """Whether the shard has event time or timers (its hand-overs restore; see docs/split-protocol.md)."""
        return self.event_time is not None or self.timers is not None

    @property
    def hands_over_by_restore(self) -> bool:
        """Whether the shard's hand-overs must restore (never catch up): event time, timers or a state TTL. Each
        decides by a clock of the batches that ran (the watermark, the batch timestamp), and a catch-up successor
        would re-run the parent's records at its own batches' times: it would expire keys the parent kept, keep keys
        the parent expired, and decide lateness and fire timers at other boundaries (docs/split-protocol.md, "Time
        across hand-overs")."""
        return self.uses_time or self.ttl_ms is not None

    @property
    def state_schema(self) -> str:
        """``key string, value bigint``: the snapshot's columns (the manifest records it)."""
        return ", ".join(["key string"] + [f"{n} {t}" for n, t in self.state_columns])

    @property
    def parameters_json(self) -> str:
        return json.dumps(self.parameters, sort_keys=True)


LOAD_MAP_BINS_PER_BUCKET = 16
"""Bins of the load map's histogram per bucket: its counts are exact while a batch reads at most this many input
partitions (Spark merges the partitions' partial histograms bin by bin until the bins run out)."""


def make_plan(config: ShardConfig) -> Plan:
    proc = config.processor
    if proc.builtin is not None:
        return _builtin_plan(config)
    assert proc.python is not None
    instance = load_processor(proc.python, proc.parameters)
    fields = dict(getattr(instance, "fields", {}) or {})
    timers = processor_time_domain(instance)
    event_time = config.event_time
    fields.update(_time_fields(proc.python, timers, event_time, fields))
    schema = processor_state_schema(instance)
    results = [(c.name, c.type) for c in processor_result_columns(instance)]
    r = config.key_groups
    return Plan(
        "python",
        dataclasses.replace(
            RecordSpec.build(config.key_field, fields, bool(getattr(instance, "raw_value", False))),
            record_time=event_time is not None and event_time.kafka_timestamp,
        ),
        f"python/v{STATE_FORMAT_VERSION}",
        schema.pairs,
        results[0][1],
        python_ref=proc.python,
        parameters=dict(proc.parameters or {}),
        schema=schema,
        result_columns=results,
        ttl_ms=processor_ttl_ms(instance),
        state_buckets=default_state_buckets(config),
        range_start=r.start,
        range_end=r.end,
        event_time=event_time,
        timers=timers,
    )


def _builtin_plan(config: ShardConfig) -> Plan:
    """count, sum, min or max per key, or per key and window (then with the Task's event time)."""
    proc = config.processor
    assert proc.builtin is not None
    typ = "bigint" if proc.builtin == BuiltinProcessor.COUNT else "double"
    fields = {proc.field: "double"} if proc.field is not None else {}
    window = proc.window
    event_time = config.event_time if window is not None else None
    if event_time is not None and event_time.field is not None:
        fields[event_time.field] = event_time.field_type
    spec = RecordSpec.build(config.key_field, fields)
    if event_time is not None and event_time.kafka_timestamp:
        spec = dataclasses.replace(spec, record_time=True)
    bounds = WINDOW_RESULT_COLUMNS if window is not None else []
    shape = f"-{window.describe()}" if window is not None else ""
    return Plan(
        "builtin",
        spec,
        f"builtin-{proc.builtin.value}{shape}/v1",
        [*bounds, ("value", typ)],
        typ,
        delta_expr_field=proc.field,
        result_columns=[*bounds, ("result", typ)],
        event_time=event_time,
        builtin=proc.builtin,
        window=window,
    )


def _time_fields(ref: str, timers: str | None, event_time: EventTimeSpec | None, fields: dict) -> dict[str, str]:
    """The record field the event time is read from (none for the Kafka timestamp, or without event time); raises
    :class:`ProcessorError` for timers the Task cannot serve, or a field the processor reads with another type."""
    if timers == "event" and event_time is None:
        raise ProcessorError(f"{ref}: timers = 'event' needs the Task's spec.eventTime (the watermark)")
    if timers == "processing" and event_time is not None:
        raise ProcessorError(
            f"{ref}: timers = 'processing' with spec.eventTime is not supported: use event-time timers, or a Task "
            "without eventTime"
        )
    if event_time is None or event_time.field is None:
        return {}
    declared = fields.get(event_time.field)
    if declared is not None and declared.rstrip("?") != event_time.field_type:
        raise ProcessorError(
            f"{ref}: fields[{event_time.field!r}] is {declared!r}, but spec.eventTime.format {event_time.format} "
            f"reads it as {event_time.field_type}"
        )
    return {event_time.field: event_time.field_type}


STATE_BUCKETS_CONF = "spark.taskshard.stateBuckets"


def default_state_buckets(config: ShardConfig) -> int:
    """Buckets of key groups for a new runs-layout checkpoint: ``spark.taskshard.stateBuckets``, else twice the
    shuffle partitions (at least 4), at most the shard's key groups."""
    conf = config.spark.conf
    wanted = conf.get(STATE_BUCKETS_CONF)
    if wanted is None:
        from spark_runtime.session import DEFAULT_CONF

        partitions = int(conf.get("spark.sql.shuffle.partitions", DEFAULT_CONF["spark.sql.shuffle.partitions"]))
        wanted = max(4, 2 * partitions)
    return max(1, min(int(wanted), config.key_groups.end - config.key_groups.start))


# ---------------------------------------------------------------- the streaming plan


def key_group_column(config: ShardConfig, column: str = "key") -> Any:
    """The key group of each record: ``pmod(hash(key), maxKeyGroups)``, or nested in the source's partitions
    (needs the ``partition`` column) with ``partitionedByKey``."""
    from pyspark.sql import functions as F

    return F.expr(config.key_grouping.sql(column, "partition")).cast("int")


def owned_records(
    config: ShardConfig, events: Any, skip: SkipRule | None = None, held_boundary: int | None = None
) -> Any:
    """Step 1 of the plan: ``events`` with their ``key_group``, only the shard's (a merged child's ``skip`` rule
    applied): the native key-group filter, right after the source (no Python on this path). A merged catch-up
    child's events carry a held column per parent: each record keeps its own parent's as
    :data:`~spark_runtime.protocol.HELD_COLUMN` (the right one's from ``held_boundary`` on)."""
    from pyspark.sql import functions as F

    r = config.range
    mine = events.withColumn("key_group", key_group_column(config))
    mine = mine.where(F.col("key_group").between(r.start, r.end - 1))
    if skip is not None:
        mine = mine.where(F.expr(skip.sql("key_group", "partition", "offset")))
    if HELD_RIGHT_COLUMN in mine.columns:
        if held_boundary is None:
            raise ValueError(f"a merged catch-up child's {HELD_RIGHT_COLUMN} column needs its parents' boundary")
        own = F.when(F.col("key_group") < held_boundary, F.col(HELD_COLUMN)).otherwise(F.col(HELD_RIGHT_COLUMN))
        mine = mine.withColumn(HELD_COLUMN, own).drop(HELD_RIGHT_COLUMN)
    return mine


def results_past_fence(config: ShardConfig, results: Any, records: Any, held_boundary: int | None = None) -> Any:
    """``results`` (a builtin aggregation's batch output) for the keys with an owned record that is not held among
    ``records`` (the batch's records read again, with :data:`spark_runtime.protocol.HELD_COLUMN`): the batch that
    reaches a catch-up child's fence emits only what its records at or after the fence changed; a key they did not
    touch keeps the total its parent emitted."""
    from pyspark.sql import functions as F

    keys = owned_records(config, records, held_boundary=held_boundary).where(~F.col(HELD_COLUMN)).select("key")
    return results.join(keys, "key", "left_semi")


def build_output_frame(
    spark: Any,
    config: ShardConfig,
    plan: Plan,
    events: Any,
    seed: dict[str, Any] | None,
    skip: SkipRule | None = None,
    held_boundary: int | None = None,
) -> Any:
    """The streaming DataFrame ``(key, key_group, result)`` (update mode) for ``events`` (the source's
    DataFrame). ``seed``, when restoring, holds the keyword arguments of
    :func:`spark_runtime.sources.seed.seed_stream` except ``mode`` and ``schema_ddl``; ``skip``, for a merged
    child, drops the rows one of its parents already counted (before the load map and the state); ``held_boundary``,
    for a merged catch-up child, is its right parent's first key group (:func:`owned_records`)."""
    from pyspark.sql import functions as F

    from spark_runtime.sources.seed import seed_stream

    kg = key_group_column(config)
    mine = _observe_load_map(config, owned_records(config, events, skip, held_boundary))
    if plan.window is not None:
        return window_frame(spark, config, plan, mine, kg, seed)
    if plan.kind == "builtin":
        return _builtin_frame(spark, config, plan, mine, kg, seed)
    ev = mine.withColumn("seed", F.lit(None).cast("binary"))
    if seed is not None:
        ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in ev.schema.fields)
        ev = seed_stream(spark, mode="blobs", schema_ddl=ddl, **seed).unionByName(ev)
    return python_state_frame(plan, ev, config.shard)


def _observe_load_map(config: ShardConfig, mine: Any) -> Any:
    """``mine`` with the shard's load map observed per batch when key-group metrics are on."""
    from pyspark.sql import functions as F

    if not live.key_group_metrics_enabled(config.spark.conf):
        return mine
    r = config.range
    # Rows per bucket of key groups, per batch (in the progress' observedMetrics): the shard's load map. One
    # aggregate, histogram_numeric over the bucket index. Its merge of the partitions' partial histograms keeps
    # every partial bin while the total fits in the bins and then merges neighbouring bins, which misattributes
    # rows (measured: 64 values in 16 partitions, 17 of 64 buckets wrong with 64 bins, none with 1024); so the
    # bins are LOAD_MAP_BINS_PER_BUCKET times the buckets: exact up to that many partitions per batch.
    # Opt-in: Spark's observe() sits between the source and the aggregation outside whole-stage code
    # generation, which costs about a tenth of the native path's throughput whatever it computes (64
    # conditional sums: a third; a sampled histogram: no cheaper).
    n = len(live.key_group_buckets(r.start, r.end))
    bucket = F.floor(((F.col("key_group") - r.start + 1) * n - 1) / (r.end - r.start)).cast("int")
    return mine.observe(
        live.KEY_GROUP_METRICS,
        F.histogram_numeric(bucket, F.lit(max(2, n * LOAD_MAP_BINS_PER_BUCKET))).alias("buckets"),
        F.count(F.lit(1)).alias("rows"),
    )


def _builtin_frame(spark: Any, config: ShardConfig, plan: Plan, mine: Any, kg: Any, seed: dict[str, Any] | None) -> Any:
    """A builtin aggregation's ``(key, key_group, result)``: per key the sum (count: of ones), min or max of the
    records' deltas, on top of a restored child's seed rows."""
    from pyspark.sql import functions as F

    from spark_runtime.sources.seed import seed_stream

    delta_type = plan.result_type
    if plan.delta_expr_field is None:
        delta = F.lit(1).cast("bigint")
    else:
        delta = F.col(f"`{plan.delta_expr_field}`").cast("double")
    if config.key_grouping.nested:
        # A key's group depends on its partition, which the aggregation would drop: group by both (one key
        # is in one partition, so this is still one row per key), and the state key carries the group.
        deltas = mine.select("key", "key_group", delta.alias("delta"))
        ddl = f"key string, key_group int, delta {delta_type}"
    else:
        deltas = mine.select("key", delta.alias("delta"))
        ddl = f"key string, delta {delta_type}"
    if seed is not None:
        deltas = seed_stream(spark, mode="rows", schema_ddl=ddl, **seed).unionByName(deltas)
    total = {BuiltinProcessor.MIN: F.min, BuiltinProcessor.MAX: F.max}.get(plan.builtin, F.sum)
    if config.key_grouping.nested:
        agg = deltas.groupBy("key", "key_group").agg(total("delta").alias("result"))
        return agg.select("key", "key_group", "result")
    agg = deltas.groupBy("key").agg(total("delta").alias("result"))
    return agg.select("key", kg.alias("key_group"), "result")


def event_columns(plan: Plan) -> list[str]:
    """The columns of the ``events`` a Python processor receives."""
    columns = ["key"] + [f.name for f in plan.record_spec.fields]
    columns += ["value"] if plan.record_spec.raw_value else []
    columns += [EVENT_TIME] if plan.event_time is not None else []
    return columns + ["partition", "offset"]


def output_ddl(plan: Plan) -> str:
    """The output's schema: ``key string, key_group int``, the result columns, and with event time ``_late string``
    (a late record's dead letter, on rows whose results are null)."""
    late = [f"{LATE} string"] if plan.event_time is not None else []
    return ", ".join(["key string", "key_group int"] + [f"`{n}` {t}" for n, t in plan.result_columns] + late)


def python_state_frame(plan: Plan, ev: Any, shard: str = "") -> Any:
    """``ev`` (the shard's events and seed rows, with ``key_group``) through the Python processor, in the plan's
    state layout."""
    assert plan.python_ref is not None and plan.schema is not None
    if plan.layout == "blob" and plan.uses_time:
        raise ProcessorError("event time and timers need the runs state layout (this checkpoint holds the blob one)")
    if plan.layout == "blob":
        from pyspark.sql.streaming.state import GroupStateTimeout

        from spark_runtime.engine.blob import make_group_function

        fn = make_group_function(
            plan.python_ref,
            plan.parameters_json,
            plan.schema,
            event_columns(plan),
            [n for n, _ in plan.result_columns],
        )
        return ev.groupBy("key_group").applyInPandasWithState(
            fn,
            outputStructType=output_ddl(plan),
            stateStructType="state binary",
            outputMode="update",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    from pyspark.sql import functions as F

    from spark_runtime.engine.packing import NOW, PACKED_DDL, pack_events
    from spark_runtime.engine.stateful import RunsProcessor, RunsSettings, bucket_sql, default_cache_dir

    settings = RunsSettings(
        ref=plan.python_ref,
        parameters_json=plan.parameters_json,
        schema_json=plan.schema.to_json(),
        result_names=tuple(n for n, _ in plan.result_columns),
        event_columns=tuple(event_columns(plan)),
        cache_dir=plan.cache_dir or default_cache_dir(),
        ttl_ms=plan.ttl_ms,
        time_mode=plan.time_mode,
        timers=plan.timers,
        lateness_ms=plan.event_time.lateness_ms if plan.event_time is not None else None,
        watermark_floor_ms=plan.watermark_floor_ms,
        shard=shard,
    )
    bucket = F.expr(bucket_sql(plan.range_start, plan.range_end, plan.state_buckets))
    if plan.ttl_ms is not None:  # the batch's own time (fixed per micro-batch, the same on a replay)
        ev = ev.withColumn(NOW, F.unix_millis(F.current_timestamp()))
    if plan.event_time is not None:
        ev = with_watermark(ev, plan.event_time)
    packed = ev.mapInArrow(pack_events, PACKED_DDL).withColumn("bucket", bucket)
    return packed.groupBy("bucket").transformWithStateInPandas(
        RunsProcessor(settings), outputStructType=output_ddl(plan), outputMode="Update", timeMode=plan.time_mode
    )


WATERMARK_COLUMN = "_event_ts"


def with_watermark(ev: Any, event_time: EventTimeSpec) -> Any:
    """``ev`` with the column ``event_time`` (epoch ms, from the record field) and Spark's watermark over it: the
    largest event time of the earlier batches minus the out-of-orderness, kept in the offset log (a replay runs with
    the same one). The timestamp column Spark tracks is dropped before the stateful operator, so Spark itself drops
    no row: the runtime sends late records to the dead letters (:class:`spark_runtime.engine.stateful.
    RunsProcessor`). Seed rows (no event time) count as time 0."""
    from pyspark.sql import functions as F

    if event_time.field is not None:
        ev = ev.withColumn(EVENT_TIME, F.expr(event_time.millis_sql(event_time.field)))
    else:  # the Kafka record's timestamp (the source's record_time column)
        ev = ev.withColumn(EVENT_TIME, F.col(RECORD_TIME)).drop(RECORD_TIME)
    ev = ev.withColumn(WATERMARK_COLUMN, F.timestamp_millis(F.coalesce(F.col(EVENT_TIME), F.lit(0))))
    return ev.withWatermark(WATERMARK_COLUMN, f"{event_time.delay_ms} milliseconds").drop(WATERMARK_COLUMN)
