"""The shard's Spark plan: source -> native key-group filter -> keyed state -> ``(key, key_group, result)``
(the export of that state as a key-group-indexed snapshot is :mod:`spark_runtime.snapshot.export`'s).

Two processing kinds share the source, the filter, the seeding and the sink:

``builtin`` (count, sum)
    Spark's native streaming aggregation ``groupBy(key).agg(sum(delta))`` (delta = 1 for count, the field
    for sum), state in the RocksDB state store. Seeded by one seed row per key whose delta is the parent's
    total. State rows in the checkpoint: key ``{key}``, value ``{sum}``; snapshot columns ``key, value``.
``python``
    ``groupBy(key_group).applyInPandasWithState``: one Python call per key group per batch with a pandas
    DataFrame of many keys (see :mod:`spark_runtime.processor`); the group's state is one Arrow IPC table
    (``key`` + the processor's state columns) in the state store. Seeded by one blob per key group.
    Snapshot columns ``key`` + the state columns.

Both snapshots are Parquet under ``state/key_group=<n>/`` (one directory per key group, one file per
directory), so a child reads only its key groups' files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spark_runtime import live
from spark_runtime.config import BuiltinProcessor, ShardConfig
from spark_runtime.processor import load_processor, result_column_type, state_columns
from spark_runtime.protocol import SkipRule
from spark_runtime.records import RecordSpec

__all__ = ["Plan", "build_output_frame", "key_group_column", "make_plan"]

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
    if proc.builtin == BuiltinProcessor.COUNT:
        return Plan("builtin", RecordSpec.build(config.key_field), "builtin-count/v1", [("value", "bigint")], "bigint")
    if proc.builtin == BuiltinProcessor.SUM:
        assert proc.field is not None
        return Plan(
            "builtin",
            RecordSpec.build(config.key_field, {proc.field: "double"}),
            "builtin-sum/v1",
            [("value", "double")],
            "double",
            delta_expr_field=proc.field,
        )
    assert proc.python is not None
    instance = load_processor(proc.python, proc.parameters)
    fields = dict(getattr(instance, "fields", {}) or {})
    return Plan(
        "python",
        RecordSpec.build(config.key_field, fields, bool(getattr(instance, "raw_value", False))),
        f"python/v{STATE_FORMAT_VERSION}",
        state_columns(instance.state_schema),
        result_column_type(instance.result_type),
        python_ref=proc.python,
        parameters=dict(proc.parameters or {}),
    )


# ---------------------------------------------------------------- the streaming plan


def key_group_column(config: ShardConfig, column: str = "key") -> Any:
    """The key group of each record: ``pmod(hash(key), maxKeyGroups)``, or nested in the source's partitions
    (needs the ``partition`` column) with ``partitionedByKey``."""
    from pyspark.sql import functions as F

    return F.expr(config.key_grouping.sql(column, "partition")).cast("int")


def build_output_frame(
    spark: Any,
    config: ShardConfig,
    plan: Plan,
    events: Any,
    seed: dict[str, Any] | None,
    skip: SkipRule | None = None,
) -> Any:
    """The streaming DataFrame ``(key, key_group, result)`` (update mode) for ``events`` (the source's
    DataFrame). ``seed``, when restoring, holds the keyword arguments of
    :func:`spark_runtime.sources.seed.seed_stream` except ``mode`` and ``schema_ddl``; ``skip``, for a merged
    child, drops the rows one of its parents already counted (before the load map and the state)."""
    from pyspark.sql import functions as F

    from spark_runtime.sources.seed import seed_stream

    r = config.range
    kg = key_group_column(config)
    # Step 1: the native key-group filter, right after the source (no Python on this path).
    mine = events.withColumn("key_group", kg).where(F.col("key_group").between(r.start, r.end - 1))
    if skip is not None:
        mine = mine.where(F.expr(skip.sql("key_group", "partition", "offset")))
    if live.key_group_metrics_enabled(config.spark.conf):
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
        mine = mine.observe(
            live.KEY_GROUP_METRICS,
            F.histogram_numeric(bucket, F.lit(max(2, n * LOAD_MAP_BINS_PER_BUCKET))).alias("buckets"),
            F.count(F.lit(1)).alias("rows"),
        )
    if plan.kind == "builtin":
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
        if config.key_grouping.nested:
            agg = deltas.groupBy("key", "key_group").agg(F.sum("delta").alias("result"))
            return agg.select("key", "key_group", "result")
        agg = deltas.groupBy("key").agg(F.sum("delta").alias("result"))
        return agg.select("key", kg.alias("key_group"), "result")

    from pyspark.sql.streaming.state import GroupStateTimeout

    ev = mine.withColumn("seed", F.lit(None).cast("binary"))
    if seed is not None:
        ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in ev.schema.fields)
        ev = seed_stream(spark, mode="blobs", schema_ddl=ddl, **seed).unionByName(ev)
    fn = make_group_function(plan)
    return ev.groupBy("key_group").applyInPandasWithState(
        fn,
        outputStructType=f"key string, key_group int, result {plan.result_type}",
        stateStructType="state binary",
        outputMode="update",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def make_group_function(plan: Plan) -> Any:
    """The ``applyInPandasWithState`` function: one call per key group per micro-batch."""
    ref, params_json, columns = plan.python_ref, plan.parameters_json, list(plan.state_columns)
    event_columns = ["key"] + [f.name for f in plan.record_spec.fields]
    event_columns += ["value"] if plan.record_spec.raw_value else []
    event_columns += ["partition", "offset"]

    def process_key_group(key: tuple, frames: Any, state: Any) -> Any:
        import warnings

        import numpy as np
        import pandas as pd

        # pyspark's worker concatenates our output frames; pandas 2.x warns about all-NA columns there.
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*concatenation with empty or all-NA")

        from spark_runtime import processor as P

        proc = P.cached_processor(ref, params_json)
        pdf = pd.concat(list(frames), ignore_index=True)
        group = int(key[0])
        table = P.decode_state_table(state.get[0]) if state.exists else None
        current = P.state_frame(table, columns)
        seeded = pdf["seed"].notna()
        if seeded.any():  # batch 0 of a restored child: install the parent's slice
            parts = [current] + [P.state_frame(P.decode_state_table(b), columns) for b in pdf.loc[seeded, "seed"]]
            current = pd.concat(parts, ignore_index=True)
            pdf = pdf[~seeded]
        order = np.lexsort((pdf["offset"].to_numpy(), pdf["partition"].to_numpy()))  # source order per partition
        events = pdf[event_columns].take(order).reset_index(drop=True)
        outputs = None
        if len(events):
            current, outputs = P.run_processor(proc, events, current, columns)
        if len(current):
            state.update((P.encode_state_table(P.frame_to_state_table(current, columns)),))
        elif state.exists:
            state.remove()
        if outputs is not None and len(outputs):
            yield pd.DataFrame({"key": outputs["key"].astype(str), "key_group": group, "result": outputs["result"]})

    return process_key_group
