"""History retention: which retired TaskShards (split parents and merged-away shards) a Task may delete.

Every split leaves its parent (phase ``Split``) and every merge its two parents (phase ``Merged``) as TaskShards:
history that ``kubectl get taskshards`` would list forever. A Task keeps the newest ``spec.history.retiredShards``
of them (by their final checkpoint's time) and deletes older ones, one pass at a time, but only a retired shard
that nothing may still need:

- every successor (the shards whose ``spec.restoreFrom`` or ``spec.mergeFrom`` names it) exists, ran
  (``status.lineage``) and has committed a micro-batch of its own (``status.lastCheckpoint``, or ``status.live``
  emitting with a committed batch) or retired itself: a
  successor that has not could still restore from the retired shard's snapshot, or its hand-over could still be
  withdrawn;
- it has successors at all (a retired shard without one is a state the operator does not make; it is kept, so a
  person can look at it).

Deleting a TaskShard removes its ConfigMap with it (owner reference); its storage directory (final checkpoint,
snapshots, lineage, dead letters) stays until the Task is deleted with ``checkpointRetention: Delete``. Shard names
never repeat within a Task (:func:`taskshard_operator.naming.shard_name`), so no later shard takes a deleted one's
name or storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskshard_operator.models.shard import ShardPhase

RETIRED = (ShardPhase.SPLIT.value, ShardPhase.MERGED.value)
PRUNE_PER_PASS = 10
"""At most this many retired shards are deleted in one pass (the next pass goes on)."""


def _parents(shard: Mapping[str, Any]) -> list[str]:
    spec = shard.get("spec") or {}
    names = [p.get("parent") for p in spec.get("mergeFrom") or []]
    names.append((spec.get("restoreFrom") or {}).get("parent"))
    return [n for n in names if n]


def _settled(successor: Mapping[str, Any]) -> bool:
    """The successor no longer needs its parents: it ran (``status.lineage``: a successor that ran stays one when
    its parents are gone, :func:`taskshard_operator.handover.successor_standing`) and committed a batch of its own
    (``status.lastCheckpoint`` from a pod that ended, or ``status.live``: emitting, a batch committed), or retired
    itself."""
    status = successor.get("status") or {}
    live = status.get("live") or {}
    committed = bool(status.get("lastCheckpoint")) or (live.get("emitting") and int(live.get("batchId", -1)) >= 0)
    return bool(status.get("lineage")) and (committed or status.get("phase") in RETIRED)


def _retired_at(shard: Mapping[str, Any]) -> str:
    status = shard.get("status") or {}
    return str((status.get("finalCheckpoint") or {}).get("time") or shard["metadata"].get("creationTimestamp") or "")


def prunable(shards: Sequence[Mapping[str, Any]], keep: int) -> list[str]:
    """The retired shards of one Task to delete now (oldest first, at most :data:`PRUNE_PER_PASS`): those beyond
    the newest ``keep`` whose successors are all settled (see the module docstring)."""
    live = [s for s in shards if not s["metadata"].get("deletionTimestamp")]
    successors: dict[str, list[Mapping[str, Any]]] = {}
    for shard in live:
        for parent in _parents(shard):
            successors.setdefault(parent, []).append(shard)
    retired = [s for s in live if (s.get("status") or {}).get("phase") in RETIRED]
    retired.sort(key=lambda s: (_retired_at(s), s["metadata"]["name"]), reverse=True)
    out = []
    for shard in reversed(retired[keep:]):  # oldest first
        name = shard["metadata"]["name"]
        after = successors.get(name) or []
        if after and all(_settled(s) for s in after):
            out.append(name)
    return out[:PRUNE_PER_PASS]


__all__ = ["PRUNE_PER_PASS", "RETIRED", "prunable"]
