"""Writing a key-group-indexed snapshot of a shard's state, and its manifest.

A snapshot of committed batch ``N`` is ``snapshots/batch-N.<epoch>/`` in the shard's directory
(:class:`spark_runtime.layout.ShardPaths`), written (and, for a partial export of a crashed run, removed) only by
the runtime holding that writer epoch, so a fenced runtime can never empty a directory a successor restores::

    state/key_group=<n>/*.parquet     the state rows of key group n (:mod:`spark_runtime.snapshot.layout`)
    manifest.json                     written last, exclusively: its presence marks the snapshot complete

Two callers: a drain (steps 5-6 of :mod:`spark_runtime.shard`) and a parent's pre-copy while its query runs
(:mod:`spark_runtime.handover`). Both go through :meth:`SnapshotWriter.write`, which is idempotent: an existing
manifest is returned as it is, and a partial export of a crashed run is removed before the export starts again.

The state comes from Spark's State Data Source (``format("statestore")``) at the committed batch, so the
export reads what Spark's own recovery would restore. A shard that never committed a batch (``N = -1``) holds
the seed: a restored child copies its slice of the parent's snapshot files, a fresh shard writes none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_runtime import faults
from spark_runtime.checkpoint import next_watermark_ms
from spark_runtime.config import ShardConfig
from spark_runtime.pipeline import Plan, key_group_column
from spark_runtime.snapshot.layout import PARTITION_COLUMN, key_group_dir, parquet_files, slice_dirs
from spark_runtime.snapshot.manifest import build_manifest, snapshot_stats
from spark_runtime.storage import Loc, location

if TYPE_CHECKING:
    from spark_runtime.progress import Progress
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = ["SnapshotWriter", "final_watermark_ms", "count_state_rows", "export_state", "state_rows"]


def final_watermark_ms(plan: Any, checkpoint: Loc, batch_id: int) -> int | None:
    """The watermark after committed ``batch_id`` (the commit log's, never below the shard's own floor); None
    without event time. Its successors start at no lower one (docs/split-protocol.md, "Time across hand-overs")."""
    if plan.event_time is None:
        return None
    return max(next_watermark_ms(checkpoint, batch_id), plan.watermark_floor_ms)


class SnapshotWriter:
    """Writes the snapshots of one shard: from its I/O (the fence is checked before the manifest), its run
    state (the plan; the restore: the seed of a child that never committed, and the skip rule its manifests carry
    on), its progress (positions and dead letters) and ``session()``."""

    def __init__(self, io: ShardIO, state: RunState, progress: Progress, session: Callable[[], Any]) -> None:
        self.io = io
        self.state = state
        self.progress = progress
        self.session = session

    def write(self, batch_id: int, *, in_drain: bool = False) -> tuple[dict[str, Any], Loc]:
        """Export the state of committed ``batch_id``, then write the manifest. Returns the manifest and where it
        is. A complete snapshot of the batch that exists already (this epoch's, else the latest epoch's: each is
        written and removed by its own epoch's runtime alone, so a complete one never changes) is returned as it
        is. ``in_drain``: a drain's export (only that one has crash points, :mod:`spark_runtime.faults`)."""
        r, plan, restore = self.io, self.state.plan, self.state.restore
        epoch = r.fence.epoch
        complete = r.paths.complete_snapshots(batch_id)
        if complete:
            found = complete.get(epoch) or complete[max(complete, key=lambda e: -1 if e is None else e)]
            return found.read_json(), found
        manifest_path = r.paths.manifest(batch_id, epoch)
        state_dir = r.paths.state_dir(batch_id, epoch)
        self._export(batch_id, r.paths.snapshot_dir(batch_id, epoch), state_dir, in_drain=in_drain)
        if in_drain:
            faults.crash_point("exported")
        positions = self.progress.positions_at(batch_id)
        r.source.validate_positions(positions)
        cfg = r.config
        manifest = build_manifest(
            cfg,
            plan,
            batch_id=batch_id,
            positions=positions,
            source=r.source.describe(),
            state_dir=state_dir,
            stats=snapshot_stats(state_dir),
            checkpoint=r.paths.checkpoint.uri(),
            dead_letters=self.progress.dead_letter_total(),
            writer_epoch=r.fence.epoch,
            skip=restore.skip.to_json() if restore is not None and restore.skip is not None else None,
            watermark_ms=final_watermark_ms(plan, r.paths.checkpoint, batch_id),
        )
        r.fence.check(f"the manifest of snapshot {batch_id}")
        if not manifest_path.create_exclusive_json(manifest):  # another export of this batch finished first
            return manifest_path.read_json(), manifest_path
        return manifest, manifest_path

    def _export(self, batch_id: int, snap_dir: Loc, state_dir: Loc, *, in_drain: bool) -> None:
        """Write the state of committed ``batch_id`` into ``state_dir`` (in place: the manifest, written after,
        marks it complete; a partial export of a crashed drain is removed first)."""
        r, plan, restore = self.io, self.state.plan, self.state.restore
        mid_export = "mid-export" if in_drain else None
        snap_dir.rmtree()
        if batch_id >= 0:
            spark = self.session()
            if mid_export is None:
                export_state(spark, r.config, plan, r.paths.checkpoint, batch_id, state_dir)
                return
            # Crash tests: die as soon as Spark has written part of the state (else right after the export).
            with faults.crash_when(mid_export, lambda: faults.export_in_progress(state_dir), "part of it written"):
                export_state(spark, r.config, plan, r.paths.checkpoint, batch_id, state_dir)
            faults.crash_point(mid_export, "the export finished before a part of it was seen")
            return
        state_dir.mkdir()
        if restore is None:
            return
        for part in restore.slices:  # never ran a batch: the state is still the seed (its parents' slices)
            parent_state = location(part.manifest["snapshot"]["path"], r.s3)
            for kg, directory in slice_dirs(parent_state, part.start, part.end).items():
                for f in parquet_files(directory):
                    f.copy_to(key_group_dir(state_dir, kg) / f.name)
                    if mid_export is not None:
                        faults.crash_point(mid_export, f"{f.name} of key group {kg} copied")


def export_state(spark: Any, config: ShardConfig, plan: Plan, checkpoint: Any, batch_id: int, out_dir: Any) -> None:
    """Write the state at committed ``batch_id`` as Parquet partitioned by ``key_group`` into ``out_dir``
    (which must not exist). Reads the checkpoint with Spark's State Data Source; key groups are computed
    natively from the key. ``checkpoint`` and ``out_dir`` are local paths or :class:`~spark_runtime.storage.Loc`
    (their string form is what Spark gets: a path or an ``s3a://`` URI)."""
    from pyspark.sql import functions as F

    rows = state_rows(spark, config, plan, checkpoint, batch_id)
    rows.repartition(F.col(PARTITION_COLUMN)).write.partitionBy(PARTITION_COLUMN).mode("error").parquet(str(out_dir))


def count_state_rows(spark: Any, config: ShardConfig, plan: Plan, checkpoint: Any, batch_id: int) -> dict[int, int]:
    """State rows per key group at committed ``batch_id`` (key groups without state are absent): the rows
    :func:`export_state` would write, counted instead of written."""
    counts = state_rows(spark, config, plan, checkpoint, batch_id).groupBy(PARTITION_COLUMN).count().collect()
    return {int(row[PARTITION_COLUMN]): int(row["count"]) for row in counts}


def state_rows(spark: Any, config: ShardConfig, plan: Plan, checkpoint: Any, batch_id: int) -> Any:
    """The state at committed ``batch_id`` as a DataFrame of snapshot rows (``key``, the plan's state columns and
    the ``key_group`` partition column), read with Spark's State Data Source."""
    from pyspark.sql import functions as F

    if plan.kind == "python" and plan.layout == "runs":
        return _runs_rows(spark, plan, checkpoint, batch_id)
    st = spark.read.format("statestore").option("batchId", batch_id).load(str(checkpoint))
    if plan.window is not None:
        from spark_runtime.windows import window_state_rows

        return window_state_rows(st, config, key_group_column(config))
    if plan.kind == "builtin":
        value_field = st.schema["value"].dataType.fields[0].name
        value = F.col(f"value.`{value_field}`").alias("value")
        if config.key_grouping.nested:  # the state key carries the group (it depends on the record's partition)
            return st.select(
                F.col("key.key").alias("key"), value, F.col("key.key_group").cast("int").alias(PARTITION_COLUMN)
            )
        rows = st.select(F.col("key.key").alias("key"), value)
        return rows.withColumn(PARTITION_COLUMN, key_group_column(config))
    blobs = st.select(F.col("key.key_group").alias(PARTITION_COLUMN), _blob_column(st).alias("blob"))
    schema = f"{plan.state_schema}, {PARTITION_COLUMN} int"
    return blobs.mapInArrow(_explode_blobs_function(plan), schema)


def _runs_rows(spark: Any, plan: Plan, checkpoint: Any, batch_id: int) -> Any:
    """The runs layout's state rows at ``batch_id``: each bucket's runs (State Data Source, variable ``runs``) merged
    newest first, without tombstones and rows expired at the batch's timestamp; each row's key group is its
    ``_kg``."""
    from pyspark.sql import functions as F

    from spark_runtime.checkpoint import batch_metadata
    from spark_runtime.engine.stateful import RUNS_VAR

    now_ms = int(batch_metadata(checkpoint, batch_id).get("batchTimestampMs", 0)) if plan.ttl_ms else None
    st = (
        spark.read.format("statestore")
        .option("batchId", batch_id)
        .option("stateVarName", RUNS_VAR)
        .load(str(checkpoint))
    )
    runs = st.select(F.col("key.bucket").cast("int").alias("bucket"), F.col("user_map_value.data").alias("data"))
    return runs.groupBy("bucket").applyInArrow(_merge_runs_function(plan, now_ms), snapshot_ddl(plan))


def snapshot_ddl(plan: Plan) -> str:
    """The snapshot rows' schema: ``key``, the state columns (and ``_expires`` with a TTL), ``key_group``."""
    from spark_runtime.engine.runs import EXPIRES

    expires = f", {EXPIRES} bigint" if plan.ttl_ms else ""
    return f"{plan.state_schema}{expires}, {PARTITION_COLUMN} int"


def _merge_runs_function(plan: Plan, now_ms: int | None) -> Any:
    schema_json = plan.schema.to_json() if plan.schema is not None else {}
    ttl = plan.ttl_ms is not None

    def merge(key: Any, table: Any) -> Any:
        from spark_runtime.engine.runs import EXPIRES, GROUP, KEY, Run, merge_runs
        from spark_runtime.engine.schema import StateSchema

        schema = StateSchema.from_json(schema_json)
        target = schema.run_schema(ttl=ttl)
        runs = sorted((Run.from_buffer(b) for b in table.column("data").to_pylist()), key=lambda r: -r.seq)
        merged = merge_runs(runs, target, oldest=True, now_ms=now_ms, conform=lambda t: schema.conform(t, target))
        names = [KEY] + schema.names + ([EXPIRES] if ttl else []) + [GROUP]
        return merged.table.select(names).rename_columns(names[:-1] + [PARTITION_COLUMN])

    return merge


def _blob_column(st: Any) -> Any:
    """The binary state column of the applyInPandasWithState state row (its layout varies by state format)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StructType

    def find(dtype: Any, path: str) -> str | None:
        if isinstance(dtype, BinaryType):
            return path
        if isinstance(dtype, StructType):
            for f in dtype.fields:
                hit = find(f.dataType, f"{path}.`{f.name}`")
                if hit:
                    return hit
        return None

    path = find(st.schema["value"].dataType, "value")
    if path is None:
        raise RuntimeError(f"no binary state column in the state store value {st.schema['value'].dataType}")
    return F.col(path)


def _explode_blobs_function(plan: Plan) -> Any:
    def explode(batches: Any) -> Any:
        import pyarrow as pa

        from spark_runtime import processor as P

        for batch in batches:
            kgs = batch.column(PARTITION_COLUMN).to_pylist()
            blobs = batch.column("blob").to_pylist()
            for kg, blob in zip(kgs, blobs, strict=True):
                if blob is None:
                    continue
                table = P.decode_state_table(blob)
                table = table.append_column(PARTITION_COLUMN, pa.array([kg] * table.num_rows, pa.int32()))
                yield from table.to_batches()

    return explode
