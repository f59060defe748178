"""The operator's Prometheus metrics (``prometheus_client``), served by ``--metrics-port`` at ``/metrics``.

Every name is ``taskshard_operator_*``:

- ``passes_total{kind, outcome}`` and ``pass_seconds{kind}``: reconcile passes of Tasks and TaskShards (outcome
  ``ok``, or ``error``: retried with back-off);
- ``api_requests_total{method, outcome}``: calls of the operator's API wrapper (``ok``: done, including a create
  that found its object or a delete that found none; ``conflict``: a conditional write refused; ``error``);
- ``splits_total{outcome}``: split requests ``accepted``, ``rejected`` or ``waiting``, and splits ``completed``
  or ``aborted`` (withdrawn before the hand-over);
- ``split_seconds``: a split from its acceptance to ``Split``; ``split_phase_seconds{phase}``: time a split
  parent spent in each protocol phase (measured by this process; a restarted operator starts over);
- ``live_scrapes_total{outcome}``: scrapes of shard drivers' metrics endpoints for ``status.live`` (``ok``,
  ``empty``: no shard metrics in the answer, ``error``: no answer);
- ``shards{phase}``: TaskShards by phase, and ``queue_depth``: keys queued, running or waiting, both read at
  scrape time (from the watch-fed cache and the work queue);
- per Task (labels ``task_namespace``, ``task``; ``namespace`` is the operator's own, a scrape target's label),
  read from its ``status.live`` at scrape time: ``task_watermark_seconds`` (the lowest over every key-group
  range, never back), ``task_dead_letters_total`` and ``task_late_records_total`` (over the Task's life, retired
  and deleted shards included, never falling): a Task's figures across hand-overs, which a query over the
  shards' own series cannot give (a successor that has not reported yet is missing from ``min``, a pruned shard's
  counter from ``sum``).

:data:`METRIC_NAMES` lists them for the dashboard test.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from taskshard_operator.live import TaskFigures

PREFIX = "taskshard_operator"
REGISTRY = CollectorRegistry()

PASSES = Counter(f"{PREFIX}_passes", "Reconcile passes by kind and outcome.", ["kind", "outcome"], registry=REGISTRY)
PASS_SECONDS = Histogram(
    f"{PREFIX}_pass_seconds",
    "Wall time of one reconcile pass.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    f"{PREFIX}_api_requests", "Kubernetes API calls by method and outcome.", ["method", "outcome"], registry=REGISTRY
)
SPLITS = Counter(f"{PREFIX}_splits", "Split requests and splits by outcome.", ["outcome"], registry=REGISTRY)
SPLIT_SECONDS = Histogram(
    f"{PREFIX}_split_seconds",
    "A split from its acceptance (status.split.acceptedTime) to phase Split.",
    buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
SPLIT_PHASE_SECONDS = Histogram(
    f"{PREFIX}_split_phase_seconds",
    "Time a split parent spent in each split phase (seen by this operator process).",
    ["phase"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
    registry=REGISTRY,
)

LIVE_SCRAPES = Counter(
    f"{PREFIX}_live_scrapes",
    "Scrapes of shard metrics endpoints for status.live, by outcome.",
    ["outcome"],
    registry=REGISTRY,
)

SPLIT_PHASES = ("SplitRequested", "Draining", "Drained", "ChildrenCreated", "AbortingSplit")
SPLIT_EVENTS = {
    "SplitAccepted": "accepted",
    "SplitRejected": "rejected",
    "SplitWaiting": "waiting",
    "Split": "completed",
    "SplitAborted": "aborted",
}
"""Events the passes post, and the ``splits_total`` outcome each counts as."""

METRIC_NAMES = (
    f"{PREFIX}_passes_total",
    f"{PREFIX}_pass_seconds",
    f"{PREFIX}_api_requests_total",
    f"{PREFIX}_splits_total",
    f"{PREFIX}_split_seconds",
    f"{PREFIX}_split_phase_seconds",
    f"{PREFIX}_live_scrapes_total",
    f"{PREFIX}_shards",
    f"{PREFIX}_queue_depth",
    f"{PREFIX}_task_watermark_seconds",
    f"{PREFIX}_task_dead_letters_total",
    f"{PREFIX}_task_late_records_total",
)

_phase_since: dict[tuple[str, str], tuple[str, float]] = {}
_lock = threading.Lock()


def observe_pass(kind: str, seconds: float, outcome: str) -> None:
    PASSES.labels(kind, outcome).inc()
    PASS_SECONDS.labels(kind).observe(seconds)


def observe_api(method: str, outcome: str) -> None:
    API_REQUESTS.labels(method, outcome).inc()


def observe_scrape(outcome: str) -> None:
    LIVE_SCRAPES.labels(outcome).inc()


def observe_event(reason: str) -> None:
    """Count a split outcome from an event reason the passes post (others are ignored)."""
    outcome = SPLIT_EVENTS.get(reason)
    if outcome is not None:
        SPLITS.labels(outcome).inc()


def observe_phase(namespace: str, shard: str, phase: str, status: dict[str, Any], now: float | None = None) -> None:
    """A shard's status now says ``phase``: time the split phase it left, and a whole split once it is Split."""
    now = time.monotonic() if now is None else now
    with _lock:
        left = _phase_since.pop((namespace, shard), None)
        if phase in SPLIT_PHASES:
            _phase_since[(namespace, shard)] = (phase, now)
    if left is not None and left[0] != phase:
        SPLIT_PHASE_SECONDS.labels(left[0]).observe(max(0.0, now - left[1]))
    accepted = (status.get("split") or {}).get("acceptedTime")
    if phase == "Split" and accepted:
        started = dt.datetime.fromisoformat(accepted.replace("Z", "+00:00"))
        SPLIT_SECONDS.observe(max(0.0, (dt.datetime.now(dt.UTC) - started).total_seconds()))


TaskFiguresOf = Callable[[], Iterable[tuple[str, str, "TaskFigures"]]]
"""``(namespace, task, figures)`` of every Task showing a ``status.live`` (from the watch-fed cache)."""


class LiveGauges:
    """``shards{phase}``, ``queue_depth`` and the Tasks' figures, read when Prometheus scrapes."""

    def __init__(
        self, phases: Callable[[], Iterable[str]], depth: Callable[[], int], tasks: TaskFiguresOf = lambda: ()
    ) -> None:
        self._phases = phases
        self._depth = depth
        self._tasks = tasks

    def collect(self):
        shards = GaugeMetricFamily(f"{PREFIX}_shards", "TaskShards by phase (from the cache).", labels=["phase"])
        for phase, n in sorted(Tally(self._phases()).items()):
            shards.add_metric([phase], n)
        yield shards
        yield GaugeMetricFamily(f"{PREFIX}_queue_depth", "Keys queued, running or waiting.", value=self._depth())
        labels = ["task_namespace", "task"]
        watermark = GaugeMetricFamily(
            f"{PREFIX}_task_watermark_seconds",
            "A Task's event-time watermark: the lowest over every key-group range, never back (Unix time).",
            labels=labels,
        )
        dead = CounterMetricFamily(
            f"{PREFIX}_task_dead_letters", "A Task's dead letters over its life (all its shards').", labels=labels
        )
        late = CounterMetricFamily(
            f"{PREFIX}_task_late_records", "A Task's late records over its life (all its shards').", labels=labels
        )
        for namespace, task, figures in sorted(self._tasks(), key=lambda t: (t[0], t[1])):
            if figures.watermark is not None:
                watermark.add_metric([namespace, task], figures.watermark)
            dead.add_metric([namespace, task], figures.counts.dead_letters)
            if figures.counts.late_records is not None:
                late.add_metric([namespace, task], figures.counts.late_records)
        yield from (watermark, dead, late)


def serve(
    port: int,
    phases: Callable[[], Iterable[str]],
    depth: Callable[[], int],
    addr: str = "0.0.0.0",
    tasks: TaskFiguresOf = lambda: (),
) -> None:
    """Register the live gauges and serve ``/metrics`` on ``port`` (a daemon thread)."""
    REGISTRY.register(LiveGauges(phases, depth, tasks))
    start_http_server(port, addr=addr, registry=REGISTRY)
