"""The shard runtime's live Prometheus metrics: :class:`ShardMetrics` exports the series of
:class:`spark_runtime.live.Metric` (the contract, with the table of names) on ``http://<host>:<port>/metrics``.

Every series carries the labels ``task`` and ``shard``; ``taskshard_shard_lag`` adds ``unit`` (``bytes`` for the
journal, ``records`` for Kafka), ``taskshard_shard_partition_lag`` adds ``partition`` (a journal file name such as
``p0.jsonl``, or ``<topic>/<partition>`` for Kafka) and ``taskshard_shard_batch_duration_seconds`` adds ``part``
(Spark's ``durationMs`` keys; ``triggerExecution`` is the whole batch).

When values update (the runner, :class:`spark_runtime.shard.ShardRunner`, calls the update methods from its poll
loop, every ``poll_interval``, so values are at most one poll old):

- per committed batch of this process (:meth:`ShardMetrics.on_batch`, fed Spark's progress JSON once per batch):
  rows, processed rows per second, batch durations, state rows and bytes, the last batch and its commit time
  (when the poll saw it), and Kafka's lag (from the progress' ``latestOffset`` minus ``endOffset``, only when
  Spark reports ``latestOffset``);
- at every poll: the last committed batch (:meth:`ShardMetrics.on_commit`, also at each query start with the
  commit's time from the recovery log), dead letters, ``emitting``;
- at most every :data:`TRIGGER_POLL_SECONDS`: whether Spark's query has a trigger in flight
  (:meth:`ShardMetrics.on_trigger`, from ``query.status``), which ``taskshard_shard_batch_running_seconds`` turns
  into how long the batch in flight has run without committing (at scrape time: since the trigger was first seen
  active, or since the last commit when that came later);
- at most every :data:`JOURNAL_LAG_INTERVAL_SECONDS`: the journal's lag in bytes (:func:`journal_lag`: a ``stat``
  per partition file, and a read of its tail when it grew);
- per committed batch too, from the batch's observed metrics ``taskshard_key_groups`` (computed in the plan,
  :func:`spark_runtime.pipeline.build_output_frame`): input rows per bucket of key groups
  (``taskshard_shard_key_group_rows_total{key_groups="<start>-<end>"}``, at most
  :data:`spark_runtime.live.KEY_GROUP_BUCKETS` buckets): the load map a split point can be chosen from;
- at most every ``spark.taskshard.stateMapSeconds`` (:mod:`spark_runtime.state_map`, with the load map only): state
  rows per bucket of key groups at a committed batch (``taskshard_shard_key_group_state_rows``, the same buckets)
  and that batch (``taskshard_shard_state_map_batch``): the state map a ``by: state`` split point is chosen from;
- once per runtime start: the writer epoch; per in-process query restart: restarts;
- at scrape time: the rate, ``taskshard_shard_rows_per_second`` = input rows of the batches committed within the
  last :data:`~spark_runtime.live.RATE_WINDOW_SECONDS`, divided by that window, or, while this process has been
  processing for less, by the time since its first batch began (at least :data:`MIN_RATE_SECONDS`); 0 before
  the first batch. So an idle shard's rate decays to 0 within the window without any new batch;
- at scrape time too, once the lag is known: ``taskshard_shard_lag_seconds``, the time the shard needs to work off
  its lag at the pace it consumed its source over the rate window (:meth:`ShardMetrics.lag_seconds`): the lag
  divided by the source positions its committed batches advanced per second, in the lag's own unit (records or
  bytes, the partitions the lag counts: :func:`consumed`); 0 without lag, ``+Inf`` with lag but no progress in the
  window (a stalled shard, or one that has not committed a batch yet), and ``+Inf`` too while the batch in flight
  has run longer than the window: the lag a hung batch's source showed when it was planned (Kafka's comes from
  the last committed batch) says nothing of the input arriving since, so it ages out. The autoscaler's signal.

Series whose value is not known yet are absent rather than 0: the lag (no measure yet), state rows and bytes (no
batch with stateful operators yet in this process), the batch durations (no batch yet). ``last_batch`` is -1 and
``last_batch_timestamp_seconds`` 0 until a batch is known; ``writer_epoch`` is 0 until the runtime claims one.

Each :class:`ShardMetrics` owns its :class:`prometheus_client.CollectorRegistry` (never the global one: tests run
several runners in one process). :meth:`ShardMetrics.start_server` serves it (a daemon thread); port 0 serves
nothing.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from spark_runtime.live import (
    KEY_GROUP_METRICS,
    METRICS_PATH,
    RATE_WINDOW_SECONDS,
    Metric,
    bucket_of,
    bucket_rows,
    key_group_buckets,
)
from spark_runtime.problems import EnvironmentProblem

__all__ = [
    "JOURNAL_LAG_INTERVAL_SECONDS",
    "TRIGGER_POLL_SECONDS",
    "MIN_RATE_SECONDS",
    "ShardMetrics",
    "consumed",
    "journal_lag",
    "kafka_lag",
]

log = logging.getLogger("taskshard.metrics")

JOURNAL_LAG_INTERVAL_SECONDS = 1.0
"""How often the runner measures the journal's lag at most (its poll runs more often)."""
TRIGGER_POLL_SECONDS = 1.0
"""How often the runner asks Spark's query whether a trigger is in flight at most."""
MIN_RATE_SECONDS = 1.0
"""The smallest divisor of the rate: right after the first batch, its rows over at least this many seconds."""

_LABELS = ("task", "shard")


class ShardMetrics:
    """The live metrics of one shard runtime (see the module docstring). Thread-safe: the runner updates it,
    the server thread reads it. ``clock`` (Unix seconds) is injectable for tests."""

    def __init__(
        self,
        task: str,
        shard: str,
        *,
        key_groups: tuple[int, int] | None = None,
        clock: Callable[[], float] = time.time,
        window: float = RATE_WINDOW_SECONDS,
    ) -> None:
        self.task = task
        self.key_groups = key_groups
        """The shard's range ``(start, end)``: names the buckets of the per-key-group row counts."""
        self.shard = shard
        self.registry = CollectorRegistry()
        self._clock = clock
        self._window = float(window)
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()
        """(commit time, input rows) of the batches committed within the window."""
        self._consumed: deque[tuple[float, int]] = deque()
        """(commit time, source positions advanced in the lag's unit) of the batches committed within the window."""
        self._lag_total: int | None = None
        self._since: float | None = None
        """When this process's first batch began (its commit time minus its trigger execution time)."""
        self._last_batch = -1
        self._committed_at: float | None = None
        """When this process saw the last commit (Unix time; None: none yet)."""
        self._trigger_since: float | None = None
        """When the trigger in flight was first seen active (None: none in flight)."""
        self._known = False
        """Whether a committed batch id (or -1: none) was reported yet: the first report of a resumed shard's
        last batch is not a commit seen now."""
        self._dead_letters = 0
        self._lag_unit: str | None = None
        self._partitions: set[str] = set()
        self._parts: set[str] = set()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None
        """(host, port) the endpoint serves on (None: not serving)."""

        self._register_core_series()

    def _register_core_series(self) -> None:
        """Every series of the shard's own (its rows, rate, lag, batches, state, dead letters, restarts, emitting,
        writer epoch), the key-group maps and the event-time series."""
        own = (self.task, self.shard)

        def gauge(name: Metric, doc: str, *extra: str) -> Gauge:
            return Gauge(str(name), doc, [*_LABELS, *extra], registry=self.registry)

        def counter(name: Metric, doc: str) -> Counter:
            return Counter(str(name), doc, list(_LABELS), registry=self.registry)

        self._rows = counter(Metric.ROWS, "Input rows of the batches this process committed.").labels(*own)
        self._rate = gauge(
            Metric.ROWS_PER_SECOND,
            f"Input rows committed per second over the last {RATE_WINDOW_SECONDS:g} s (the RATE column).",
        ).labels(*own)
        self._rate.set_function(self.rate)
        self._processed = gauge(
            Metric.PROCESSED_ROWS_PER_SECOND, "Spark's processedRowsPerSecond of the last batch."
        ).labels(*own)
        self._processed.set(0)
        self._lag = gauge(Metric.LAG, "Input not yet processed (records for Kafka, bytes for the journal).", "unit")
        self._partition_lag = gauge(Metric.PARTITION_LAG, "Input not yet processed per source partition.", "partition")
        self._lag_seconds = gauge(
            Metric.LAG_SECONDS,
            "Seconds to work off the lag at the pace the source was consumed over the rate window (+Inf: no progress).",
        )  # labelled once the lag is known
        self._register_batch_series(gauge, own)
        self._state_rows = gauge(Metric.STATE_ROWS, "State rows of all stateful operators.")  # labelled once known
        self._state_bytes = gauge(Metric.STATE_BYTES, "State memory used in bytes.")
        self._dead = counter(Metric.DEAD_LETTERS, "Dead letters of this shard.").labels(*own)
        self._restarts = counter(Metric.RESTARTS, "In-process restarts of the streaming query.").labels(*own)
        self._emitting = gauge(Metric.EMITTING, "1 while the shard writes to its sink.").labels(*own)
        self._emitting.set(0)
        self._epoch = gauge(Metric.WRITER_EPOCH, "This runtime's writer epoch (0: none claimed yet).").labels(*own)
        self._epoch.set(0)
        self._heartbeat = gauge(Metric.HEARTBEAT, "When the runtime's poll loop last ran (Unix time; 0: not yet).")
        self._heartbeat.labels(*own).set(0)
        self._register_key_group_maps()
        self._register_time_series(gauge, counter)

    def _register_time_series(self, gauge: Callable[..., Gauge], counter: Callable[..., Counter]) -> None:
        """The event-time series (labelled once the shard reports them: only with event time)."""
        self._late_records = 0
        self._watermark = gauge(Metric.WATERMARK, "The event-time watermark the next batch runs with (Unix time).")
        self._late = counter(Metric.LATE_RECORDS, "Records later than the watermark allows (dead letters, late).")

    def set_event_time(self, watermark_ms: int, late_total: int) -> None:
        """The shard's watermark and its late-record total (the counter follows it up); only with event time."""
        with self._lock:
            self._watermark.labels(self.task, self.shard).set(watermark_ms / 1000.0)
            self._late.labels(self.task, self.shard).inc(max(0, late_total - self._late_records))
            self._late_records = max(self._late_records, late_total)

    def _register_batch_series(self, gauge: Callable[..., Gauge], own: tuple[str, str]) -> None:
        """The series of the batches themselves: the last committed one and its time, the one in flight, durations."""
        self._last = gauge(Metric.LAST_BATCH, "The last committed batch id (-1: none yet).").labels(*own)
        self._last.set(-1)
        self._last_time = gauge(
            Metric.LAST_BATCH_TIMESTAMP, "When the last batch was committed (Unix time; 0: unknown)."
        ).labels(*own)
        self._last_time.set(0)
        self._running = gauge(
            Metric.BATCH_RUNNING, "How long the batch in flight has run without committing (0: none in flight)."
        ).labels(*own)
        self._running.set_function(self.batch_running)
        self._duration = gauge(
            Metric.BATCH_DURATION, "The last batch's durations by part (Spark's durationMs keys).", "part"
        )

    def _register_key_group_maps(self) -> None:
        """The series per bucket of key groups: the load map (a counter) and the state map (gauges)."""
        labels = [*_LABELS, "key_groups"]
        self._key_group_rows = Counter(
            str(Metric.KEY_GROUP_ROWS),
            "Input rows per bucket of key groups (label key_groups = start-end).",
            labels,
            registry=self.registry,
        )
        self._key_group_state_rows = Gauge(
            str(Metric.KEY_GROUP_STATE_ROWS),
            "State rows per bucket of key groups (label key_groups = start-end) at the state map's batch.",
            labels,
            registry=self.registry,
        )
        self._state_map_batch = Gauge(
            str(Metric.STATE_MAP_BATCH),
            "The committed batch the state map counts.",
            list(_LABELS),
            registry=self.registry,
        )

    # ---------------------------------------------------------------- updates

    def set_state_map(self, batch_id: int, rows_per_key_group: Mapping[int, int]) -> None:
        """The state map of committed ``batch_id``: state rows per key group, exported per bucket of the shard's
        range (every bucket, 0 for those without state), replacing the previous map."""
        if self.key_groups is None:
            return
        start, end = self.key_groups
        buckets = key_group_buckets(start, end)
        rows = [0] * len(buckets)
        for kg, n in rows_per_key_group.items():
            if start <= kg < end:
                rows[bucket_of(kg, start, end)] += int(n)
        with self._lock:
            for (a, b), n in zip(buckets, rows, strict=True):
                self._key_group_state_rows.labels(self.task, self.shard, f"{a}-{b}").set(n)
            self._state_map_batch.labels(self.task, self.shard).set(batch_id)

    def on_batch(self, progress: Mapping[str, Any]) -> None:
        """A new committed batch of this process, given its Spark progress (``StreamingQueryProgress.json``
        decoded); its commit time is now."""
        now = self._clock()
        rows = int(progress.get("numInputRows") or 0)
        durations = progress.get("durationMs") or {}
        with self._lock:
            if self._since is None:
                self._since = now - float(durations.get("triggerExecution") or 0) / 1000.0
            self._recent.append((now, rows))
            self._prune(now)
        self._rows.inc(rows)
        self._processed.set(float(progress.get("processedRowsPerSecond") or 0.0))
        with self._lock:
            for part in self._parts - set(durations):
                self._duration.remove(self.task, self.shard, part)
            for part, ms in durations.items():
                self._duration.labels(self.task, self.shard, part).set(float(ms) / 1000.0)
            self._parts = set(durations)
        operators = progress.get("stateOperators") or []
        if operators:
            state_rows = sum(int(op.get("numRowsTotal") or 0) for op in operators)
            state_bytes = sum(int(op.get("memoryUsedBytes") or 0) for op in operators)
            self._state_rows.labels(self.task, self.shard).set(state_rows)
            self._state_bytes.labels(self.task, self.shard).set(state_bytes)
        bid = progress.get("batchId")
        if bid is not None:
            self.on_commit(int(bid), committed_at=now)
        observed = (progress.get("observedMetrics") or {}).get(KEY_GROUP_METRICS) or {}
        if self.key_groups is not None and observed.get("buckets"):
            total = observed.get("rows")
            scaled = bucket_rows(observed["buckets"], *self.key_groups, total=int(total) if total else None)
            for label, rows_in in scaled.items():
                self._key_group_rows.labels(self.task, self.shard, label).inc(rows_in)
        lag = kafka_lag(progress.get("sources") or [])
        if lag is not None:
            self.set_lag("records", lag)
        with self._lock:
            if self._partitions:
                self._consumed.append((now, consumed(progress.get("sources") or [], self._partitions)))

    def on_commit(self, batch_id: int, committed_at: float | None = None) -> None:
        """The last committed batch (from the recovery log): ``committed_at`` (Unix time) when known, else now,
        except for the first report (a resumed shard's last batch, committed by an earlier run: time unknown)."""
        with self._lock:
            known, self._known = self._known, True
            if batch_id <= self._last_batch:
                return
            if committed_at is None and known:
                committed_at = self._clock()
            self._last_batch = batch_id
            self._last.set(batch_id)
            if committed_at is not None:
                self._last_time.set(committed_at)
            if known:
                self._committed_at = self._clock()

    def beat(self, at: float) -> None:
        """The runtime's poll loop ran at ``at`` (Unix time)."""
        self._heartbeat.labels(self.task, self.shard).set(at)

    def on_trigger(self, active: bool, *, idle_kafka: bool = False) -> None:
        """Whether Spark's query has a trigger in flight now (``query.status['isTriggerActive']``). ``idle_kafka``:
        a Kafka query's last trigger found no record past the committed offsets (Spark fetched the latest offsets
        from the brokers for it: ``isDataAvailable`` false, "Waiting for data to arrive"), so its lag is 0 now on
        every partition it reads, measured at poll time even when no batch has run since the runtime started."""
        with self._lock:
            if not active:
                self._trigger_since = None
            elif self._trigger_since is None:
                self._trigger_since = self._clock()
            partitions = set(self._partitions)
        if idle_kafka and not active:
            self.set_lag("records", dict.fromkeys(partitions, 0))

    def batch_running(self) -> float:
        """Seconds the batch in flight has run without committing: since its trigger was first seen active, or
        since the last commit this process saw when that came later (0: no trigger in flight)."""
        now = self._clock()
        with self._lock:
            if self._trigger_since is None:
                return 0.0
            began = max(self._trigger_since, self._committed_at or 0.0)
            return max(0.0, now - began)

    def set_lag(self, unit: str, per_partition: Mapping[str, int]) -> None:
        """The lag per source partition (negative values count as 0); the total is their sum."""
        lags = {str(p): max(0, int(v)) for p, v in per_partition.items()}
        with self._lock:
            if self._lag_unit is not None and self._lag_unit != unit:
                self._lag.remove(self.task, self.shard, self._lag_unit)
            self._lag.labels(self.task, self.shard, unit).set(sum(lags.values()))
            self._lag_unit = unit
            for gone in self._partitions - set(lags):
                self._partition_lag.remove(self.task, self.shard, gone)
            for partition, value in lags.items():
                self._partition_lag.labels(self.task, self.shard, partition).set(value)
            self._partitions = set(lags)
            first, self._lag_total = self._lag_total is None, sum(lags.values())
        if first:
            self._lag_seconds.labels(self.task, self.shard).set_function(self.lag_seconds)

    def set_dead_letters(self, total: int) -> None:
        """The shard's dead-letter total (the counter follows it up; it never goes down)."""
        with self._lock:
            if total > self._dead_letters:
                self._dead.inc(total - self._dead_letters)
                self._dead_letters = total

    def set_emitting(self, emitting: bool) -> None:
        self._emitting.set(1 if emitting else 0)

    def set_writer_epoch(self, epoch: int | None) -> None:
        if epoch is not None:
            self._epoch.set(epoch)

    def on_restart(self) -> None:
        """The streaming query was restarted in-process (from its recovery log)."""
        self._restarts.inc()

    def refresh(self) -> float:
        """Forget batches older than the rate window (called every poll; keeps memory bounded when nobody
        scrapes) and return the rate. The exported rate is computed at each scrape anyway."""
        return self.rate()

    def rate(self) -> float:
        """Input rows per second over the window (see the module docstring)."""
        now = self._clock()
        with self._lock:
            self._prune(now)
            if self._since is None:
                return 0.0
            rows = sum(r for _, r in self._recent)
            return rows / min(self._window, max(now - self._since, MIN_RATE_SECONDS))

    def lag_seconds(self) -> float:
        """Seconds to work off the lag at the pace the source was consumed over the window (see the module
        docstring): 0 without lag (or none known), ``inf`` with lag and no progress in the window, and ``inf`` while
        the batch in flight has run longer than the window (its lag is too old to tell)."""
        if self.batch_running() > self._window:
            return float("inf")
        now = self._clock()
        with self._lock:
            self._prune(now)
            lag = self._lag_total or 0
            if lag <= 0:
                return 0.0
            advanced = sum(n for _, n in self._consumed)
            if self._since is None or advanced <= 0:
                return float("inf")
            return lag / (advanced / min(self._window, max(now - self._since, MIN_RATE_SECONDS)))

    def _prune(self, now: float) -> None:
        while self._recent and self._recent[0][0] <= now - self._window:
            self._recent.popleft()
        while self._consumed and self._consumed[0][0] <= now - self._window:
            self._consumed.popleft()

    # ---------------------------------------------------------------- the endpoint

    def start_server(self, host: str, port: int) -> int | None:
        """Serve the metrics on ``http://<host>:<port>/metrics`` (a daemon thread) and return the bound port;
        port 0 serves nothing (None). Raises :class:`EnvironmentProblem` ``MetricsPortInUse`` (field
        ``metricsPort``) when the address cannot be bound."""
        if port == 0:
            return None
        if self._server is not None:
            return self.address[1] if self.address else None
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise EnvironmentProblem(
                "MetricsPortInUse",
                "metricsPort",
                f"metricsPort: cannot serve the shard's metrics on {where}: {exc.strerror or exc}; another process "
                "may hold the port (set metricsPort to a free port, or 0 to disable the metrics endpoint)",
            ) from exc
        self._server, self._thread = server, thread
        self.address = (host, int(server.server_port))
        log.info("shard %s: metrics on http://%s%s", self.shard, where, METRICS_PATH)
        return self.address[1]

    def stop_server(self) -> None:
        """Stop serving (idempotent); the port is free again when this returns."""
        server, thread = self._server, self._thread
        self._server, self._thread, self.address = None, None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)


def kafka_lag(sources: Iterable[Mapping[str, Any]]) -> dict[str, int] | None:
    """Kafka's lag in records per ``<topic>/<partition>`` from a batch progress' ``sources``: the latest offset
    Spark saw when it planned the batch minus the batch's end offset, summed over the Kafka sources (those whose
    offsets are ``{topic: {partition: offset}}``: our Kafka data source, whose description is Spark's generic
    Python stream's, or Spark's). None when no Kafka source reports ``latestOffset``."""
    out: dict[str, int] = {}
    found = False
    for source in sources:
        latest, end = _topic_offsets(source.get("latestOffset")), _topic_offsets(source.get("endOffset"))
        if latest is None or end is None:
            continue
        found = True
        for topic, partitions in latest.items():
            for partition, offset in partitions.items():
                done = end.get(topic, {}).get(partition)
                if done is None:
                    continue
                name = f"{topic}/{partition}"
                out[name] = out.get(name, 0) + max(0, offset - done)
    return out if found else None


def consumed(sources: Iterable[Mapping[str, Any]], partitions: Iterable[str]) -> int:
    """How far a batch advanced its sources' positions over ``partitions``, the names the lag counts (journal:
    ``p0.jsonl``, bytes; Kafka: ``<topic>/<partition>``, records): the sum of ``endOffset - startOffset`` over the
    numeric leaves of both offsets (a nested key path joined with ``/``), those of other sources or partitions
    left out (a source without a start offset, the first batch of a query, counts from 0: its positions were
    not known)."""
    names = set(partitions)
    total = 0
    for source in sources:
        end = _leaves(source.get("endOffset"))
        start = _leaves(source.get("startOffset"))
        for name, position in end.items():
            if name in names and name in start:
                total += max(0, position - start[name])
    return total


def _leaves(value: Any, prefix: str = "") -> dict[str, int]:
    """The integer leaves of a JSON offset (object or text), keyed by their path joined with ``/``."""
    if isinstance(value, str) and not prefix:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    if not isinstance(value, dict):
        return {}
    out: dict[str, int] = {}
    for key, item in value.items():
        path = f"{prefix}{key}"
        if isinstance(item, dict):
            out.update(_leaves(item, f"{path}/"))
        elif isinstance(item, int) and not isinstance(item, bool):
            out[path] = item
    return out


def _topic_offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """Spark's Kafka offsets ``{"<topic>": {"<partition>": <offset>}}`` (a JSON object or its text), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, dict):
        return None
    out: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            return None
        try:
            out[str(topic)] = {str(p): int(o) for p, o in partitions.items()}
        except (TypeError, ValueError):
            return None
    return out


def journal_lag(directory: str | os.PathLike[str], positions: Mapping[str, int]) -> dict[str, int]:
    """The journal's lag in bytes per partition file (the keys of ``positions``, e.g. ``p0.jsonl``): the end of
    the file's last complete line minus the committed position (0 for a missing file). A ``stat`` per file,
    plus a read of the tail of a file that grew."""
    from spark_runtime.sources.journal import complete_end

    out: dict[str, int] = {}
    for name, position in positions.items():
        path = os.path.join(directory, name)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = 0
        if size <= position:
            out[name] = 0
            continue
        with open(path, "rb") as fh:
            out[name] = complete_end(fh, int(position), size) - int(position)
    return out
