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

Storage goes first: the Task starts a prune pod (:func:`taskshard_operator.builders.build_prune_pod`) that removes
the chosen shards' recovery logs, snapshots and hand-over notes and keeps their small records (``lineage.json``,
``drained.json``: the final results read them; late records' dead letters). Once it succeeded, the TaskShards are
deleted (their ConfigMaps go with them: owner references) and the pod with them; until then nothing else is pruned.
A storage the operator cannot mount (a path without ``spec.storage.volume``) keeps its directories: the TaskShards
are deleted at once. Shard names never repeat within a Task (:func:`taskshard_operator.naming.shard_name`), so no
later shard takes a deleted one's name or storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from taskshard_operator import naming
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
    (``status.lastCheckpoint`` from a pod that ended, with a batch id of 0 or more: a successor stopped on standby
    reports -1, and its parents' recovery logs and snapshots are then the only copies of its range's state; or
    ``status.live``: emitting, a batch committed), or retired itself."""
    status = successor.get("status") or {}
    live = status.get("live") or {}
    own = int((status.get("lastCheckpoint") or {}).get("batchId", -1))
    committed = own >= 0 or (live.get("emitting") and int(live.get("batchId", -1)) >= 0)
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


@dataclass(frozen=True)
class PrunePodView:
    """A Task's prune pod as its pass needs it (the watch-fed cache keeps one per Task)."""

    name: str
    uid: str | None
    phase: str | None
    shards: tuple[str, ...]
    """The retired shards whose storage it prunes (``naming.ANNOTATION_PRUNE_SHARDS``)."""
    deleting: bool = False


def prune_pod_view(body: Mapping[str, Any]) -> PrunePodView:
    meta = body.get("metadata") or {}
    listed = (meta.get("annotations") or {}).get(naming.ANNOTATION_PRUNE_SHARDS) or ""
    return PrunePodView(
        name=str(meta.get("name") or ""),
        uid=meta.get("uid"),
        phase=(body.get("status") or {}).get("phase"),
        shards=tuple(n for n in listed.split(",") if n),
        deleting=bool(meta.get("deletionTimestamp")),
    )


__all__ = ["PRUNE_PER_PASS", "RETIRED", "PrunePodView", "prunable", "prune_pod_view"]
