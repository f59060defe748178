"""History retention, storage side: the prune pod removes a retired shard's bulk only when storage shows that no
successor still needs it.

The operator chooses retired shards (split parents, merged-away shards) from its TaskShards' status
(``taskshard_operator.retention``); status can lag or mislead (a successor stopped on standby, a successor whose
runtime kept no restore plan). So the prune pod decides again, from storage facts alone, shard by shard
(:func:`prune_retired_shards`):

- the retired shard's successors are those the operator names *and* every shard whose ``lineage.json`` names it
  as its parent (a successor the operator's cache has not seen still counts);
- a successor no longer needs it when it retired itself (``drained.json``: its own successors restore from its
  snapshots), or when it committed a batch of its own (``checkpoint/commits``) *and* recorded its restore plan
  (``restore-plan.json``, :func:`spark_runtime.snapshot.restore.recorded_plan`): every later start resumes from
  its own recovery log and that record, never from its parents' snapshots;
- a retired shard with no successor at all is kept (the operator does not make one; a person can look at it).

A kept shard keeps everything; the summary (:class:`spark_runtime.protocol.PruneSummary`, the pod's termination
message) says which successor it waits for and what that successor lacks, and the operator keeps its TaskShard and
tries again later. Removed per pruned shard: :data:`RETIRED_SHARD_BULK`; its small records stay.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.identity import owned_by_another, task_dir_location
from spark_runtime.layout import ShardPaths
from spark_runtime.protocol import PruneSummary
from spark_runtime.storage import Loc

__all__ = [
    "RETIRED_SHARD_BULK",
    "prune_pod_main",
    "prune_retired_shards",
    "still_needs_parent",
    "successors_in_storage",
]

log = logging.getLogger(__name__)

RETIRED_SHARD_BULK = ("checkpoint", "snapshots", "handover", "restore")
"""What :func:`prune_retired_shards` removes of a retired shard's directory: its recovery log, its snapshots, its
hand-over notes and its restore reports. Its small records stay (``lineage.json`` and ``drained.json``, which the
final results read, ``epochs/``, progress and standby records, late records' dead letters)."""


def _shard_paths(task_dir: Loc, shard: str) -> ShardPaths:
    return ShardPaths(task_dir.parent, task_dir.name, shard)


def successors_in_storage(task_dir: Loc) -> dict[str, set[str]]:
    """Each shard's successors by storage (one listing of the task directory): the shards whose ``lineage.json``
    names it as their parent (a split child's ``parent``, a merged shard's ``parents``)."""
    found: dict[str, set[str]] = {}
    for shard_dir in (task_dir / "shards").iterdir():
        lineage = shard_dir / "lineage.json"
        record = lineage.read_json() if lineage.exists() else None
        if not isinstance(record, dict):
            continue
        for parent in {record.get("parent"), *(record.get("parents") or ())} - {None, shard_dir.name}:
            found.setdefault(str(parent), set()).add(shard_dir.name)
    return found


def still_needs_parent(paths: ShardPaths) -> str | None:
    """Why the successor at ``paths`` may still read its parents' snapshots or recovery logs, or None when it no
    longer can (see the module docstring)."""
    if paths.drained.exists():
        return None
    committed = last_committed_batch(paths.checkpoint)
    planned = paths.restore_plan.exists()
    if committed >= 0 and planned:
        return None
    if committed < 0:
        return f"successor {paths.shard} has not committed a batch of its own (on standby, or not started)"
    return (
        f"successor {paths.shard} committed batch {committed} but recorded no restore plan (its runtime predates "
        "restore-plan.json: its next start records one; delete its pod to restart it now)"
    )


def _check_name(shard: str) -> None:
    if not shard or "/" in shard or shard in (".", ".."):
        raise ValueError(f"{shard!r} is not a shard name")


def prune_retired_shards(
    uri: str,
    uid: str | None,
    shards: Sequence[str],
    endpoint: str | None = None,
    successors: Mapping[str, Sequence[str]] | None = None,
) -> PruneSummary:
    """The prune pod's job: remove the bulk of each retired shard in ``shards`` from the task directory ``uri``
    whose successors (``successors[shard]``, the operator's, joined with those storage names) no longer need it;
    keep the others with the reason. Nothing is removed when the directory holds another Task's state (every shard
    kept). Idempotent (a retry finds less)."""
    for shard in shards:
        _check_name(shard)
    loc = task_dir_location(uri, endpoint)
    other = owned_by_another(loc, uid)
    if other is not None:
        return PruneSummary(pruned=(), kept=tuple((s, other) for s in shards))
    pruned, kept = [], []
    in_storage = successors_in_storage(loc)
    for shard in shards:
        after = sorted(set((successors or {}).get(shard) or ()) | in_storage.get(shard, set()))
        for name in after:
            _check_name(name)
        if not after:
            kept.append((shard, f"no successor of {shard} is known to the operator or named in storage"))
            continue
        why = next((w for w in (still_needs_parent(_shard_paths(loc, s)) for s in after) if w), None)
        if why is not None:
            kept.append((shard, why))
            continue
        for name in RETIRED_SHARD_BULK:
            target = _shard_paths(loc, shard).shard_dir / name
            if target.exists():
                target.rmtree()
                log.info("pruned %s", target.uri())
        pruned.append(shard)
    return PruneSummary(pruned=tuple(pruned), kept=tuple(kept))


def prune_pod_main(
    uri: str,
    uid: str | None,
    shards: Sequence[str],
    endpoint: str | None,
    successors: Mapping[str, Sequence[str]],
    termination_log: str = "/dev/termination-log",
) -> PruneSummary:
    """The prune pod's entry point: :func:`prune_retired_shards`, its summary printed and written to the
    container's termination-message file (when the directory of ``termination_log`` exists), where the operator
    reads it. Exits 0 with shards kept: keeping is a decision, not a failure."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    summary = prune_retired_shards(uri, uid, shards, endpoint, successors)
    text = json.dumps(summary.to_json())
    print(text)
    target = Path(termination_log)
    if target.parent.is_dir() and os.access(target.parent if not target.exists() else target, os.W_OK):
        target.write_text(text)
    return summary
