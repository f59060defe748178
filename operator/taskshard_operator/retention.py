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

Storage goes first: the Task starts a prune pod (:func:`taskshard_operator.builders.build_prune_pod`) that decides
again from storage facts (``spark_runtime.history``: each successor committed a batch of its own and recorded its
restore plan, or retired) and removes the recovery logs, snapshots and hand-over notes of the shards it may, keeping
their small records (``lineage.json``, ``drained.json``: the final results read them; late records' dead letters).
Once it succeeded, the TaskShards whose storage it pruned are deleted (their ConfigMaps go with them: owner
references); those it kept (its termination message, :class:`spark_runtime.protocol.PruneSummary`, says why) stay,
and the pod stays :data:`PRUNE_RETRY_SECONDS` as the clock of the next try, then goes with a Normal event
HistoryPruneWaiting naming each kept shard and what its successor lacks. Until the pod is gone nothing else is pruned.
A storage the operator cannot mount (a path without ``spec.storage.volume``) keeps its directories: the TaskShards
are deleted at once. Shard names never repeat within a Task (:func:`taskshard_operator.naming.shard_name`), so no
later shard takes a deleted one's name or storage.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_runtime.protocol import PruneSummary
from taskshard_operator import naming
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.status import parse_termination_message

RETIRED = (ShardPhase.SPLIT.value, ShardPhase.MERGED.value)
PRUNE_PER_PASS = 10
"""At most this many retired shards are deleted in one pass (the next pass goes on)."""
PRUNE_RETRY_SECONDS = 120
"""A prune pod that kept shards (storage showed a successor still needs them) stays this long after it finished;
then it goes and the next pass tries them again."""


def _parents(shard: Mapping[str, Any]) -> list[str]:
    spec = shard.get("spec") or {}
    names = [p.get("parent") for p in spec.get("mergeFrom") or []]
    names.append((spec.get("restoreFrom") or {}).get("parent"))
    return [n for n in names if n]


def successors_by_parent(shards: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each shard's successors by name: the shards whose ``spec.restoreFrom`` or ``spec.mergeFrom`` names it."""
    out: dict[str, list[str]] = {}
    for shard in shards:
        for parent in _parents(shard):
            out.setdefault(parent, []).append(shard["metadata"]["name"])
    return {parent: sorted(names) for parent, names in out.items()}


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
    by_name = {s["metadata"]["name"]: s for s in live}
    successors = {p: [by_name[n] for n in names] for p, names in successors_by_parent(live).items()}
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
    summary: PruneSummary | None = None
    """Its termination message once it succeeded: what it pruned and kept (None from a runtime that wrote none,
    which pruned every shard it was given)."""
    finished_at: str | None = None
    """When its container terminated (RFC 3339)."""

    @property
    def pruned(self) -> tuple[str, ...]:
        """The shards whose storage is gone (all it was given, without a summary)."""
        return self.summary.pruned if self.summary is not None else self.shards

    @property
    def kept(self) -> tuple[tuple[str, str], ...]:
        """The shards it kept, each with why (storage showed a successor still needs it)."""
        return self.summary.kept if self.summary is not None else ()

    def retry_in(self, now: float) -> float:
        """Seconds (``now``: epoch seconds) until a pod that kept shards may go (:data:`PRUNE_RETRY_SECONDS` after
        it finished; 0 without a readable finish time)."""
        try:
            finished = dt.datetime.fromisoformat(str(self.finished_at).replace("Z", "+00:00")).timestamp()
        except ValueError:
            return 0.0
        return max(0.0, finished + PRUNE_RETRY_SECONDS - now)


def prune_pod_view(body: Mapping[str, Any]) -> PrunePodView:
    meta = body.get("metadata") or {}
    listed = (meta.get("annotations") or {}).get(naming.ANNOTATION_PRUNE_SHARDS) or ""
    status = body.get("status") or {}
    terminated = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get("terminated") or {}
    return PrunePodView(
        name=str(meta.get("name") or ""),
        uid=meta.get("uid"),
        phase=status.get("phase"),
        shards=tuple(n for n in listed.split(",") if n),
        deleting=bool(meta.get("deletionTimestamp")),
        summary=_summary(terminated.get("message")),
        finished_at=terminated.get("finishedAt"),
    )


def _summary(message: str | None) -> PruneSummary | None:
    data = parse_termination_message(message)
    if data is None:
        return None
    try:
        return PruneSummary.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None


__all__ = [
    "PRUNE_PER_PASS",
    "PRUNE_RETRY_SECONDS",
    "RETIRED",
    "PrunePodView",
    "prunable",
    "prune_pod_view",
    "successors_by_parent",
]
