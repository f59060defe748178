"""Task handlers: every trigger enqueues a pass (``reconcile_task``); deletion applies retention.

- ``task_event``: any watch event of the Task (spec edits roll or re-validate);
- ``task_shard_event``: any event of one of its TaskShards (the Task's status follows its shards; debounced, so
  a burst of shard events makes one Task pass);
- ``task_delete``: stop shard pods, then ``checkpointRetention`` (finalizer ``taskshard.io/finalizer``).

The safety-net resync and the time-based passes are the work queue's (``handlers/settings.py``).
"""

from __future__ import annotations

import kopf

from taskshard_operator import naming
from taskshard_operator.handlers.runtime import RUNTIME, TASK_DEBOUNCE_SECONDS, emit
from taskshard_operator.reconcile_task import delete_task


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL)
async def task_event(type: str, name: str, namespace: str, **_) -> None:
    if type != "DELETED":
        RUNTIME.enqueue(("task", namespace, name))


@kopf.on.event(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL, id="task_shard_event")
async def task_shard_event(namespace: str, spec: dict, **_) -> None:
    task = (spec.get("taskRef") or {}).get("name")
    if task:
        RUNTIME.enqueue(("task", namespace, task), TASK_DEBOUNCE_SECONDS)


@kopf.on.delete(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL)
def task_delete(name: str, namespace: str, body: kopf.Body, **_) -> None:
    delete_task(RUNTIME.kube, namespace, name, dict(body), emit=emit)
