"""Whose state a task's storage directory holds: ``<root>/<task>/identity.json``.

Storage is laid out by Task *name* (``<root>/<task>/shards/<shard>``), so without a check two Tasks of the same
name in two namespaces on one bucket, or a Task re-created over retained storage, would share recovery logs and
snapshots and silently resume each other's state. The operator passes the Task's UID (``taskUid`` in the shard
config); the first start of any shard of the Task writes ``identity.json`` ``{"uid", "namespace", "task",
"createdAt"}`` and every start checks it:

- missing: written now (on a local filesystem with an exclusive create, so of two Tasks starting at the same
  instant exactly one claims it; on S3 the last writer wins that instant, then both re-read and one is refused);
- the Task's UID: this Task's state, go on;
- another UID: refused before anything is read or written (:class:`StorageOwnedByAnotherTask`, exit 3, reason
  ``StorageOwnedByAnotherTask`` on the TaskShard), naming the owner and the two ways out: start fresh (delete the
  directory, or use another ``storage.path``/``storage.s3.prefix``), or adopt the old state on purpose (replace
  ``identity.json`` with this Task's UID, which the message names).

The operator's cleanup pod (``checkpointRetention: Delete``) removes a task's directory only when it holds no
identity or this Task's (:func:`remove_task_state`), so deleting one Task never deletes another's state; its prune
pod (``spec.history.retiredShards``) removes retired shards' recovery logs and snapshots on the same condition
(:func:`spark_runtime.history.prune_retired_shards`).
A config without ``taskUid`` (the runtime run by hand, the tests' own shards) skips the check.
"""

from __future__ import annotations

import json
import os
from typing import Any

from spark_runtime.problems import EnvironmentProblem
from spark_runtime.protocol import rfc3339
from spark_runtime.storage import Loc, location, remove_tree, s3_settings_from

__all__ = [
    "IDENTITY_FILE",
    "StorageOwnedByAnotherTask",
    "claim_task_storage",
    "owned_by_another",
    "remove_task_state",
    "task_dir_location",
]

IDENTITY_FILE = "identity.json"


class StorageOwnedByAnotherTask(EnvironmentProblem):
    """The task directory holds another Task's state (another UID)."""

    def __init__(self, message: str) -> None:
        super().__init__("StorageOwnedByAnotherTask", "storage", message)


def _identity(task: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "uid": uid,
        "namespace": namespace,
        "task": task,
        "createdAt": rfc3339(),
    }


def _create_exclusive(target: Loc, data: bytes) -> None:
    """Create ``target`` unless it exists (exclusive on a local filesystem; a plain put on S3)."""
    if target.is_s3:
        target.write_bytes(data)
        return
    path = target.local_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def claim_task_storage(task_dir: Loc, *, task: str, namespace: str, uid: str | None) -> dict[str, Any] | None:
    """Check (or, first, write) ``<task_dir>/identity.json`` for the Task ``namespace/task`` with ``uid``; raise
    :class:`StorageOwnedByAnotherTask` when it names another UID. Returns the identity (None without ``uid``)."""
    if not uid:
        return None
    target = task_dir / IDENTITY_FILE
    if not target.exists():
        _create_exclusive(target, (json.dumps(_identity(task, namespace, uid), indent=2) + "\n").encode())
    found = target.read_json()
    if not isinstance(found, dict) or found.get("uid") != uid:
        owner = found if isinstance(found, dict) else {}
        raise StorageOwnedByAnotherTask(
            f"storage: {task_dir.uri()} holds the state of Task {owner.get('namespace')}/{owner.get('task')} "
            f"(uid {owner.get('uid')}, since {owner.get('createdAt')}), not of Task {namespace}/{task} (uid {uid}); "
            "two Tasks must never share recovery logs. To start fresh, delete that directory or give this Task "
            "another storage.path / storage.s3.prefix; to adopt that state on purpose, replace "
            f'{target.uri()} with {{"uid": "{uid}", "namespace": "{namespace}", "task": "{task}"}}'
        )
    return found


def task_dir_location(uri: str, endpoint: str | None) -> Loc:
    """The task directory ``uri`` (a local path or ``s3a://``), with ``endpoint`` for S3 (the pod's env gives the
    credentials)."""
    return location(
        uri, s3_settings_from(None, {**os.environ, **({"TASKSHARD_S3_ENDPOINT": endpoint} if endpoint else {})})
    )


def owned_by_another(loc: Loc, uid: str | None) -> str | None:
    """Why ``loc`` (a task directory) must be kept: its ``identity.json`` names another UID than ``uid``."""
    identity = loc / IDENTITY_FILE
    if uid and identity.exists():
        owner = identity.read_json()
        if isinstance(owner, dict) and owner.get("uid") != uid:
            return (
                f"kept {loc.uri()}: it holds Task {owner.get('namespace')}/{owner.get('task')} uid {owner.get('uid')}"
            )
    return None


def remove_task_state(uri: str, uid: str | None, endpoint: str | None = None) -> str:
    """The cleanup pod's job: delete the task directory ``uri`` (local path or ``s3a://``) unless its
    ``identity.json`` names another UID, in which case nothing is deleted. Returns what was done, for the log."""
    kept = owned_by_another(task_dir_location(uri, endpoint), uid)
    return kept if kept is not None else f"removed {remove_tree(uri, endpoint)}"
