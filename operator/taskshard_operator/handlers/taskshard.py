"""TaskShard handlers: every trigger runs one coalesced :func:`reconcile_shard` pass for the shard.

- ``taskshard_event``: any watch event of the shard (spec edits such as ``spec.split``, its own status writes,
  so each protocol step is followed at once by the next pass);
- ``taskshard_resync``: a timer, the safety net (back-off expiry, missed events, operator restart);
- ``pod_event``: any event of a shard's driver pod (started, crashed, drained, deleted).
"""

from __future__ import annotations

import kopf

from taskshard_operator import naming
from taskshard_operator.handlers.runtime import RESYNC_SECONDS, RUNTIME, emit
from taskshard_operator.reconcile_shard import reconcile_shard


def _pass(namespace: str, name: str) -> None:
    RUNTIME.coalescer.run(
        ("shard", namespace, name),
        lambda: reconcile_shard(RUNTIME.kube, namespace, name, emit=emit, backoff=RUNTIME.backoff),
    )


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL)
def taskshard_event(type: str, name: str, namespace: str, **_) -> None:
    if type != "DELETED":
        _pass(namespace, name)


@kopf.timer(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL, interval=RESYNC_SECONDS)
def taskshard_resync(name: str, namespace: str, **_) -> None:
    _pass(namespace, name)


@kopf.on.event("", "v1", "pods", labels={naming.LABEL_COMPONENT: naming.COMPONENT_SHARD})
def pod_event(namespace: str, labels: dict, **_) -> None:
    shard = labels.get(naming.LABEL_SHARD)
    if shard:
        _pass(namespace, shard)
