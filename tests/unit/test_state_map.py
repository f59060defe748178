"""The runtime's state map (:mod:`spark_runtime.state_map`): when a count starts, what it publishes, how a
failure is survived; its export per bucket (:meth:`spark_runtime.metrics.ShardMetrics.set_state_map`) and the
conf key's validation."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spark_runtime.live import live_stats, state_map_seconds
from spark_runtime.metrics import ShardMetrics
from spark_runtime.state_map import StateMapper

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def mapper(interval=60.0, count=None):
    clock = Clock()
    published: list[tuple[int, dict[int, int]]] = []
    counted: list[int] = []

    def default_count(batch: int) -> dict[int, int]:
        counted.append(batch)
        return {1: batch, 3: 2}

    m = StateMapper(interval, count or default_count, lambda b, rows: published.append((b, rows)), clock=clock)
    return m, clock, published, counted


def test_a_count_starts_once_per_new_batch_and_interval():
    m, clock, published, counted = mapper()
    assert not m.tick(-1), "nothing committed yet"
    assert m.tick(4)
    m.wait(5)
    assert published == [(4, {1: 4, 3: 2})] and m.counted_batch == 4
    clock.now = 600
    assert not m.tick(4), "batch 4 is counted already"
    clock.now = 10
    m._started_at = 0.0
    assert not m.tick(5), "the interval has not passed"
    clock.now = 60
    assert not m.tick(5, allowed=False), "not while catching up, handing over or draining"
    assert m.tick(5)
    m.wait(5)
    assert counted == [4, 5] and m.counted_batch == 5


def test_an_interval_of_zero_never_counts():
    m, _, published, _ = mapper(interval=0)
    assert not m.enabled and not m.tick(3) and published == []


def test_one_count_at_a_time():
    release = threading.Event()

    def slow(batch: int) -> dict[int, int]:
        release.wait(5)
        return {0: 1}

    m, clock, published, _ = mapper(interval=1, count=slow)
    assert m.tick(1)
    clock.now = 100
    assert not m.tick(2), "the first count still runs"
    release.set()
    m.wait(5)
    assert published == [(1, {0: 1})]


def test_a_failed_count_publishes_nothing_and_is_retried_after_the_interval():
    calls: list[int] = []

    def failing(batch: int) -> dict[int, int]:
        calls.append(batch)
        raise RuntimeError("state store busy")

    m, clock, published, _ = mapper(interval=30, count=failing)
    assert m.tick(2)
    m.wait(5)
    assert published == [] and m.failures == 1 and m.counted_batch is None
    clock.now = 29
    assert not m.tick(2)
    clock.now = 30
    assert m.tick(2)
    m.wait(5)
    assert calls == [2, 2]


def scrape(metrics: ShardMetrics):
    text = generate_latest(metrics.registry).decode()
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    return live_stats(samples)


def test_the_metrics_export_the_state_map_per_bucket_and_replace_it():
    metrics = ShardMetrics("t", "t-0-128", key_groups=(0, 128))
    assert scrape(metrics).state_map_batch is None and scrape(metrics).key_group_state_rows == {}
    metrics.set_state_map(7, {0: 5, 1: 5, 127: 3, 200: 99})  # key group 200 is not the shard's: ignored
    stats = scrape(metrics)
    assert stats.state_map_batch == 7 and len(stats.key_group_state_rows) == 64, "64 buckets of two key groups"
    assert stats.key_group_state_rows["0-2"] == 10 and stats.key_group_state_rows["126-128"] == 3
    assert sum(stats.key_group_state_rows.values()) == 13
    metrics.set_state_map(9, {64: 1})
    stats = scrape(metrics)
    assert stats.state_map_batch == 9 and stats.key_group_state_rows["0-2"] == 0
    assert {k: v for k, v in stats.key_group_state_rows.items() if v} == {"64-66": 1.0}


def test_the_state_map_interval_is_validated_naming_the_key():
    on = {"spark.taskshard.keyGroupMetrics": "true"}
    assert state_map_seconds({}) == 0, "no load map: no state map"
    assert state_map_seconds(on) == 60
    assert state_map_seconds({**on, "spark.taskshard.stateMapSeconds": "2.5"}) == 2.5
    assert state_map_seconds({**on, "spark.taskshard.stateMapSeconds": "0"}) == 0
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match=f"spark.conf.spark.taskshard.stateMapSeconds: '{bad}' is invalid"):
            state_map_seconds({"spark.taskshard.stateMapSeconds": bad})
