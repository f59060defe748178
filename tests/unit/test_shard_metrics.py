"""The shard runtime's live metrics without Spark: :class:`spark_runtime.metrics.ShardMetrics` fed recorded
progress, the rate window on an injected clock, Kafka and journal lag, the endpoint, and the round trip through
Prometheus' text format into :func:`spark_runtime.live.live_stats`."""

from __future__ import annotations

import itertools
import socket
import urllib.request
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spark_runtime.config import ConfigError, parse_config
from spark_runtime.live import LAG_SECONDS_STALLED, METRICS_PATH, METRICS_PORT, LiveStats, Metric, live_stats
from spark_runtime.metrics import ShardMetrics, consumed, kafka_lag
from spark_runtime.problems import EnvironmentProblem

pytestmark = pytest.mark.unit

TASK, SHARD = "orders", "orders-0-64"


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def samples_of(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def scrape(metrics: ShardMetrics) -> list[tuple[str, dict[str, str], float]]:
    return samples_of(generate_latest(metrics.registry).decode())


def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) <= 1, f"{name} {labels}: {found}"
    return found[0] if found else None


def journal_progress(batch_id: int, rows: int, trigger_ms: int = 500, **extra: Any) -> dict[str, Any]:
    """A Spark progress as the runner decodes it (``StreamingQueryProgress.json``), trimmed to what matters."""
    return {
        "id": "5b0f",
        "runId": "c1d2",
        "name": "taskshard-orders-0-64-a1b2c3",
        "timestamp": "2026-01-01T00:00:00.000Z",
        "batchId": batch_id,
        "numInputRows": rows,
        "inputRowsPerSecond": 10.0,
        "processedRowsPerSecond": 250.5,
        "durationMs": {
            "addBatch": 300,
            "getBatch": 2,
            "latestOffset": 5,
            "queryPlanning": 20,
            "walCommit": 40,
            "commitOffsets": 30,
            "triggerExecution": trigger_ms,
        },
        "stateOperators": [
            {"operatorName": "stateStoreSave", "numRowsTotal": 40, "numRowsUpdated": 12, "memoryUsedBytes": 1000},
            {"operatorName": "dedupe", "numRowsTotal": 2, "numRowsUpdated": 0, "memoryUsedBytes": 24},
        ],
        "sources": [
            {
                "description": "org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream@1",
                "startOffset": {"p0.jsonl": 0, "p1.jsonl": 0},
                "endOffset": {"p0.jsonl": 4000, "p1.jsonl": 3000},
                "numInputRows": rows,
            }
        ],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        **extra,
    }


KAFKA_PROGRESS = {
    "batchId": 7,
    "numInputRows": 150,
    "processedRowsPerSecond": 300.0,
    "durationMs": {"addBatch": 400, "latestOffset": 12, "triggerExecution": 500},
    "stateOperators": [{"operatorName": "stateStoreSave", "numRowsTotal": 90, "memoryUsedBytes": 5000}],
    "sources": [
        {
            "description": "KafkaV2[Assign[orders-0, orders-1, orders-2]]",
            "startOffset": {"orders": {"0": 0, "1": 0, "2": 10}},
            "endOffset": {"orders": {"0": 100, "1": 40, "2": 20}},
            "latestOffset": {"orders": {"0": 130, "1": 40, "2": 25}},
            "numInputRows": 150,
            "metrics": {"avgOffsetsBehindLatest": "11.7", "maxOffsetsBehindLatest": "30"},
        }
    ],
}


# ---------------------------------------------------------------- batches


def test_a_new_shard_exports_no_batch_yet():
    metrics = ShardMetrics(TASK, SHARD, clock=Clock())
    samples = scrape(metrics)
    stats = live_stats(samples)
    assert stats == LiveStats(
        batch_id=-1,
        batch_time=None,
        rate=0.0,
        lag=None,
        lag_unit=None,
        state_rows=None,
        dead_letters=0,
        emitting=False,
    )
    assert value(samples, Metric.WRITER_EPOCH) == 0
    assert value(samples, f"{Metric.ROWS}_total") == 0
    assert value(samples, Metric.BATCH_DURATION) is None and value(samples, Metric.STATE_BYTES) is None


def test_a_batch_updates_rows_durations_state_and_the_last_batch():
    clock = Clock()
    metrics = ShardMetrics(TASK, SHARD, clock=clock)
    metrics.on_commit(-1)  # a fresh shard's first poll
    metrics.on_batch(journal_progress(0, 120))
    clock.now += 2
    metrics.on_batch(journal_progress(1, 30, trigger_ms=800))
    samples = scrape(metrics)
    assert value(samples, f"{Metric.ROWS}_total") == 150
    assert value(samples, Metric.PROCESSED_ROWS_PER_SECOND) == 250.5
    assert value(samples, Metric.BATCH_DURATION, part="triggerExecution") == 0.8
    assert value(samples, Metric.BATCH_DURATION, part="addBatch") == 0.3
    assert value(samples, Metric.STATE_ROWS) == 42 and value(samples, Metric.STATE_BYTES) == 1024
    assert value(samples, Metric.LAST_BATCH) == 1
    assert value(samples, Metric.LAST_BATCH_TIMESTAMP) == clock.now
    assert value(samples, Metric.LAG) is None, "the journal's lag comes from its files, not from the progress"
    # Every series carries task and shard.
    ours = [(n, lab) for n, lab, _ in samples if n.startswith("taskshard_shard_")]
    assert ours and all(lab["task"] == TASK and lab["shard"] == SHARD for _, lab in ours)


def test_duration_parts_of_an_earlier_batch_do_not_linger():
    metrics = ShardMetrics(TASK, SHARD, clock=Clock())
    metrics.on_batch(journal_progress(0, 10))
    metrics.on_batch({"batchId": 1, "numInputRows": 5, "durationMs": {"addBatch": 100, "triggerExecution": 200}})
    parts = {lab["part"] for n, lab, _ in scrape(metrics) if n == Metric.BATCH_DURATION}
    assert parts == {"addBatch", "triggerExecution"}


def test_commit_time_of_a_resumed_batch_is_the_logs_or_unknown():
    clock = Clock()
    metrics = ShardMetrics(TASK, SHARD, clock=clock)
    metrics.on_commit(41)  # resumed from the recovery log: committed by an earlier run, time unknown
    assert live_stats(scrape(metrics)).batch_time is None
    assert live_stats(scrape(metrics)).batch_id == 41
    metrics.on_commit(41)
    metrics.on_commit(40)  # never backwards (a commit log listed less often than progress arrives)
    assert live_stats(scrape(metrics)).batch_id == 41
    clock.now += 5
    metrics.on_commit(42)  # seen committed by this process (no progress event yet): now
    assert live_stats(scrape(metrics)).batch_time == clock.now

    other = ShardMetrics(TASK, SHARD, clock=clock)
    other.on_commit(9, committed_at=1_600_000_000.0)  # the commit log entry's time
    assert live_stats(scrape(other)).batch_time == 1_600_000_000.0


def test_dead_letters_restarts_emitting_and_writer_epoch():
    metrics = ShardMetrics(TASK, SHARD, clock=Clock())
    metrics.set_dead_letters(3)
    metrics.set_dead_letters(3)
    metrics.set_dead_letters(5)
    metrics.set_dead_letters(4)  # never down: a counter
    metrics.on_restart()
    metrics.set_emitting(True)
    metrics.set_writer_epoch(7)
    samples = scrape(metrics)
    assert value(samples, f"{Metric.DEAD_LETTERS}_total") == 5
    assert value(samples, f"{Metric.RESTARTS}_total") == 1
    assert value(samples, Metric.EMITTING) == 1 and value(samples, Metric.WRITER_EPOCH) == 7
    metrics.set_emitting(False)
    assert live_stats(scrape(metrics)).emitting is False


# ---------------------------------------------------------------- the rate


def test_rate_window_on_an_injected_clock():
    clock = Clock(1000.0)
    metrics = ShardMetrics(TASK, SHARD, clock=clock, window=60.0)
    assert metrics.rate() == 0.0
    metrics.on_batch(journal_progress(0, 100, trigger_ms=500))  # began at 999.5
    assert metrics.rate() == 100.0  # 0.5 s since the first batch began: over at least 1 s
    clock.now = 1009.5
    assert metrics.rate() == pytest.approx(100 / 10)
    clock.now = 1010.0
    metrics.on_batch(journal_progress(1, 200))
    clock.now = 1019.5
    assert metrics.rate() == pytest.approx(300 / 20)
    clock.now = 1059.5
    assert metrics.rate() == pytest.approx(300 / 60)  # the full window from here on
    clock.now = 1065.0
    assert metrics.rate() == pytest.approx(200 / 60)  # batch 0 (committed at 1000) left the window
    assert live_stats(scrape(metrics)).rate == pytest.approx(200 / 60), "computed at scrape time"
    clock.now = 1070.0
    assert metrics.refresh() == 0.0  # idle: decays to 0 without a new batch
    assert value(scrape(metrics), Metric.ROWS_PER_SECOND) == 0.0


# ---------------------------------------------------------------- lag


def test_kafka_lag_per_partition_from_latest_and_end_offsets():
    metrics = ShardMetrics(TASK, SHARD, clock=Clock())
    metrics.on_batch(KAFKA_PROGRESS)
    samples = scrape(metrics)
    stats = live_stats(samples)
    assert (stats.lag, stats.lag_unit, stats.state_rows) == (35, "records", 90)
    assert value(samples, Metric.LAG, unit="records") == 35
    assert {lab["partition"]: v for n, lab, v in samples if n == Metric.PARTITION_LAG} == {
        "orders/0": 30,
        "orders/1": 0,
        "orders/2": 5,
    }
    # A later batch that caught up.
    caught_up = {
        **KAFKA_PROGRESS,
        "batchId": 8,
        "sources": [{**KAFKA_PROGRESS["sources"][0], "endOffset": {"orders": {"0": 130, "1": 40, "2": 25}}}],
    }
    metrics.on_batch(caught_up)
    assert live_stats(scrape(metrics)).lag == 0


def test_kafka_lag_only_when_spark_reports_latest_offset():
    without = {**KAFKA_PROGRESS["sources"][0]}
    del without["latestOffset"]
    assert kafka_lag([without]) is None
    assert kafka_lag(journal_progress(0, 1)["sources"]) is None  # not Kafka
    as_text = {**KAFKA_PROGRESS["sources"][0], "latestOffset": '{"orders":{"0":101}}'}
    assert kafka_lag([as_text]) == {"orders/0": 1}
    # Our Kafka data source is a Python stream to Spark: known by its offsets' shape, not its description.
    python_stream = {
        **as_text,
        "description": "org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream@2",
    }
    assert kafka_lag([python_stream]) == {"orders/0": 1}


def test_lag_series_follow_the_latest_measure():
    metrics = ShardMetrics(TASK, SHARD, clock=Clock())
    metrics.set_lag("bytes", {"p0.jsonl": 10, "p1.jsonl": 5})
    metrics.set_lag("bytes", {"p1.jsonl": 0})
    samples = scrape(metrics)
    assert [(lab["partition"], v) for n, lab, v in samples if n == Metric.PARTITION_LAG] == [("p1.jsonl", 0)]
    metrics.set_lag("records", {"t/0": 3})
    samples = scrape(metrics)
    assert [(lab["unit"], v) for n, lab, v in samples if n == Metric.LAG] == [("records", 3)]


def test_journal_lag_counts_complete_lines_past_the_committed_position(tmp_path):
    pytest.importorskip("pyspark")  # the journal reader's line scan lives next to pyspark's reader API
    from spark_runtime.metrics import journal_lag

    (tmp_path / "p0.jsonl").write_bytes(b'{"key":"a"}\n{"key":"b"}\n{"key":"c"}\n{"key":')
    (tmp_path / "p1.jsonl").write_bytes(b'{"key":"d"}\n')
    lag = journal_lag(tmp_path, {"p0.jsonl": 12, "p1.jsonl": 12, "p2.jsonl": 0})
    assert lag == {"p0.jsonl": 24, "p1.jsonl": 0, "p2.jsonl": 0}  # the partial line waits; p2 does not exist


# ---------------------------------------------------------------- the endpoint and the contract


def test_live_stats_round_trip_through_the_endpoint():
    clock = Clock()
    metrics = ShardMetrics(TASK, SHARD, clock=clock)
    metrics.on_batch(KAFKA_PROGRESS)
    metrics.set_dead_letters(2)
    metrics.set_emitting(True)
    port = metrics.start_server("127.0.0.1", _free_port())
    try:
        assert port is not None and metrics.address == ("127.0.0.1", port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{METRICS_PATH}", timeout=10) as response:
            text = response.read().decode()
    finally:
        metrics.stop_server()
    stats = live_stats(samples_of(text))
    assert stats == LiveStats(
        batch_id=7,
        batch_time=clock.now,
        rate=150.0,
        lag=35,
        lag_unit="records",
        state_rows=90,
        dead_letters=2,
        emitting=True,
        lag_seconds=pytest.approx(35 / 150),  # 35 records behind, 150 offsets consumed in the first second
    )
    assert stats.to_status(observed_at="2026-01-01T00:00:00Z")["lag"] == 35
    # Stopped: the port is free again (for a server, which binds with SO_REUSEADDR as prometheus_client's does).
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_port_zero_serves_nothing_and_a_taken_port_is_an_environment_problem():
    metrics = ShardMetrics(TASK, SHARD)
    assert metrics.start_server("127.0.0.1", 0) is None and metrics.address is None
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(EnvironmentProblem) as info:
            metrics.start_server("127.0.0.1", port)
    assert (info.value.reason, info.value.field) == ("MetricsPortInUse", "metricsPort")
    assert f"127.0.0.1:{port}" in str(info.value)
    metrics.stop_server()  # nothing to stop


def test_metrics_port_in_the_shard_config():
    base = {
        "task": "orders",
        "shard": "orders-0-64",
        "maxKeyGroups": 128,
        "keyGroups": {"start": 0, "end": 64},
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": "/data/journal/orders", "partitions": 4}},
        "sink": {"directory": {"path": "/data/output/orders"}},
        "storage": {"path": "/data/state"},
    }
    assert parse_config(base).metrics_port == METRICS_PORT
    assert parse_config({**base, "metricsPort": 0}).metrics_port == 0
    assert parse_config({**base, "metricsPort": 9200}).to_json_dict()["metricsPort"] == 9200
    with pytest.raises(ConfigError, match="metricsPort"):
        parse_config({**base, "metricsPort": 70000})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_key_group_buckets_cover_the_range_in_at_most_64_contiguous_pieces():
    from spark_runtime.live import KEY_GROUP_BUCKETS, key_group_buckets

    for start, end in ((0, 128), (0, 16), (5, 6), (0, 32768), (100, 333)):
        buckets = key_group_buckets(start, end)
        assert buckets[0][0] == start and buckets[-1][1] == end
        assert all(a < b for a, b in buckets)
        assert all(b == c for (_, b), (c, _) in itertools.pairwise(buckets))
        assert len(buckets) == min(KEY_GROUP_BUCKETS, end - start)
    assert key_group_buckets(0, 16) == [(g, g + 1) for g in range(16)], "one bucket per key group when it fits"
    from spark_runtime.live import bucket_of

    for start, end in ((0, 128), (0, 10), (100, 333), (0, 32768)):
        buckets = key_group_buckets(start, end)
        for kg in range(start, end, max(1, (end - start) // 997)):
            a, b = buckets[bucket_of(kg, start, end)]
            assert a <= kg < b, (start, end, kg)


def test_a_batch_s_rows_per_key_group_bucket_become_counters():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from spark_runtime.live import KEY_GROUP_METRICS, Metric
    from spark_runtime.metrics import ShardMetrics

    m = ShardMetrics("t", "t-0-16", key_groups=(0, 16))
    first = {KEY_GROUP_METRICS: {"buckets": [{"x": 0.0, "y": 5.0}, {"x": 1.0, "y": 2.0}]}}
    m.on_batch({"batchId": 0, "numInputRows": 7, "observedMetrics": first})
    merged = [{"x": 0.0, "y": 1.0}, {"x": 0.0, "y": 2.0}]  # equal x after a merge of partial histograms
    m.on_batch({"batchId": 1, "numInputRows": 3, "observedMetrics": {KEY_GROUP_METRICS: {"buckets": merged}}})
    m.on_batch({"batchId": 2, "numInputRows": 0, "observedMetrics": {KEY_GROUP_METRICS: {"buckets": None}}})
    # A sample (1 of 3 rows seen, 2 in bucket 2 and 1 in bucket 3) is scaled to the batch's exact row count.
    sample = [{"x": 2.0, "y": 2.0}, {"x": 3.0, "y": 1.0}]
    scaled = {KEY_GROUP_METRICS: {"buckets": sample, "rows": 9}}
    m.on_batch({"batchId": 3, "numInputRows": 9, "observedMetrics": scaled})
    text = generate_latest(m.registry).decode()
    rows = {
        s.labels["key_groups"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == f"{Metric.KEY_GROUP_ROWS}_total"
    }
    assert rows == {"0-1": 8.0, "1-2": 2.0, "2-3": 6.0, "3-4": 3.0}


@pytest.mark.parametrize(
    ("key", "value", "complaint", "good"),
    [
        ("spark.taskshard.keyGroupMetrics", "maybe", "'maybe' is invalid: expected true or false", "true"),
        ("spark.taskshard.stateMapSeconds", "-5", "'-5' is invalid: expected a number of seconds >= 0", "30"),
    ],
)
def test_bad_load_map_settings_are_refused_naming_the_key(key, value, complaint, good):
    data = {
        "task": "t",
        "shard": "t-0-16",
        "maxKeyGroups": 16,
        "keyGroups": {"start": 0, "end": 16},
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": "/j", "partitions": 1}},
        "sink": {"directory": {"path": "/out"}},
        "storage": {"path": "/data"},
        "spark": {"conf": {key: value}},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert f"spark.conf.{key}" in str(err.value) and complaint in str(err.value)
    data["spark"]["conf"][key] = good
    parse_config(data)


# ---------------------------------------------------------------- lag in seconds


def test_consumed_counts_the_lags_partitions_in_its_unit():
    journal = journal_progress(3, 10)["sources"]
    assert consumed(journal, ["p0.jsonl", "p1.jsonl"]) == 7000
    assert consumed(journal, ["p0.jsonl"]) == 4000, "only the partitions the lag counts"
    kafka = [
        {
            "description": "KafkaV2[Subscribe[orders]]",
            "startOffset": '{"orders": {"0": 10, "1": 5}}',
            "endOffset": '{"orders": {"0": 40, "1": 5}}',
        }
    ]
    assert consumed(kafka, ["orders/0", "orders/1"]) == 30
    assert consumed([{"startOffset": None, "endOffset": {"p0.jsonl": 9}}], ["p0.jsonl"]) == 0, "no start: unknown"


def test_lag_seconds_is_the_lag_over_the_pace_of_consumption():
    clock = Clock(1000.0)
    metrics = ShardMetrics(TASK, SHARD, clock=clock, window=60.0)
    assert value(scrape(metrics), Metric.LAG_SECONDS) is None, "absent while the lag is unknown"
    metrics.set_lag("bytes", {"p0.jsonl": 0, "p1.jsonl": 0})
    assert metrics.lag_seconds() == 0.0
    metrics.set_lag("bytes", {"p0.jsonl": 14_000, "p1.jsonl": 0})
    assert metrics.lag_seconds() == float("inf"), "lag and no progress"
    metrics.on_batch(journal_progress(0, 100, trigger_ms=1000))  # advanced 7000 bytes, began at 999
    clock.now = 1009.0
    assert metrics.lag_seconds() == pytest.approx(14_000 / (7000 / 10))
    assert live_stats(scrape(metrics)).lag_seconds == pytest.approx(20.0)
    assert live_stats(scrape(metrics)).to_status(observed_at="t")["lagSeconds"] == 20
    clock.now = 1061.0  # the batch left the window: no progress since
    assert metrics.lag_seconds() == float("inf")
    stats = live_stats(scrape(metrics))
    assert stats.to_status(observed_at="t")["lagSeconds"] == LAG_SECONDS_STALLED
    metrics.set_lag("bytes", {"p0.jsonl": 0, "p1.jsonl": 0})
    assert metrics.lag_seconds() == 0.0, "caught up"


def test_a_hung_kafka_batch_ages_its_lag_out_and_shows_how_long_it_runs():
    """The lag Kafka's last committed batch reported (0: caught up) says nothing while the next batch hangs: once
    the batch in flight has run longer than the rate window, lag_seconds is +Inf (999999 in status.live), never 0,
    and taskshard_shard_batch_running_seconds says how long it has run."""
    clock = Clock(1000.0)
    metrics = ShardMetrics(TASK, SHARD, clock=clock, window=60.0)
    caught_up = {
        **KAFKA_PROGRESS,
        "sources": [{**KAFKA_PROGRESS["sources"][0], "endOffset": KAFKA_PROGRESS["sources"][0]["latestOffset"]}],
    }
    metrics.on_batch(caught_up)
    assert metrics.lag_seconds() == 0.0 and metrics.batch_running() == 0.0
    clock.now = 1001.0
    metrics.on_trigger(True)  # the next batch starts, and hangs
    clock.now = 1030.0
    assert metrics.batch_running() == pytest.approx(29.0)
    assert metrics.lag_seconds() == 0.0, "within the window the last measure stands"
    clock.now = 1062.0
    stats = live_stats(scrape(metrics))
    assert stats.batch_running == pytest.approx(61.0)
    assert stats.to_status(observed_at="t")["lagSeconds"] == LAG_SECONDS_STALLED
    # It commits at last: a new batch in flight counts from the commit, not from the first trigger seen.
    metrics.on_batch({**caught_up, "batchId": caught_up["batchId"] + 1})
    assert metrics.batch_running() == 0.0
    assert metrics.lag_seconds() == 0.0
    clock.now = 1070.0
    assert metrics.batch_running() == pytest.approx(8.0)
    metrics.on_trigger(False)
    assert metrics.batch_running() == 0.0


def test_an_idle_kafka_query_measures_lag_0_at_poll_time():
    """Spark fetched the brokers' latest offsets for its last trigger and found nothing past the committed ones: the
    lag is 0 on every partition, also for a shard that has not run a batch since it started (it used to have no lag
    at all, which holds the autoscaler forever). A trigger in flight says nothing."""
    metrics = ShardMetrics(TASK, SHARD, clock=Clock())
    metrics.on_trigger(True, idle_kafka=True)
    assert live_stats(scrape(metrics)).lag is None, "not measured while a trigger is in flight"
    metrics.on_trigger(False, idle_kafka=True)
    stats = live_stats(scrape(metrics))
    assert (stats.lag, stats.lag_unit, stats.lag_seconds) == (0, "records", 0.0)
    metrics.on_batch(KAFKA_PROGRESS)
    assert live_stats(scrape(metrics)).lag == 35
    metrics.on_trigger(False, idle_kafka=False)
    assert live_stats(scrape(metrics)).lag == 35, "a trigger that found data does not zero it"
    metrics.on_trigger(False, idle_kafka=True)
    samples = scrape(metrics)
    assert live_stats(samples).lag == 0
    assert {lab["partition"]: v for n, lab, v in samples if n == Metric.PARTITION_LAG} == dict.fromkeys(
        ("orders/0", "orders/1", "orders/2"), 0
    )
