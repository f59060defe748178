"""Task handlers: every trigger runs one coalesced :func:`reconcile_task` pass; deletion applies retention.

- ``task_event``: any watch event of the Task (spec edits roll or re-validate);
- ``task_resync``: a timer (safety net);
- ``task_shard_event``: any event of one of its TaskShards (phase changes update the Task's status at once);
- ``task_delete``: stop shard pods, then ``checkpointRetention`` (finalizer ``taskshard.io/finalizer``).
"""

from __future__ import annotations

import kopf

from taskshard_operator import naming
from taskshard_operator.handlers.runtime import RESYNC_SECONDS, RUNTIME, emit
from taskshard_operator.reconcile_task import delete_task, reconcile_task


def _pass(namespace: str, name: str) -> None:
    RUNTIME.coalescer.run(("task", namespace, name), lambda: reconcile_task(RUNTIME.kube, namespace, name, emit=emit))


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL)
def task_event(type: str, name: str, namespace: str, **_) -> None:
    if type != "DELETED":
        _pass(namespace, name)


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL, id="task_shard_event")
def task_shard_event(namespace: str, spec: dict, **_) -> None:
    task = (spec.get("taskRef") or {}).get("name")
    if task:
        _pass(namespace, task)


@kopf.timer(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL, interval=RESYNC_SECONDS * 2)
def task_resync(name: str, namespace: str, **_) -> None:
    _pass(namespace, name)


@kopf.on.delete(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL)
def task_delete(name: str, namespace: str, body: kopf.Body, **_) -> None:
    delete_task(RUNTIME.kube, namespace, name, dict(body), emit=emit)
