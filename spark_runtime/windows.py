"""Builtin windows: count, sum, min or max per key and event-time window, run as Spark's native streaming
aggregation (``groupBy(window(ts, size[, slide]), key)`` or ``groupBy(session_window(ts, gap), key)``), with
Spark's watermark (``withWatermark``) closing the windows.

Rules (docs/processors.md, "Builtin windows"; docs/split-protocol.md, "Time across hand-overs"):

- **Emission.** ``emit: final`` writes a window once, in the batch whose watermark passes its end (Spark's append
  mode); ``emit: updates`` writes it after every batch that changed it (update mode). Output rows are
  ``key, key_group, window_start, window_end, result`` (epoch milliseconds; a session's end is its last record's
  time plus the gap).
- **Late records.** Spark drops a record for a window whose end is at or before the previous batch's watermark
  (``eventTimeWatermarkForLateEvents``). A record all of whose windows are closed that way (tumbling, session: its
  one window; sliding: the last window covering it) is **late**: a dead letter with reason ``late`` in
  ``late-b<batch>.jsonl``, written before the batch commits. A sliding record with some windows still open counts
  in those and is no dead letter. Spark does not hand the dropped records back, so :class:`WindowLateLetters`
  finds them only for a batch in which Spark dropped anything (its ``numRowsDroppedByWatermark``, read from the
  batch's executed plan) or which ran below the shard's floor: it reads the batch's positions range again (a
  bounded read, :class:`spark_runtime.sources.base.ReadsRanges`) and applies the same rule; a replay finds the same
  records and rewrites the same file.
- **Hand-overs** (restore mode). A snapshot row is one open window: ``key, window_start, window_end, value``. A
  successor seeds each as one row at the window's start (tumbling, sliding: only the window starting there keeps
  it), or, for a session, as rows less than a gap apart from its start to its last record (the first carries the
  value), so Spark rebuilds the same session. A seed row is never late. The watermark starts at the parents' final
  one (the floor): one seed row without a key carries the parents' largest event time through ``withWatermark``
  (then is dropped), and until Spark's own watermark reaches the floor, records for windows ending at or before it
  are late.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_runtime.config import BuiltinProcessor, ShardConfig, WindowEmit, WindowKind, WindowSpec
from spark_runtime.sources.base import ReadsRanges, SourceContext

__all__ = [
    "WINDOW_RESULT_COLUMNS",
    "WindowLateFinder",
    "dropped_by_watermark",
    "last_window_end_ms",
    "output_mode",
    "session_seed_points",
    "window_frame",
    "window_state_rows",
]

T = "_t"
"""Epoch milliseconds of a record's event time (a seed row's: a point of its window)."""
TS = "_ts"
"""The timestamp column Spark's watermark tracks."""
WINDOW_START, WINDOW_END = "window_start", "window_end"
WINDOW_RESULT_COLUMNS = [(WINDOW_START, "bigint"), (WINDOW_END, "bigint")]
"""A window's bounds among the output's and the snapshot's columns (epoch milliseconds)."""


def output_mode(window: WindowSpec | None) -> str:
    """Spark's output mode: append for ``emit: final``, else update (also for every plan without a window)."""
    return "append" if window is not None and window.emit == WindowEmit.FINAL else "update"


def last_window_end_ms(window: WindowSpec, t: int) -> int:
    """The end of the last window a record at ``t`` (epoch ms) falls in: a record is late when it is at or before
    the late threshold (a session's window is the record's own ``[t, t + gap)``)."""
    if window.type == WindowKind.SESSION:
        return t + window.gap_ms
    return t - t % window.slide_ms + window.size_ms


def session_seed_points(window: WindowSpec, start: int, end: int) -> list[int]:
    """The event times of a session ``[start, end)``'s seed rows: from its start to its last record's time
    (``end - gap``), less than a gap apart, so Spark merges them back into one session with the same bounds."""
    last = end - window.gap_ms
    step = max(1, window.gap_ms // 2)
    return sorted(set(range(start, last + 1, step)) | {last})


def _last_window_end(window: WindowSpec, t: Any) -> Any:
    """:func:`last_window_end_ms` as a Spark column over the epoch-ms column ``t``."""
    from pyspark.sql import functions as F

    if window.type == WindowKind.SESSION:
        return t + F.lit(window.gap_ms)
    return t - F.pmod(t, F.lit(window.slide_ms)) + F.lit(window.size_ms)


def late_rule(window: WindowSpec, t: Any, threshold: int) -> Any:
    """The column ``true`` for a record at ``t`` that is late at ``threshold`` (every window of it closed)."""
    return _last_window_end(window, t) <= threshold


def _aggregate(builtin: BuiltinProcessor, column: Any) -> Any:
    from pyspark.sql import functions as F

    if builtin == BuiltinProcessor.MIN:
        return F.min(column)
    if builtin == BuiltinProcessor.MAX:
        return F.max(column)
    return F.sum(column)  # count: the sum of ones (a seed row carries its count)


def _window_column(window: WindowSpec, ts: Any) -> Any:
    from pyspark.sql import functions as F

    if window.type == WindowKind.SESSION:
        return F.session_window(ts, f"{window.gap_ms} milliseconds")
    if window.type == WindowKind.SLIDING:
        return F.window(ts, f"{window.size_ms} milliseconds", f"{window.slide_ms} milliseconds")
    return F.window(ts, f"{window.size_ms} milliseconds")


def event_time_column(plan: Any) -> Any:
    """A record's event time in epoch milliseconds (from the record field, or the Kafka record's timestamp)."""
    from pyspark.sql import functions as F

    from spark_runtime.records import RECORD_TIME

    et = plan.event_time
    return F.expr(et.millis_sql(et.field)) if et.field is not None else F.col(RECORD_TIME)


def window_frame(spark: Any, config: Any, plan: Any, mine: Any, key_group: Any, seed: dict | None) -> Any:
    """The shard's windowed aggregation over ``mine`` (its records, key groups filtered): the streaming DataFrame
    ``key, key_group, window_start, window_end, result`` (``key_group``: the expression of the key's group).
    ``seed``: a restored shard's :func:`spark_runtime.sources.seed.seed_stream` arguments (see the module
    docstring for the rows it adds)."""
    from pyspark.sql import functions as F

    window, et = plan.window, plan.event_time
    nested = config.key_grouping.nested
    floor = plan.watermark_floor_ms
    delta = F.lit(1).cast("bigint") if plan.delta_expr_field is None else F.col(f"`{plan.delta_expr_field}`")
    groups = [F.col("key_group")] if nested else []
    events = mine.select(
        "key",
        *groups,
        delta.cast(plan.result_type).alias("delta"),
        event_time_column(plan).alias(T),
        F.lit(None).cast("bigint").alias(WINDOW_START),
        F.lit(None).cast("bigint").alias(WINDOW_END),
    )
    if floor > 0 and window.type != WindowKind.SLIDING:  # below the floor Spark's own rule is not there yet
        events = events.where(~late_rule(window, F.col(T), floor))
    frame = events
    if seed is not None:
        frame = events.unionByName(_seed_rows(spark, plan, nested, seed))
    frame = frame.withColumn(TS, F.timestamp_millis(T)).withWatermark(TS, f"{et.delay_ms} milliseconds")
    frame = frame.select(_window_column(window, F.col(TS)).alias("window"), "key", *groups, "delta", WINDOW_START, TS)
    # The carrier (no key) is dropped after the watermark saw it; the condition names the event time, so Spark
    # cannot push it below withWatermark.
    keep = F.col("key").isNotNull() | F.col(TS).isNull()
    if window.type != WindowKind.SESSION:  # a seed row counts only in the window it was taken from
        starts = F.unix_millis(F.col("window.start"))
        keep = keep & (F.col(WINDOW_START).isNull() | (starts == F.col(WINDOW_START)))
        if floor > 0 and window.type == WindowKind.SLIDING:  # records' windows the parents closed
            keep = keep & (F.col(WINDOW_START).isNotNull() | (F.unix_millis(F.col("window.end")) > floor))
    total = _aggregate(plan.builtin, F.col("delta")).alias("result")
    agg = frame.where(keep).groupBy("window", "key", *groups).agg(total)
    return agg.select(
        "key",
        F.col("key_group") if nested else key_group.alias("key_group"),
        F.unix_millis(F.col("window.start")).alias(WINDOW_START),
        F.unix_millis(F.col("window.end")).alias(WINDOW_END),
        "result",
    )


def _seed_rows(spark: Any, plan: Any, nested: bool, seed: dict) -> Any:
    """The restored windows as rows of the event frame's columns (see the module docstring), and the carrier of
    the parents' watermark when there is one."""
    from pyspark.sql import functions as F

    from spark_runtime.sources.seed import seed_stream

    window = plan.window
    ddl = ", ".join(
        ["key string"]
        + (["key_group int"] if nested else [])
        + [f"delta {plan.result_type}", f"{T} bigint", f"{WINDOW_START} bigint", f"{WINDOW_END} bigint"]
    )
    carrier = None
    if plan.watermark_floor_ms > 0:  # the largest event time that gives the floor
        carrier = {T: plan.watermark_floor_ms + plan.event_time.delay_ms}
    rows = seed_stream(spark, mode="rows", schema_ddl=ddl, carrier=carrier, **seed)
    if window.type != WindowKind.SESSION:
        return rows.withColumn(T, F.coalesce(F.col(WINDOW_START), F.col(T)))
    step = max(1, window.gap_ms // 2)
    last = F.greatest(F.col(WINDOW_END) - F.lit(window.gap_ms), F.col(WINDOW_START))
    points = F.when(F.col(WINDOW_END).isNull(), F.array(F.col(T))).otherwise(
        F.array_union(F.sequence(F.col(WINDOW_START), last, F.lit(step).cast("bigint")), F.array(last))
    )
    exploded = rows.select("*", F.posexplode(points).alias("_pos", "_point"))
    return exploded.select(
        "key",
        *(["key_group"] if nested else []),
        F.when(F.col("_pos") == 0, F.col("delta")).alias("delta"),
        F.col("_point").alias(T),
        F.lit(None).cast("bigint").alias(WINDOW_START),
        F.lit(None).cast("bigint").alias(WINDOW_END),
    )


def window_state_rows(st: Any, config: Any, key_group: Any) -> Any:
    """The open windows in a State Data Source frame ``st`` of a windowed aggregation as snapshot rows ``key,
    window_start, window_end, value, key_group`` (``key_group``: the expression of the key's group, or taken from
    the state key when nested). Tumbling and sliding state keys are ``(window, key)``; a session's key is ``(key,
    sessionStartTime)`` and its value holds the session ``window``."""
    from pyspark.sql import functions as F

    value_fields = st.schema["value"].dataType.fieldNames()
    session = "sessionStartTime" in st.schema["key"].dataType.fieldNames()
    bounds = "value.window" if session else "key.window"
    rows = st.select(
        F.col("key.key").alias("key"),
        F.unix_millis(F.col(f"{bounds}.start")).alias(WINDOW_START),
        F.unix_millis(F.col(f"{bounds}.end")).alias(WINDOW_END),
        F.col(f"value.`{value_fields[-1]}`").alias("value"),
        *([F.col("key.key_group").cast("int").alias("key_group")] if config.key_grouping.nested else []),
    )
    return rows if config.key_grouping.nested else rows.withColumn("key_group", key_group)


def dropped_by_watermark(query: Any) -> tuple[int, int]:
    """``(rows, watermark)`` of the batch ``query`` is running: the rows its stateful operators dropped as late
    (Spark's ``numRowsDroppedByWatermark``: aggregated rows, so not a count of records, but zero exactly when no
    record was dropped) and the watermark they dropped them by (``eventTimeWatermarkForLateEvents``; 0: none).
    Read from the batch's executed plan, whose metrics are complete once the batch's output was written."""
    execution = query._jsq.streamingQuery().lastExecution()
    rows, watermark = 0, 0
    pending = [execution.executedPlan()]
    while pending:
        node = pending.pop()
        children = node.children()
        pending += [children.apply(i) for i in range(children.size())]
        if "StateStore" not in node.nodeName():
            continue
        metrics = node.metrics()
        if not metrics.contains("numRowsDroppedByWatermark"):
            continue
        rows += int(metrics.apply("numRowsDroppedByWatermark").value())
        late = node.eventTimeWatermarkForLateEvents()  # the operators that drop: the save (restore for sessions)
        if late.isDefined():
            watermark = max(watermark, int(late.get()))
    return rows, watermark


@dataclass(frozen=True)
class WindowLateFinder:
    """Finds a builtin window batch's late records (see the module docstring): ``source`` reads a batch's range
    again with ``context`` (the stream's :class:`~spark_runtime.sources.base.SourceContext`); ``positions_at(n)``
    gives the end positions of batch ``n`` from the offset log (the start positions for -1)."""

    config: ShardConfig
    plan: Any
    source: ReadsRanges
    context: SourceContext
    positions_at: Callable[[int], dict[str, Any]]

    def letters(self, spark: Any, query: Any, batch_id: int) -> list[str]:
        """Batch ``batch_id``'s late records as dead-letter JSON lines (empty when Spark dropped nothing and the
        batch ran at or above the floor)."""
        from pyspark.sql import functions as F

        from spark_runtime.pipeline import owned_records

        dropped, late_watermark = dropped_by_watermark(query)
        floor = self.plan.watermark_floor_ms
        if dropped == 0 and late_watermark >= floor:
            return []
        threshold = max(late_watermark, floor)
        start, end = self.positions_at(batch_id - 1), self.positions_at(batch_id)
        if start == end:  # a batch without input (the watermark moved): nothing to find
            return []
        records = owned_records(self.config, self.source.read_range(spark, self.context, start, end), self.context.skip)
        t = event_time_column(self.plan)
        late = records.withColumn(T, t).where(late_rule(self.plan.window, F.col(T), threshold))
        fields = ["key"] + [f.name for f in self.plan.record_spec.fields]
        rows = late.select("key", "key_group", "partition", "offset", T, F.to_json(F.struct(*fields)).alias("line"))
        return [self._letter(row, threshold) for row in rows.orderBy("partition", "offset").collect()]

    def _letter(self, row: Any, threshold: int) -> str:
        t = int(row[T])
        return json.dumps(
            {
                "shard": self.config.shard,
                "partition": int(row["partition"]),
                "offset": int(row["offset"]),
                "reason": "late",
                "detail": f"event time {t} is in no open window: its last window ends at "
                f"{last_window_end_ms(self.plan.window, t)}, at or before the watermark {threshold}",
                "key": str(row["key"]),
                "key_group": int(row["key_group"]),
                "line": row["line"],
            },
            ensure_ascii=False,
        )
