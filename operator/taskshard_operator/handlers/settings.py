"""Operator settings and lifecycle: the ``taskshard.io`` finalizer and annotation storage, event posting, the
cache binding, the work queue's threads, the metrics endpoint and the safety-net resync."""

from __future__ import annotations

import logging
import random
from typing import Any

import kopf

from taskshard_operator import metrics, naming
from taskshard_operator.handlers.runtime import METRICS_PORT, RESYNC_SECONDS, RUNTIME


@kopf.on.startup()
def operator_startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.PROGRESS_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.PROGRESS_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # log lines are not events; the reconcilers post their own
    settings.peering.stealth = True
    settings.execution.max_workers = 4  # only deletions and probes run in Kopf's threads; passes in the queue's
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    RUNTIME.kube  # noqa: B018 - load credentials once, at start
    RUNTIME.cache.bind(kwargs)
    RUNTIME.queue.start()
    RUNTIME.live.start()
    if METRICS_PORT:
        metrics.serve(METRICS_PORT, RUNTIME.cache.shard_phases, RUNTIME.queue.pending, tasks=RUNTIME.cache.task_figures)


@kopf.on.cleanup()
def operator_cleanup(**_: Any) -> None:
    RUNTIME.live.stop()
    RUNTIME.queue.stop()


@kopf.daemon(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL, id="resync", cancellation_timeout=1.0)
async def resync(namespace: str, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """The safety net: the Task and its shards get a pass every ``RESYNC_SECONDS`` (spread by a random phase),
    whatever the watches said. Every wait ends as soon as the daemon is stopped (a Task's deletion waits for
    it)."""
    await stopped.wait(random.uniform(0, RESYNC_SECONDS))
    while not stopped:
        RUNTIME.enqueue(("task", namespace, name))
        for shard in RUNTIME.cache.shards_of_task(namespace, name):
            RUNTIME.enqueue(("shard", namespace, shard["metadata"]["name"]))
        await stopped.wait(RESYNC_SECONDS)


@kopf.on.probe(id="api")
def operator_probe(**_) -> str:
    return "ok"
