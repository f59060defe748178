"""TaskShard handlers: every trigger enqueues a pass (``reconcile_shard``) for the shard it concerns.

- ``taskshard_event``: any watch event of the shard (spec edits such as ``spec.split``, its own status writes,
  so each protocol step is followed at once by the next pass); outside Running and Failed it also enqueues every
  other participant of its hand-over (:func:`taskshard_operator.handover.related_shards`: parents, children, the
  merged shard, the merge partner), so no phase waits for the resync;
- ``pod_event`` / ``configmap_event``: any event of a shard's driver pod (started, crashed, drained, deleted) or
  ConfigMap (edited or deleted by hand: re-applied);
- ``executor_event``: any event of an executor pod the shard's driver created (scheduled or not, running, gone):
  ``status.executors`` and the ExecutorsReady condition follow.
"""

from __future__ import annotations

import kopf

from taskshard_operator import naming
from taskshard_operator.handlers.indexes import EXECUTOR_PODS, SHARD_OBJECTS
from taskshard_operator.handlers.runtime import RUNTIME
from taskshard_operator.handover import related_shards
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.phases import parse_phase


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL)
async def taskshard_event(type: str, name: str, namespace: str, body: dict, status: dict, **_) -> None:
    if type != "DELETED":
        RUNTIME.enqueue(("shard", namespace, name))
    # Every other participant of a hand-over follows at once (a parent drained: its successors; a merged shard's
    # abort reported: its left parent; the left shard undid its merge: the right one; ...), not at the resync.
    # A Running or Failed shard's own changes (its live status every few seconds) concern nobody else.
    if type == "DELETED" or parse_phase((status or {}).get("phase")) not in (ShardPhase.RUNNING, ShardPhase.FAILED):
        for other in related_shards(body):
            RUNTIME.enqueue(("shard", namespace, other))


@kopf.on.event("", "v1", "pods", labels=SHARD_OBJECTS)
async def pod_event(namespace: str, labels: dict, **_) -> None:
    shard = labels.get(naming.LABEL_SHARD)
    if shard:
        RUNTIME.enqueue(("shard", namespace, shard))


@kopf.on.event("", "v1", "configmaps", labels=SHARD_OBJECTS)
async def configmap_event(namespace: str, labels: dict, **_) -> None:
    shard = labels.get(naming.LABEL_SHARD)
    if shard:
        RUNTIME.enqueue(("shard", namespace, shard))


@kopf.on.event("", "v1", "pods", labels=EXECUTOR_PODS)
async def executor_event(namespace: str, labels: dict, **_) -> None:
    shard = labels.get(naming.LABEL_SHARD)
    if shard:
        RUNTIME.enqueue(("shard", namespace, shard))
