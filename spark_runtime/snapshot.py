"""Drain manifests: what a drained shard leaves for its children, and how a child checks it can restore.

``manifest.json`` (written last, atomically, next to ``state/``)::

    {
      "version": 1,
      "task": "orders", "shard": "orders-0-128",
      "maxKeyGroups": 128, "keyGroups": {"start": 0, "end": 128},
      "batchId": 7,                                   # last committed batch (-1: none)
      "positions": {"p0.jsonl": 1234, ...},           # source end positions of that batch
      "source": {"kind": "journal", "path": "...", "partitions": 4},
      "processor": {"builtin": "count"},              # the shard's processor spec
      "stateFormat": "builtin-count/v1",              # restore only into the same format
      "stateSchema": "key string, value bigint",      # snapshot columns (key_group is the partition column)
      "snapshot": {"path": ".../state", "format": "parquet", "partitionColumn": "key_group",
                   "keyGroups": [3, 9, ...], "files": 57, "bytes": 81234},
      "checkpoint": ".../checkpoint",
      "parent": {"shard": "...", "manifest": "..."} | null,
      "deadLetters": 2,
      "createdAt": "2026-11-22T02:41:00Z"
    }
"""

from __future__ import annotations

import os
import time
from typing import Any

from spark_runtime.sources.seed import parquet_files, slice_dirs
from spark_runtime.storage import Loc, location

__all__ = ["MANIFEST_VERSION", "RestoreError", "check_restore", "load_manifest", "snapshot_stats", "utc_now"]

MANIFEST_VERSION = 1


class RestoreError(ValueError):
    """A child cannot restore from the named manifest (the message says why and what would be valid)."""


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_manifest(manifest: Loc | str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest at ``manifest`` (a :class:`Loc`, local path or ``s3a://`` URI with default settings)."""
    if not isinstance(manifest, Loc):
        manifest = location(manifest)
    if not manifest.is_file():
        raise RestoreError(
            f"restoreFrom.manifest: {manifest.uri()!r} does not exist; the parent has not finished draining "
            "(its manifest is written last)"
        )
    data = manifest.read_json()
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        raise RestoreError(f"restoreFrom.manifest: {manifest.uri()!r} is not a version-{MANIFEST_VERSION} manifest")
    return data


def check_restore(
    manifest: dict[str, Any],
    *,
    task: str,
    parent: str,
    max_key_groups: int,
    start: int,
    end: int,
    state_format: str,
    state_schema: str,
) -> None:
    """Raise :class:`RestoreError` unless a shard with these settings can restore from ``manifest``."""
    if manifest.get("task") != task:
        raise RestoreError(f"restoreFrom.manifest: belongs to task {manifest.get('task')!r}, not {task!r}")
    if manifest.get("shard") != parent:
        raise RestoreError(f"restoreFrom.parent: {parent!r} but the manifest is of shard {manifest.get('shard')!r}")
    if manifest.get("maxKeyGroups") != max_key_groups:
        raise RestoreError(
            f"maxKeyGroups: {max_key_groups} differs from the parent's {manifest.get('maxKeyGroups')} (immutable)"
        )
    kg = manifest.get("keyGroups") or {}
    if not (kg.get("start", 0) <= start and end <= kg.get("end", -1)):
        raise RestoreError(
            f"keyGroups: [{start}, {end}) is not inside the parent's range [{kg.get('start')}, {kg.get('end')})"
        )
    if manifest.get("stateFormat") != state_format or manifest.get("stateSchema") != state_schema:
        raise RestoreError(
            f"processor: the parent's state is {manifest.get('stateFormat')} ({manifest.get('stateSchema')}), this "
            f"shard's processor keeps {state_format} ({state_schema}); a split keeps the processor's state layout"
        )


def snapshot_stats(state_dir: Loc) -> dict[str, Any]:
    dirs = slice_dirs(state_dir, 0, 1 << 31)
    files = [f for d in dirs.values() for f in parquet_files(d)]
    import pyarrow.parquet as pq

    rows = sum(pq.read_metadata(f.path, filesystem=f.fs).num_rows for f in files)
    return {
        "keyGroups": sorted(dirs),
        "files": len(files),
        "bytes": sum(f.size() for f in files),
        "rows": rows,
    }
