"""What the planners see of a Task's shards: one :class:`~taskshard_operator.planner.ShardView` per TaskShard.

A Task's shards are found by ``spec.taskRef`` (the cache indexes every TaskShard by it), not by a label: a
TaskShard created by hand without the operator's labels still counts, so it can never own a range unseen.
"""

from __future__ import annotations

from typing import Any

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import naming, planner
from taskshard_operator.cache import Observed
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.phases import parse_phase
from taskshard_operator.status import PodView

__all__ = ["drained_for_merge", "shard_view", "shard_views"]


def shard_view(shard: dict[str, Any], pod: PodView) -> planner.ShardView:
    kg = shard["spec"]["keyGroups"]
    return planner.ShardView(
        name=shard["metadata"]["name"],
        key_groups=KeyGroupRange(kg["start"], kg["end"]),
        phase=parse_phase((shard.get("status") or {}).get("phase")),
        restored=bool(shard["spec"].get("restoreFrom") or shard["spec"].get("mergeFrom")),
        wanted_hash=(shard["metadata"].get("annotations") or {}).get(naming.ANNOTATION_TEMPLATE_HASH),
        pod_hash=pod.template_hash if pod.exists else None,
        pod_ready=pod.running and not pod.deleting,
        parent=(shard["spec"].get("restoreFrom") or {}).get("parent"),
        merge_parents=tuple(p["parent"] for p in shard["spec"].get("mergeFrom") or ()),
        drained_for_merge=drained_for_merge(shard),
        degraded_reason=_degraded_reason(shard),
        pod_stuck=pod.exists and pod.stuck,
        pod_restarts=pod.restart_count if pod.exists else 0,
    )


def _degraded_reason(shard: dict[str, Any]) -> str | None:
    for cond in (shard.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Degraded" and cond.get("status") == "True":
            return cond.get("reason") or None
    return None


def drained_for_merge(shard: dict[str, Any]) -> bool:
    """A merge parent whose pod drained for good: Merged, or Merging with ``status.finalCheckpoint``."""
    status = shard.get("status") or {}
    phase = parse_phase(status.get("phase"))
    return phase == ShardPhase.MERGED or (phase == ShardPhase.MERGING and bool(status.get("finalCheckpoint")))


def shard_views(observed: Observed, namespace: str, task: str) -> list[planner.ShardView]:
    """The Task's shards (``spec.taskRef.name == task``) with their pods, in key-group order."""
    views = [
        shard_view(s, observed.pod(namespace, s["metadata"]["name"])) for s in observed.shards_of_task(namespace, task)
    ]
    return sorted(views, key=lambda v: v.key_groups)
