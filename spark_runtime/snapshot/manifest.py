"""Snapshot manifests: what a drained shard leaves for its children, and how a child checks it can restore.

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
                   "keyGroups": [3, 9, ...], "files": 57, "bytes": 81234, "rows": 5000,
                   "keyGroupFiles": {"3": {"rows": 41, "files": {"part-0.parquet":
                                     {"bytes": 1422, "rows": 41, "sha256": "9f2c..."}}}, ...}},
      "checkpoint": ".../checkpoint",
      "parent": {"shard": "...", "manifest": "..."} | null,
      "parents": [{"shard": "...", "manifest": "..."}, ...],   # one (a split child) or two (a merge), or none
      "skip": [[end, [[partition, offset], ...]], ...] | null,   # SkipRule: rows the shard's state already has
      "deadLetters": 2,
      "createdAt": "2026-11-22T02:41:00Z"
    }

Verified restores: ``keyGroupFiles`` lists, per key group of the snapshot, every Parquet file with its size,
row count and SHA-256. Before it processes anything a child checks its slice against it
(:func:`verify_snapshot`): a key-group directory that is missing or not listed, a missing or extra part file, or
a file whose size or checksum differs refuses the restore (:class:`RestoreError`, reason ``SnapshotMismatch``,
naming the key group and the file; exit 2). A snapshot is never restored on trust.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from spark_runtime import protocol
from spark_runtime.snapshot.layout import PARTITION_COLUMN, parquet_files, slice_dirs
from spark_runtime.storage import Loc, location

__all__ = [
    "MANIFEST_VERSION",
    "RestoreError",
    "build_manifest",
    "check_restore",
    "load_manifest",
    "snapshot_stats",
    "utc_now",
    "verify_snapshot",
]

MANIFEST_VERSION = 2
"""Version 2 added ``snapshot.keyGroupFiles`` (verified restores); a child refuses any other version."""


class RestoreError(ValueError):
    """A child cannot restore from the named manifest (the message says why and what would be valid).
    ``reason`` goes into the termination message, and from there onto the TaskShard's Degraded condition."""

    def __init__(self, message: str, reason: str = "RestoreRefused") -> None:
        super().__init__(message)
        self.reason = reason


def utc_now() -> str:
    return protocol.rfc3339()


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
        raise RestoreError(
            f"restoreFrom.manifest: {manifest.uri()!r} is not a version-{MANIFEST_VERSION} manifest (version "
            f"{data.get('version') if isinstance(data, dict) else None!r}); a manifest without per-key-group "
            "checksums cannot be verified: drain the parent again with this runtime"
        )
    return data


def build_manifest(
    config: Any,
    plan: Any,
    *,
    batch_id: int,
    positions: dict[str, Any],
    source: dict[str, Any],
    state_dir: Loc,
    stats: dict[str, Any],
    checkpoint: str,
    dead_letters: int,
    writer_epoch: int | None,
    skip: list[Any] | None = None,
    watermark_ms: int | None = None,
) -> dict[str, Any]:
    """The manifest of the snapshot of committed ``batch_id`` in ``state_dir`` (the format above) for a shard
        with ``config`` (:class:`spark_runtime.config.ShardConfig`) and ``plan`` (:class:`spark_runtime.pipeline.Plan`);
        ``stats`` is :func:`snapshot_stats` of ``state_dir``; ``skip`` the shard's skip rule
        (:class:`spark_runtime.protocol.SkipRule` as JSON), which its children inherit; ``watermark_ms`` the event-time
    watermark after ``batch_id`` (None: no event time), below which no successor's watermark may start. Pure."""
    parent = config.restore_from
    return {
        "version": MANIFEST_VERSION,
        "task": config.task,
        "shard": config.shard,
        "maxKeyGroups": config.max_key_groups,
        "keyGroups": {"start": config.key_groups.start, "end": config.key_groups.end},
        "batchId": batch_id,
        "positions": positions,
        "source": source,
        "processor": config.processor.to_json_dict(),
        "stateFormat": plan.state_format,
        "stateSchema": plan.state_schema,
        "stateColumns": plan.schema.to_json() if plan.schema is not None else None,
        "snapshot": {"path": state_dir.uri(), "format": "parquet", "partitionColumn": PARTITION_COLUMN, **stats},
        "checkpoint": checkpoint,
        "parent": {"shard": parent.parent, "manifest": parent.manifest} if parent is not None else None,
        "parents": [{"shard": p.parent, "manifest": p.manifest} for p in config.parents],
        "skip": skip,
        "deadLetters": dead_letters,
        "createdAt": utc_now(),
        "writerEpoch": writer_epoch,
        "watermarkMs": watermark_ms,
    }


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
    schema: Any = None,
    check_processor: bool = True,
) -> Any:
    """Raise :class:`RestoreError` unless a shard with these settings can restore from ``manifest``. ``schema``: a
    Python processor's :class:`~spark_runtime.engine.schema.StateSchema`, which need only be a compatible successor
    of the parent's (:meth:`~spark_runtime.engine.schema.StateSchema.evolve`); returns it evolved from the parent's
    (None for the builtins). ``check_processor=False``: a child that committed batches of its own keeps state the
    parent's processor settings no longer describe (its own record is checked instead); only the lineage is."""
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
    if not check_processor:
        return None
    same_schema = schema is not None or manifest.get("stateSchema") == state_schema
    if manifest.get("stateFormat") != state_format or not same_schema:
        raise RestoreError(
            f"processor: the parent's state is {manifest.get('stateFormat')} ({manifest.get('stateSchema')}), this "
            f"shard's processor keeps {state_format} ({state_schema}); a split keeps the processor's state layout"
        )
    if schema is None:
        return None
    from spark_runtime.engine.schema import SchemaIncompatible

    try:
        return schema.evolve(manifest_state_schema(manifest))
    except SchemaIncompatible as exc:
        raise RestoreError(
            f"{exc} (the parent {manifest.get('shard')} kept {manifest.get('stateSchema')})",
            reason=protocol.STATE_SCHEMA_INCOMPATIBLE,
        ) from None


def manifest_state_schema(manifest: dict[str, Any]) -> Any:
    """The Python processor's state schema a manifest records (``stateColumns``; older manifests: the columns of
    ``stateSchema`` after ``key``)."""
    from spark_runtime.engine.schema import Column, StateSchema

    if manifest.get("stateColumns"):
        return StateSchema.from_json(manifest["stateColumns"])
    parts = [p.split() for p in str(manifest.get("stateSchema", "")).split(",") if p.strip()]
    return StateSchema(tuple(Column(n, t) for n, t in parts if n != "key"))


def snapshot_stats(state_dir: Loc) -> dict[str, Any]:
    """The manifest's ``snapshot`` figures of the snapshot in ``state_dir``: totals and ``keyGroupFiles`` (per
    key group its files with size, rows and SHA-256). Reads every file once (the checksum needs the bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    groups: dict[str, Any] = {}
    for kg, directory in slice_dirs(state_dir, 0, 1 << 31).items():
        files: dict[str, Any] = {}
        for f in sorted(parquet_files(directory), key=lambda f: f.name):
            data = f.read_bytes()
            rows = pq.read_metadata(pa.BufferReader(data)).num_rows
            files[f.name] = {"bytes": len(data), "rows": rows, "sha256": hashlib.sha256(data).hexdigest()}
        groups[str(kg)] = {"rows": sum(m["rows"] for m in files.values()), "files": files}
    every = [m for g in groups.values() for m in g["files"].values()]
    return {
        "keyGroups": sorted(int(kg) for kg in groups),
        "files": len(every),
        "bytes": sum(m["bytes"] for m in every),
        "rows": sum(m["rows"] for m in every),
        "keyGroupFiles": groups,
    }


def verify_snapshot(manifest: dict[str, Any], state_dir: Loc, start: int, end: int) -> dict[str, int]:
    """Check the key groups ``[start, end)`` of the snapshot in ``state_dir`` against ``manifest``'s
    ``keyGroupFiles``; raise :class:`RestoreError` (reason ``SnapshotMismatch``, the key group and file named)
    for a missing or unlisted key-group directory, a missing or extra part file, or a size or SHA-256 that
    differs. Returns ``{"keyGroups", "files", "bytes"}`` verified."""
    listed = (manifest.get("snapshot") or {}).get("keyGroupFiles")
    where = state_dir.uri()
    if not isinstance(listed, dict):
        raise RestoreError(f"snapshot: the manifest lists no files per key group for {where}", "SnapshotMismatch")
    want = {int(kg): group for kg, group in listed.items() if start <= int(kg) < end}
    found = slice_dirs(state_dir, start, end)

    def refuse(kg: int, what: str) -> RestoreError:
        return RestoreError(
            f"snapshot: key group {kg} of {where} does not match the parent's manifest: {what}; the snapshot was "
            "changed or lost after the parent wrote it (storage lifecycle rules, a wrong volume), so restoring "
            "it would give wrong state",
            "SnapshotMismatch",
        )

    verified = {"keyGroups": 0, "files": 0, "bytes": 0}
    for kg in sorted(set(want) | set(found)):
        if kg not in found:
            raise refuse(kg, f"its directory key_group={kg} is missing ({len(want[kg]['files'])} files listed)")
        if kg not in want:
            raise refuse(kg, f"its directory key_group={kg} exists but the manifest lists no state for it")
        files = {f.name: f for f in parquet_files(found[kg])}
        expected = want[kg]["files"]
        if set(files) != set(expected):
            missing, extra = sorted(set(expected) - set(files)), sorted(set(files) - set(expected))
            raise refuse(kg, f"missing files {missing}, files not in the manifest {extra}")
        for name, meta in sorted(expected.items()):
            data = files[name].read_bytes()
            if len(data) != meta["bytes"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise refuse(kg, f"file {name} has {len(data)} bytes and another checksum (listed: {meta['bytes']})")
            verified["files"] += 1
            verified["bytes"] += len(data)
        verified["keyGroups"] += 1
    return verified
