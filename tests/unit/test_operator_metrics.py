"""The operator's Prometheus metrics: what each observation records, the live gauges, the API call counter, and
the endpoint serving every advertised name."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from taskshard_operator import kube, metrics
from taskshard_operator.live import TaskFigures

pytestmark = pytest.mark.unit


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(f"taskshard_operator_{name}", labels) or 0.0


def test_split_phases_are_timed_and_a_whole_split_once_it_is_split():
    before = {p: sample("split_phase_seconds_count", phase=p) for p in metrics.SPLIT_PHASES}
    whole = sample("split_seconds_count")
    status = {"split": {"at": 8, "acceptedTime": "2026-11-22T00:00:00Z"}}
    for t, phase in enumerate(["Running", "SplitRequested", "Draining", "Drained", "ChildrenCreated", "Split"]):
        metrics.observe_phase("ns", "unit-0-16", phase, status, now=100.0 + 2 * t)
    after = {p: sample("split_phase_seconds_count", phase=p) for p in metrics.SPLIT_PHASES}
    walked = [p for p in metrics.SPLIT_PHASES if p != "AbortingSplit"]
    assert all(after[p] == before[p] + 1 for p in walked) and after["AbortingSplit"] == before["AbortingSplit"]
    assert sample("split_seconds_count") == whole + 1
    metrics.observe_phase("ns", "unit-0-16", "Split", status, now=200.0)  # terminal: nothing more is timed
    assert sample("split_phase_seconds_count", phase="ChildrenCreated") == after["ChildrenCreated"]


def test_split_events_count_by_outcome_and_other_events_do_not():
    outcomes = ("accepted", "rejected", "waiting", "completed", "aborted")
    before = {o: sample("splits_total", outcome=o) for o in outcomes}
    for reason in (
        "SplitAccepted",
        "SplitRejected",
        "SplitWaiting",
        "Split",
        "SplitAborted",
        "PodCreated",
        "PhaseSplit",
    ):
        metrics.observe_event(reason)
    assert {o: sample("splits_total", outcome=o) - before[o] for o in before} == dict.fromkeys(before, 1)


def test_passes_and_api_calls_are_counted_by_outcome():
    ok, error = (
        sample("passes_total", kind="shard", outcome="ok"),
        sample("passes_total", kind="shard", outcome="error"),
    )
    metrics.observe_pass("shard", 0.01, "ok")
    metrics.observe_pass("shard", 0.02, "error")
    assert sample("passes_total", kind="shard", outcome="ok") == ok + 1
    assert sample("passes_total", kind="shard", outcome="error") == error + 1

    def conflicting():
        raise kube.Conflict("changed")

    counted = kube._counted("unit_write", conflicting)
    with pytest.raises(kube.Conflict):
        counted()
    kube._counted("unit_write", lambda: None)()
    assert sample("api_requests_total", method="unit_write", outcome="conflict") == 1
    assert sample("api_requests_total", method="unit_write", outcome="ok") == 1
    assert all(hasattr(getattr(kube.Kube, name), "__wrapped__") for name in kube.API_VERBS), "every method counted"


def test_live_gauges_read_the_cache_and_the_queue_at_scrape_time():
    phases = ["Running", "Running", "Split", "Pending"]
    registry = CollectorRegistry()
    registry.register(metrics.LiveGauges(lambda: phases, lambda: 7))
    assert registry.get_sample_value("taskshard_operator_shards", {"phase": "Running"}) == 2
    assert registry.get_sample_value("taskshard_operator_queue_depth") == 7
    phases.append("Running")
    assert registry.get_sample_value("taskshard_operator_shards", {"phase": "Running"}) == 3


def test_a_tasks_figures_are_read_from_its_status_live_at_scrape_time():
    shown = {"rate": 1.0, "deadLetters": 9, "lateRecords": 7, "watermark": "2027-01-15T08:00:12Z"}
    tasks = [("ns", "t", TaskFigures.of_live(shown)), ("ns", "plain", TaskFigures.of_live({"rate": 1.0}))]
    registry = CollectorRegistry()
    registry.register(metrics.LiveGauges(lambda: [], lambda: 0, lambda: tasks))
    labels = {"task_namespace": "ns", "task": "t"}
    assert registry.get_sample_value("taskshard_operator_task_watermark_seconds", labels) == 1_800_000_012
    assert registry.get_sample_value("taskshard_operator_task_dead_letters_total", labels) == 9
    assert registry.get_sample_value("taskshard_operator_task_late_records_total", labels) == 7
    plain = {"task_namespace": "ns", "task": "plain"}
    assert registry.get_sample_value("taskshard_operator_task_watermark_seconds", plain) is None, "no event time"
    assert registry.get_sample_value("taskshard_operator_task_late_records_total", plain) is None
    assert TaskFigures.of_live(None) is None, "a Task without status.live has no figures"


def test_the_endpoint_serves_every_advertised_metric():
    from testinfra.common import free_port

    port = free_port()
    figures = TaskFigures.of_live({"rate": 1.0, "lateRecords": 1, "watermark": "2027-01-15T08:00:12Z"})
    metrics.serve(port, lambda: ["Running"], lambda: 0, addr="127.0.0.1", tasks=lambda: [("ns", "t", figures)])
    metrics.observe_pass("task", 0.01, "ok")
    metrics.observe_api("create_pod", "ok")
    metrics.observe_event("Split")
    metrics.observe_scrape("ok")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    names = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    for name in metrics.METRIC_NAMES:
        assert any(n == name or n.startswith(f"{name}_") for n in names), (name, sorted(names))
