"""Live shard metrics: what the runtime exports on its metrics endpoint and what the operator reads back into the
TaskShard's ``status.live`` (the RATE, LAG and LAST BATCH columns). The one contract both sides import.

Pure: no Spark, no Kubernetes client, no I/O (the exporter is :mod:`spark_runtime.metrics`, the operator's scraper
``taskshard_operator.live``).

The endpoint: ``http://<pod IP>:<port>/metrics`` in the Prometheus text format (port ``metricsPort`` in the shard
config, :data:`METRICS_PORT` by default, named :data:`PORT_NAME` on the driver container; the runtime binds the
address in ``$TASKSHARD_METRICS_HOST``, the pod's IP from the downward API, or every address when unset). Every
series carries the labels ``task`` and ``shard``. Names (:class:`Metric`):

================================================  ========  ==========================================================
``taskshard_shard_rows_total``                    counter   input rows of committed batches of this process
``taskshard_shard_rows_per_second``               gauge     input rows committed per second over the last
                                                            :data:`RATE_WINDOW_SECONDS` (the RATE column)
``taskshard_shard_processed_rows_per_second``     gauge     Spark's processedRowsPerSecond of the last batch
``taskshard_shard_lag``                           gauge     input not yet processed, label ``unit`` = ``records``
                                                            (Kafka: offsets behind the latest) or ``bytes`` (journal)
``taskshard_shard_partition_lag``                 gauge     the same per source partition (label ``partition``:
                                                            ``p0.jsonl`` (journal), ``<topic>/<partition>`` (Kafka))
``taskshard_shard_lag_seconds``                   gauge     seconds to work off the lag at the pace the source was
                                                            consumed over the rate window (+Inf: no progress; absent:
                                                            lag unknown): the autoscaler's signal
``taskshard_shard_last_batch``                    gauge     the last committed batch id (-1: none yet)
``taskshard_shard_last_batch_timestamp_seconds``  gauge     when it was committed (Unix time; 0: unknown)
``taskshard_shard_batch_duration_seconds``        gauge     the last batch's durations, label ``part`` (Spark's
                                                            durationMs keys; ``triggerExecution``: the whole batch)
``taskshard_shard_batch_running_seconds``         gauge     how long the batch in flight has run without committing
                                                            (0: none in flight): a hung batch shows here, and the
                                                            operator's NoProgress condition reads it
``taskshard_shard_state_rows``                    gauge     state rows (all stateful operators)
``taskshard_shard_state_bytes``                   gauge     state memory used in bytes
``taskshard_shard_dead_letters_total``            counter   dead letters of this shard (journal: all runs, from its
                                                            dead-letter files; Kafka: this process's)
``taskshard_shard_watermark_seconds``             gauge     the event-time watermark the next batch runs with (Unix
                                                            time; only with event time)
``taskshard_shard_late_records_total``            counter   records later than the watermark allows (dead letters
                                                            with reason ``late``, all runs; only with event time)
``taskshard_shard_restarts_total``                counter   in-process query restarts
``taskshard_shard_emitting``                      gauge     1 while the shard writes to its sink
``taskshard_shard_key_group_rows_total``          counter   input rows per bucket of key groups (label ``key_groups``
                                                            = ``<start>-<end>``; at most :data:`KEY_GROUP_BUCKETS`
                                                            buckets; only with :data:`KEY_GROUP_METRICS_CONF`)
``taskshard_shard_key_group_state_rows``          gauge     state rows per bucket of key groups (label ``key_groups``,
                                                            the buckets of the load map) at the batch below: the
                                                            state map (only with :data:`KEY_GROUP_METRICS_CONF`)
``taskshard_shard_state_map_batch``               gauge     the committed batch the state map counts (absent: none)
``taskshard_shard_writer_epoch``                  gauge     this runtime's writer epoch (0: none claimed yet)
``taskshard_shard_heartbeat_timestamp_seconds``   gauge     when the runtime's poll loop last ran (Unix time; 0: not
                                                            yet): a loop blocked in a storage call shows here while
                                                            the endpoint still answers (the operator's NoProgress)
================================================  ========  ==========================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spark_runtime.protocol import rfc3339

__all__ = [
    "KEY_GROUP_BUCKETS",
    "KEY_GROUP_METRICS",
    "METRICS_HOST_ENV",
    "METRICS_PATH",
    "METRICS_PORT",
    "PORT_NAME",
    "LAG_SECONDS_STALLED",
    "RATE_WINDOW_SECONDS",
    "STATE_MAP_SECONDS_CONF",
    "LiveStats",
    "Metric",
    "lag_seconds_status",
    "live_stats",
    "state_map_seconds",
]

METRICS_PORT = 9108
PORT_NAME = "metrics"
METRICS_PATH = "/metrics"
METRICS_HOST_ENV = "TASKSHARD_METRICS_HOST"
RATE_WINDOW_SECONDS = 60.0
"""The window of the RATE gauge: rows of the batches committed within it, divided by it (or, while the process
has run batches for less, by the time since its first batch began, at least 1 s)."""


KEY_GROUP_BUCKETS = 64
"""Input rows per key group are counted in at most this many contiguous buckets of the shard's range (one bucket
per key group for a range of up to 64): the load map a split point is chosen from."""
KEY_GROUP_METRICS = "taskshard_key_groups"
"""The name of the observed metrics (Spark's ``Dataset.observe``) holding a batch's rows per bucket."""
KEY_GROUP_METRICS_CONF = "spark.taskshard.keyGroupMetrics"
"""Spark conf key: ``true`` turns the per-key-group row counts (the load map) on; off by default, because they
cost about a tenth of the native path's throughput (docs/benchmarks.md)."""


STATE_MAP_SECONDS_CONF = "spark.taskshard.stateMapSeconds"
"""Spark conf key: how often (seconds, at most) the runtime counts its state rows per key group, the state map a
``by: state`` split point is chosen from (:mod:`spark_runtime.state_map`). Only with :data:`KEY_GROUP_METRICS_CONF`;
``0`` turns the state map alone off."""
DEFAULT_STATE_MAP_SECONDS = 60.0


def key_group_metrics_enabled(conf: Mapping[str, str]) -> bool:
    """Whether a shard's Spark conf asks for the load map (:data:`KEY_GROUP_METRICS_CONF`)."""
    return str(conf.get(KEY_GROUP_METRICS_CONF, "false")).lower() == "true"


def state_map_seconds(conf: Mapping[str, str]) -> float:
    """Seconds between two counts of the state map (0: no state map: the load map is off, or
    :data:`STATE_MAP_SECONDS_CONF` is 0). Raises ValueError naming the key for a value that is not a number >= 0."""
    raw = conf.get(STATE_MAP_SECONDS_CONF)
    seconds = DEFAULT_STATE_MAP_SECONDS
    if raw is not None:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            raise ValueError(
                f"spark.conf.{STATE_MAP_SECONDS_CONF}: {raw!r} is invalid: expected a number of seconds >= 0 (0: no "
                f"state map), e.g. {DEFAULT_STATE_MAP_SECONDS:g}"
            )
    return seconds if key_group_metrics_enabled(conf) else 0.0


def key_group_buckets(start: int, end: int, buckets: int = KEY_GROUP_BUCKETS) -> list[tuple[int, int]]:
    """``[start, end)`` cut into at most ``buckets`` contiguous ``(start, end)`` ranges of near-equal size:
    bucket ``i`` starts at ``start + floor(size * i / n)``; key group ``kg`` is in bucket
    ``floor(((kg - start + 1) * n - 1) / size)`` (:func:`bucket_of`, the same formula the plan evaluates)."""
    size = end - start
    n = max(1, min(buckets, size))
    cuts = [start + (size * i) // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def bucket_of(kg: int, start: int, end: int, buckets: int = KEY_GROUP_BUCKETS) -> int:
    """The index in :func:`key_group_buckets` of the bucket holding key group ``kg``."""
    size = end - start
    n = max(1, min(buckets, size))
    return ((kg - start + 1) * n - 1) // size


def bucket_rows(observed: Any, start: int, end: int, total: int | None = None) -> dict[str, float]:
    """A batch's rows per bucket, ``{"<a>-<b>": rows}``, from its observed ``histogram_numeric`` value (a list of
    ``{"x": bucket index, "y": rows}``; equal ``x`` can repeat after a merge and are added up), scaled so that they
    add up to ``total``, the batch's ``count(1)`` (None: not scaled). The scale is 1 unless Spark merged bins (a batch
    of more input partitions than ``pipeline.LOAD_MAP_BINS_PER_BUCKET``: then the buckets are approximate)."""
    labels = [f"{a}-{b}" for a, b in key_group_buckets(start, end)]
    out: dict[str, float] = {}
    for point in observed or []:
        index, rows = int(round(float(point["x"]))), float(point["y"])
        if 0 <= index < len(labels) and rows > 0:
            out[labels[index]] = out.get(labels[index], 0.0) + rows
    counted = sum(out.values())
    if total is not None and counted > 0 and counted != total:
        out = {label: rows * total / counted for label, rows in out.items()}
    return out


class Metric(StrEnum):
    ROWS = "taskshard_shard_rows"  # counter: exported as ..._total
    ROWS_PER_SECOND = "taskshard_shard_rows_per_second"
    PROCESSED_ROWS_PER_SECOND = "taskshard_shard_processed_rows_per_second"
    LAG = "taskshard_shard_lag"
    PARTITION_LAG = "taskshard_shard_partition_lag"
    LAG_SECONDS = "taskshard_shard_lag_seconds"
    LAST_BATCH = "taskshard_shard_last_batch"
    LAST_BATCH_TIMESTAMP = "taskshard_shard_last_batch_timestamp_seconds"
    BATCH_DURATION = "taskshard_shard_batch_duration_seconds"
    BATCH_RUNNING = "taskshard_shard_batch_running_seconds"
    STATE_ROWS = "taskshard_shard_state_rows"
    STATE_BYTES = "taskshard_shard_state_bytes"
    DEAD_LETTERS = "taskshard_shard_dead_letters"  # counter
    WATERMARK = "taskshard_shard_watermark_seconds"
    LATE_RECORDS = "taskshard_shard_late_records"  # counter
    RESTARTS = "taskshard_shard_restarts"  # counter
    EMITTING = "taskshard_shard_emitting"
    WRITER_EPOCH = "taskshard_shard_writer_epoch"
    KEY_GROUP_ROWS = "taskshard_shard_key_group_rows"  # counter, label key_groups="<start>-<end>"
    KEY_GROUP_STATE_ROWS = "taskshard_shard_key_group_state_rows"  # gauge, label key_groups="<start>-<end>"
    STATE_MAP_BATCH = "taskshard_shard_state_map_batch"
    HEARTBEAT = "taskshard_shard_heartbeat_timestamp_seconds"


@dataclass(frozen=True)
class LiveStats:
    """What the operator mirrors into ``status.live`` (see :meth:`to_status`)."""

    batch_id: int
    batch_time: float | None
    """Unix time of the last commit (None: no batch yet)."""
    rate: float
    lag: int | None
    lag_unit: str | None
    state_rows: int | None
    dead_letters: int
    emitting: bool
    key_group_rows: Mapping[str, float] = field(default_factory=dict)
    """The load map: input rows per bucket label ``"<a>-<b>"`` since the runtime started (empty when it is off)."""
    key_group_state_rows: Mapping[str, float] = field(default_factory=dict)
    """The state map: state rows per bucket label ``"<a>-<b>"`` at :attr:`state_map_batch` (empty: none yet)."""
    state_map_batch: int | None = None
    """The committed batch the state map counts (None: no state map)."""
    lag_seconds: float | None = None
    """Seconds to work off the lag (``inf``: no progress; None: not known)."""
    batch_running: float = 0.0
    """How long the batch in flight has run without committing (0: none in flight)."""
    watermark: float | None = None
    """The event-time watermark (Unix time; None: no event time)."""
    late_records: int | None = None
    """Late records so far (None: no event time)."""
    heartbeat: float | None = None
    """Unix time the runtime's poll loop last ran (None: not yet, or a runtime that does not say)."""

    def to_status(self, *, observed_at: str) -> dict[str, Any]:
        """The ``status.live`` object; ``rate`` rounded to 0.1 rows/s so that noise does not cause writes."""
        out: dict[str, Any] = {
            "batchId": self.batch_id,
            "rate": round(self.rate, 1),
            "deadLetters": self.dead_letters,
            "emitting": self.emitting,
            "observedAt": observed_at,
        }
        if self.batch_time is not None:
            out["batchTime"] = rfc3339(self.batch_time)
        if self.lag is not None:
            out["lag"] = self.lag
            out["lagUnit"] = self.lag_unit
        if self.lag_seconds is not None:
            out["lagSeconds"] = lag_seconds_status(self.lag_seconds)
        if self.state_rows is not None:
            out["stateRows"] = self.state_rows
        if self.state_map_batch is not None:
            out["stateMapBatch"] = self.state_map_batch
        if self.watermark is not None:
            out["watermark"] = rfc3339(self.watermark)
        if self.late_records is not None:
            out["lateRecords"] = self.late_records
        return out


LAG_SECONDS_STALLED = 999_999
"""``status.live.lagSeconds`` of a shard with lag and no progress over the rate window (JSON has no infinity)."""


def lag_seconds_status(seconds: float) -> int:
    """``status.live.lagSeconds``: whole seconds (noise below a second causes no status write), at most
    :data:`LAG_SECONDS_STALLED`, which stands for no progress."""
    return int(round(min(seconds, LAG_SECONDS_STALLED)))


def live_stats(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> LiveStats | None:
    """The :class:`LiveStats` of a scrape, given its samples as ``(name, labels, value)`` (the parser is the
    caller's: ``prometheus_client.parser``); None when the scrape holds no shard metrics (not a shard runtime)."""
    values: dict[str, float] = {}
    key_group_rows: dict[str, float] = {}
    key_group_state_rows: dict[str, float] = {}
    lag_unit: str | None = None
    for name, labels, value in samples:
        if name == Metric.LAG:
            lag_unit = labels.get("unit")
        if name == f"{Metric.KEY_GROUP_ROWS}_total" and labels.get("key_groups"):
            key_group_rows[labels["key_groups"]] = float(value)
        if name == Metric.KEY_GROUP_STATE_ROWS and labels.get("key_groups"):
            key_group_state_rows[labels["key_groups"]] = float(value)
        labelled = (
            Metric.BATCH_DURATION,
            Metric.PARTITION_LAG,
            f"{Metric.KEY_GROUP_ROWS}_total",
            Metric.KEY_GROUP_STATE_ROWS,
        )
        if name in labelled or name.endswith("_created"):
            continue
        values[name] = value
    if Metric.LAST_BATCH not in values:
        return None
    timestamp = values.get(Metric.LAST_BATCH_TIMESTAMP)
    lag = values.get(Metric.LAG)
    lag_seconds = values.get(Metric.LAG_SECONDS)
    state_rows = values.get(Metric.STATE_ROWS)
    state_map_batch = values.get(Metric.STATE_MAP_BATCH)
    watermark = values.get(Metric.WATERMARK)
    late = values.get(f"{Metric.LATE_RECORDS}_total")
    return LiveStats(
        batch_id=int(values[Metric.LAST_BATCH]),
        batch_time=timestamp if timestamp else None,
        rate=float(values.get(Metric.ROWS_PER_SECOND, 0.0)),
        lag=int(lag) if lag is not None else None,
        lag_unit=lag_unit if lag is not None else None,
        lag_seconds=lag_seconds if lag_seconds is not None and lag_seconds == lag_seconds else None,
        state_rows=int(state_rows) if state_rows is not None else None,
        dead_letters=int(values.get(f"{Metric.DEAD_LETTERS}_total", 0.0)),
        emitting=bool(values.get(Metric.EMITTING, 0.0)),
        key_group_rows=key_group_rows,
        key_group_state_rows=key_group_state_rows if state_map_batch is not None else {},
        state_map_batch=int(state_map_batch) if state_map_batch is not None else None,
        batch_running=float(values.get(Metric.BATCH_RUNNING, 0.0)),
        watermark=watermark,
        late_records=int(late) if late is not None else None,
        heartbeat=values.get(Metric.HEARTBEAT) or None,
    )
