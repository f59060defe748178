"""Process-wide state the thin handlers share: the API wrapper, the watch-fed cache, the work queue, the back-off.

Every Kopf handler only enqueues a key (``("task" | "shard", namespace, name)``); :func:`run_pass` runs on the
work queue's threads, under a copy of the Kopf context captured from the handlers (so Kopf's logging context holds
there as in a handler).
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Hashable
from typing import Any

from taskshard_operator import metrics
from taskshard_operator.cache import KopfCache
from taskshard_operator.kube import Kube
from taskshard_operator.live import LIVE_INTERVAL_SECONDS, STALE_SCRAPES, LiveScraper
from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard
from taskshard_operator.reconcile_task import reconcile_task
from taskshard_operator.workqueue import WorkQueue

log = logging.getLogger("taskshard_operator")

RESYNC_SECONDS = float(os.environ.get("TASKSHARD_RESYNC_SECONDS", "300"))
"""Every Task and TaskShard gets a pass at least this often (a safety net; watch events drive the passes)."""
BACKOFF_BASE = float(os.environ.get("TASKSHARD_BACKOFF_BASE", "2"))
BACKOFF_CAP = float(os.environ.get("TASKSHARD_BACKOFF_CAP", "60"))
WORKERS = int(os.environ.get("TASKSHARD_WORKERS", "8"))
METRICS_PORT = int(os.environ.get("TASKSHARD_METRICS_PORT", "0"))
"""Serve Prometheus metrics on this port (0: off; ``--metrics-port``)."""
LIVE_SECONDS = float(os.environ.get("TASKSHARD_LIVE_SECONDS", str(LIVE_INTERVAL_SECONDS)))
"""Scrape running shards' metrics for ``status.live`` this often (0: off; ``--live-status-seconds``)."""
TASK_DEBOUNCE_SECONDS = 0.5
"""A Task's pass after a shard event waits this long, so a burst of shard events makes one Task pass."""


class Runtime:
    def __init__(self) -> None:
        self._kube: Kube | None = None
        self.backoff = PodReplacementBackoff(base=BACKOFF_BASE, cap=BACKOFF_CAP)
        self.cache = KopfCache()
        self.queue = WorkQueue(lambda key: run_pass(key), workers=WORKERS)
        self.queue.observer = lambda key, seconds, error: metrics.observe_pass(
            key[0], seconds, "ok" if error is None else "error"
        )
        self.context: contextvars.Context | None = None
        if LIVE_SECONDS > 0:
            self.cache.live_store.stale_seconds = STALE_SCRAPES * LIVE_SECONDS
        self.cache.live_store.enabled = LIVE_SECONDS > 0
        self.live = LiveScraper(
            self.cache.live_store,
            self.cache.scrape_targets,
            self.cache.shard_live,
            self.enqueue_from_thread,
            interval=LIVE_SECONDS,
            observe=metrics.observe_scrape,
        )

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            from taskshard_operator.kube import load_config  # noqa: PLC0415

            load_config()
            self._kube = Kube()
        return self._kube

    def enqueue(self, key: Hashable, delay: float = 0.0) -> None:
        """Ask for a pass (from a handler: the Kopf context is captured for the workers)."""
        self.context = contextvars.copy_context()
        self.queue.add(key, delay)

    def enqueue_from_thread(self, key: Hashable) -> None:
        """Ask for a pass from a thread outside Kopf (the live-status scraper): the captured context stays."""
        self.queue.add(key, 0.0)


RUNTIME = Runtime()


def emit(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Log a Kubernetes Event and post it before returning (:meth:`Kube.post_event`: not through Kopf's background
    poster, whose queue an operator that dies loses). Events are auxiliary: a refused post is logged, the pass goes
    on."""
    name = (body.get("metadata") or {}).get("name")
    metrics.observe_event(reason)
    log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s %s: %s", reason, name, message)
    try:
        RUNTIME.kube.post_event(body, type_, reason, message)
    except Exception as e:  # noqa: BLE001 - an event that cannot be posted never fails the pass
        log.warning("could not post the event %s about %s: %s", reason, name, e)


def run_pass(key: Hashable) -> float | None:
    """One pass for ``key``, in the captured Kopf context."""
    context = RUNTIME.context
    if context is None:
        return _pass(key)
    return context.copy().run(_pass, key)


def _pass(key: Hashable) -> float | None:
    kind, namespace, name = key
    if kind == "task":
        return reconcile_task(RUNTIME.kube, RUNTIME.cache, namespace, name, emit=emit)
    return reconcile_shard(RUNTIME.kube, RUNTIME.cache, namespace, name, emit=emit, backoff=RUNTIME.backoff)
