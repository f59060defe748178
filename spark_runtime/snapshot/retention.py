"""A running shard's own snapshots: which it keeps, and pruning the rest at its start.

A shard writes a snapshot of its own state at each SIGTERM stop (a savepoint: a template roll, a node drain, an
eviction) and for each split it hands over (the pre-copy); neither is removed by the hand-over. Without pruning a
long-lived shard keeps one full copy of its state per pod restart. Retired shards (split parents, merged-away
shards) are the history retention's (the operator's prune pod, :func:`spark_runtime.history.prune_retired_shards`);
this module is about shards that still run.

At its start, after it claimed its writer epoch (an older runtime of the shard still alive can write nothing that
counts any more), a shard that has not drained keeps:

- the newest ``keep`` complete snapshots (manifest written), by batch id then writer epoch (``spec.history.
  snapshots``, default :data:`DEFAULT_SNAPSHOTS_KEPT`);
- the snapshot its pre-copy pointer (``handover/precopy.json``) names, whatever its age: a hand-over in progress
  (its children restored it, or will) outlives a restart of its parent;

and removes every other complete snapshot. An incomplete one (an export a crash interrupted, no manifest) stays:
only the writer epoch that wrote a snapshot directory writes or removes anything in it (a fenced runtime may still
be exporting into it), and the shard's whole ``snapshots/`` goes with the history retention once it retired.
A shard that drained (``drained.json``) prunes nothing: its successors restore from its snapshots, and it is the
history retention's once they committed. Nothing else reads a running shard's own snapshots: a split child restores
the pre-copy or the drain's snapshot, a merged shard its parents' drain snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from spark_runtime.layout import ShardPaths, parse_snapshot_name
from spark_runtime.protocol import DEFAULT_SNAPSHOTS_KEPT
from spark_runtime.storage import Loc

log = logging.getLogger("taskshard.snapshot")

__all__ = ["DEFAULT_SNAPSHOTS_KEPT", "prunable_snapshots", "prune_own_snapshots"]


def _sort_key(parsed: tuple[int, int | None]) -> tuple[int, int]:
    batch, epoch = parsed
    return batch, -1 if epoch is None else epoch


def prunable_snapshots(names: dict[str, bool], keep: int, protected: str | None) -> list[str]:
    """The snapshot directories to remove, oldest first, from ``names`` (directory name -> complete), the count to
    ``keep`` and the ``protected`` directory (the pre-copy's; None: none); see the module docstring. Incomplete
    snapshots and names that are not snapshot names are never listed. Pure: the decision alone."""
    parsed = {n: p for n, complete in names.items() if complete and (p := parse_snapshot_name(n)) is not None}
    newest_first = sorted(parsed, key=lambda n: _sort_key(parsed[n]), reverse=True)
    return [n for n in reversed(newest_first[keep:]) if n != protected]


def _precopy_dir_name(paths: ShardPaths) -> str | None:
    """The snapshot directory the pre-copy pointer names (``.../snapshots/<name>/manifest.json``), None without one."""
    if not paths.precopy.exists():
        return None
    pointer: Any = paths.precopy.read_json()
    manifest = pointer.get("manifest") if isinstance(pointer, dict) else None
    if not isinstance(manifest, str):
        return None
    parts = manifest.rstrip("/").split("/")
    return parts[-2] if len(parts) >= 2 else None


def prune_own_snapshots(paths: ShardPaths, keep: int, check_fence: Callable[[str], None]) -> list[str]:
    """Remove the snapshots of a running shard it no longer keeps (module docstring); returns the names removed.
    ``check_fence(what)`` raises when a newer runtime of the shard claimed it (called before anything goes).
    Idempotent: a crash part-way leaves directories the next start removes."""
    if paths.drained.exists() or not paths.snapshots.exists():
        return []
    dirs: dict[str, Loc] = {d.name: d for d in paths.snapshots.child_dirs()}
    names = {name: (d / "manifest.json").exists() for name, d in dirs.items()}
    remove = prunable_snapshots(names, keep, _precopy_dir_name(paths))
    if not remove:
        return []
    check_fence("pruning its older snapshots")
    for name in remove:
        dirs[name].rmtree()
    log.info(
        "shard %s: kept its newest %d snapshots (and a pre-copy in use); removed %s",
        paths.shard,
        keep,
        ", ".join(remove),
    )
    return remove
