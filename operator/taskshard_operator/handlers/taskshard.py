"""TaskShard handlers: every trigger runs one coalesced :func:`reconcile_shard` pass for the shard.

- ``taskshard_event``: any watch event of the shard (spec edits such as ``spec.split``, its own status writes,
  so each protocol step is followed at once by the next pass); a split parent's hand-over also runs a pass for
  each child (standby -> Running);
- ``taskshard_resync``: a timer, the safety net (back-off expiry, missed events, operator restart);
- ``pod_event``: any event of a shard's driver pod (started, crashed, drained, deleted).
"""

from __future__ import annotations

import kopf

from taskshard_operator import naming
from taskshard_operator.handlers.runtime import RESYNC_SECONDS, RUNTIME, emit
from taskshard_operator.reconcile_shard import reconcile_shard

HANDED_OVER = ("ChildrenCreated", "Split")
"""A split parent's phases after which its children own the range."""


def _pass(namespace: str, name: str) -> None:
    RUNTIME.coalescer.run(
        ("shard", namespace, name),
        lambda: reconcile_shard(RUNTIME.kube, namespace, name, emit=emit, backoff=RUNTIME.backoff),
    )


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL)
def taskshard_event(type: str, name: str, namespace: str, status: dict, **_) -> None:
    if type == "DELETED":
        return
    _pass(namespace, name)
    # Children on standby show Running as soon as their parent hands the range over (not at the next timer).
    if (status or {}).get("phase") in HANDED_OVER:
        for child in ((status or {}).get("lineage") or {}).get("children") or []:
            _pass(namespace, child)


@kopf.timer(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL, interval=RESYNC_SECONDS)
def taskshard_resync(name: str, namespace: str, **_) -> None:
    _pass(namespace, name)


@kopf.on.event("", "v1", "pods", labels={naming.LABEL_COMPONENT: naming.COMPONENT_SHARD})
def pod_event(namespace: str, labels: dict, **_) -> None:
    shard = labels.get(naming.LABEL_SHARD)
    if shard:
        _pass(namespace, shard)
