"""The live metrics of a running journal shard (:mod:`spark_runtime.metrics`): scraped over HTTP from the endpoint
``run()`` serves, read back as the operator does (:func:`spark_runtime.live.live_stats`); the journal's lag in
bytes once caught up and after new input that the stopped query has not read."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spark_runtime import progress as progress_module
from spark_runtime.live import METRICS_HOST_ENV, METRICS_PATH, LiveStats, Metric, live_stats
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.produce import generate_events
from spark_runtime.shard import ShardRunner

pytestmark = pytest.mark.spark

Samples = list[tuple[str, dict[str, str], float]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text: str) -> tuple[Samples, LiveStats | None]:
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    return samples, live_stats(samples)


def scrape(port: int) -> tuple[Samples, LiveStats | None]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{METRICS_PATH}", timeout=10) as response:
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]
    return found[0] if found else None


def wait_scrape(port: int, ready: Callable[[Samples, LiveStats], bool], timeout: float = 120.0) -> tuple:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            samples, stats = scrape(port)
        except (urllib.error.URLError, ConnectionError) as exc:  # run() has not bound the port yet
            last = exc
        else:
            last = stats
            if stats is not None and ready(samples, stats):
                return samples, stats
        time.sleep(0.3)
    raise AssertionError(f"the scrape never showed the expected state within {timeout}s: {last}")


def test_a_running_journal_shard_serves_its_live_metrics(make_task, shard_spark, monkeypatch):
    monkeypatch.setattr(progress_module, "JOURNAL_LAG_INTERVAL_SECONDS", 0.0)  # measured at every poll
    monkeypatch.setenv(METRICS_HOST_ENV, "127.0.0.1")
    # The load map, and the state map counted at most every second.
    conf = {"spark.taskshard.keyGroupMetrics": "true", "spark.taskshard.stateMapSeconds": "1"}
    env = make_task(trigger="200 milliseconds", conf=conf)
    events = list(generate_events(300, 30, seed=23))
    env.produce(events)
    port = free_port()
    runner = ShardRunner(env.config(0, 16, metricsPort=port), shard_spark)
    shard = runner.config.shard
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["summary"] = runner.run(poll_interval=0.2)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        ends = env.journal_ends()

        def caught_up(samples: Samples, stats: LiveStats) -> bool:
            prog = env.progress(shard) or {}
            return (
                prog.get("positions") == ends
                and value(samples, f"{Metric.ROWS}_total") == len(events)
                and stats.batch_id == runner.last_committed
                and stats.lag == 0
                and stats.state_map_batch == runner.last_committed
            )

        samples, stats = wait_scrape(port, caught_up)
    finally:
        runner.request_drain("test", final=False)  # a resumable stop, as on SIGTERM
        thread.join(timeout=120)
    assert not thread.is_alive(), "the shard did not stop"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["summary"]["event"] == "stopped"

    # Caught up: everything read, the last batch is the runner's, nothing behind.
    assert value(samples, f"{Metric.ROWS}_total") == 300
    assert stats.batch_id == runner.last_committed >= 0
    assert stats.batch_time is not None and abs(time.time() - stats.batch_time) < 300
    assert (stats.lag, stats.lag_unit) == (0, "bytes")
    assert {lab["partition"]: v for n, lab, v in samples if n == Metric.PARTITION_LAG} == {
        "p0.jsonl": 0,
        "p1.jsonl": 0,
    }
    assert stats.rate > 0
    assert stats.emitting is True
    assert stats.state_rows is not None and stats.state_rows > 0
    assert value(samples, Metric.WRITER_EPOCH) == runner.fence.epoch == 1
    assert (value(samples, Metric.BATCH_DURATION, part="triggerExecution") or 0) > 0
    # The load map: input rows per key group (one bucket per key group for a 16-group range), summing to the rows,
    # each bucket holding exactly the events whose key hashes into it.
    from spark_runtime.keygroups import key_group

    per_group = {lab["key_groups"]: v for n, lab, v in samples if n == f"{Metric.KEY_GROUP_ROWS}_total"}
    assert sum(per_group.values()) == 300 and set(per_group) <= {f"{g}-{g + 1}" for g in range(16)}
    reference: dict[str, int] = {}
    for e in events:
        g = key_group(e["key"], 16)
        reference[f"{g}-{g + 1}"] = reference.get(f"{g}-{g + 1}", 0) + 1
    assert per_group == reference
    # The state map: state rows (here one per distinct key) per key group at the last committed batch.
    keys: dict[str, set[str]] = {}
    for e in events:
        g = key_group(e["key"], 16)
        keys.setdefault(f"{g}-{g + 1}", set()).add(str(e["key"]))
    state_map = {label: rows for label, rows in stats.key_group_state_rows.items() if rows}
    assert state_map == {label: float(len(k)) for label, k in keys.items()}
    assert len(stats.key_group_state_rows) == 16, "every bucket, 0 for those without state"
    ours = [lab for n, lab, _ in samples if n.startswith("taskshard_shard_")]
    assert ours and all(lab.get("task") == "orders" and lab.get("shard") == shard for lab in ours)

    # run() returned: the endpoint is gone.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(port)

    # New input while the query is stopped: the next poll measures exactly the bytes it has not read.
    env.produce(list(generate_events(40, 30, seed=24, start=300)))
    behind = {name: end - ends[name] for name, end in env.journal_ends().items()}
    assert all(b > 0 for b in behind.values())
    runner.poll()
    samples, stats = parse(generate_latest(runner.metrics.registry).decode())
    assert (stats.lag, stats.lag_unit) == (sum(behind.values()), "bytes")
    assert {lab["partition"]: v for n, lab, v in samples if n == Metric.PARTITION_LAG} == behind
    assert stats.emitting is False
    assert stats.batch_id == runner.last_committed


def test_run_refuses_a_metrics_port_in_use_before_starting(make_task):
    env = make_task()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        runner = ShardRunner(env.config(0, 16, metricsPort=port))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(METRICS_HOST_ENV, "127.0.0.1")
            with pytest.raises(EnvironmentProblem) as info:
                runner.run()
    assert (info.value.reason, info.value.field) == ("MetricsPortInUse", "metricsPort")
    assert f"127.0.0.1:{port}" in str(info.value)
    assert runner.query is None and runner.fence.epoch is None, "nothing started"


def test_the_load_map_is_off_unless_asked_for(make_task, shard_spark):
    """Without ``spark.taskshard.keyGroupMetrics: "true"`` the plan has no observe() and no load map series."""
    env = make_task()
    env.produce(list(generate_events(100, 20, seed=29)))
    runner = ShardRunner(env.config(0, 16), shard_spark, available_now=True)
    runner.start()
    runner.query.awaitTermination(240)
    runner.poll()
    samples, _ = parse(generate_latest(runner.metrics.registry).decode())
    progress = [p for p in runner.query.recentProgress if p.numInputRows]
    runner.stop()
    assert progress and not any(p.observedMetrics.get("taskshard_key_groups") for p in progress)
    assert not [n for n, _, _ in samples if n == f"{Metric.KEY_GROUP_ROWS}_total"]
    assert sum(p.numInputRows for p in progress) == 100


def test_a_one_key_group_shard_counts_its_load_map(make_task, shard_spark):
    """A split can leave a shard of one key group (a split by load next to a hot key group): its load map has one
    bucket, and the plan still runs (Spark refuses a histogram of fewer than two bins)."""
    from spark_runtime.keygroups import key_group

    from .conftest import wait_caught_up

    env = make_task(trigger="200 milliseconds", conf={"spark.taskshard.keyGroupMetrics": "true"})
    events = list(generate_events(300, 30, seed=29))
    env.produce(events)
    runner = ShardRunner(env.config(3, 4), shard_spark)
    try:
        runner.start()
        wait_caught_up(env, [runner])
        mine = sum(1 for e in events if key_group(e["key"], 16) == 3)

        # The progress event of the last batch follows its commit (which wait_caught_up saw): poll until the
        # runner took it, then compare.
        def load_map() -> dict[str, float]:
            runner.poll()
            samples, _ = parse(generate_latest(runner.metrics.registry).decode())
            return {lab["key_groups"]: v for n, lab, v in samples if n == f"{Metric.KEY_GROUP_ROWS}_total"}

        deadline = time.monotonic() + 60
        while sum(load_map().values()) < mine and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        runner.stop()
    assert mine > 0
    assert load_map() == {"3-4": mine}
