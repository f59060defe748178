"""The key-group-indexed state snapshot: one home for its layout, its manifest and its export.

A snapshot is how state leaves a shard: a drain's savepoint, a split parent's pre-copy, the state its children
restore. Its files are Parquet partitioned by key group, so a child reads only its own key groups' files, and a
manifest written last lists every file with its size, rows and SHA-256, so a restore is verified, never trusted.

- :mod:`spark_runtime.snapshot.layout`: the directories (``state/key_group=<n>/``), listing a slice;
- :mod:`spark_runtime.snapshot.manifest`: the manifest's format, building it, the restore checks, verification;
- :mod:`spark_runtime.snapshot.export`: writing a snapshot of a committed batch with Spark's State Data Source.

Reading a slice back into a child's state store is the seed source's job (:mod:`spark_runtime.sources.seed`),
which lists the slice through :mod:`~spark_runtime.snapshot.layout`. Importing this package is cheap (the export,
which needs the shard's plan and a SparkSession, is imported from its module).
"""

from spark_runtime.snapshot.manifest import (
    MANIFEST_VERSION,
    RestoreError,
    build_manifest,
    check_restore,
    load_manifest,
    snapshot_stats,
    utc_now,
    verify_snapshot,
)

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
