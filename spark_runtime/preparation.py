"""What a shard runtime settles before Spark starts its query (:meth:`spark_runtime.shard.ShardRunner.prepare`),
each step over the shard's typed state (:mod:`spark_runtime.shard_state`):

- :func:`claim_shard`: the shard's next writer epoch, then the recovery log checked and stale markers removed;
- :func:`check_recovery_log`: a shard the operator saw commit refuses a recovery log that ends earlier;
- :func:`check_state_committed`: a recovery log whose last committed batch has no state is refused at every query
  start (``CheckpointInconsistent``), never resumed into a crash loop;
- :func:`settle_restore`: a split or merged child's verified restore plan (recorded before its first batch; after
  it, read from the record, never from its parents' storage again), its start positions and its watermark floor;
- :func:`settle_state_schema` and :func:`settle_time_mode`: a Python processor's state schema and Spark time mode,
  checked against what its state was written with, and recorded; :func:`settle_record_layout`: its state layout;
- :func:`write_lineage`: ``lineage.json``, where the shard came from and where it writes;
- :func:`stream_context`: what the source's stream is built with at each query start.

Each raises before anything is processed, and each is idempotent (a restart repeats it).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from spark_runtime.checkpoint import last_committed_batch, uncommitted_state
from spark_runtime.problems import EnvironmentProblem, TemplateRefused
from spark_runtime.protocol import STATE_SCHEMA_INCOMPATIBLE, TIME_MODE_CHANGED, MergeCatchUpState
from spark_runtime.sink import DirectorySinkWriter
from spark_runtime.snapshot import utc_now
from spark_runtime.snapshot.restore import plan_restore, recorded_plan
from spark_runtime.snapshot.retention import prune_own_snapshots
from spark_runtime.sources import SourceContext

if TYPE_CHECKING:
    from spark_runtime.handover import ChildHandover
    from spark_runtime.merge import MergeHandover
    from spark_runtime.shard_state import RunState, ShardIO

log = logging.getLogger("taskshard.shard")

__all__ = [
    "CHECKPOINT_INCONSISTENT",
    "check_recovery_log",
    "check_state_committed",
    "claim_shard",
    "describe_start",
    "settle_record_layout",
    "settle_restore",
    "settle_state_schema",
    "settle_time_mode",
    "stream_context",
    "write_lineage",
]


def claim_shard(io: ShardIO) -> None:
    """The first writes of a start: claim the shard's next writer epoch (a runtime still writing this shard is
    fenced from here on; a directory sink's pending batches go to a directory of this epoch's own), check the
    recovery log, remove a stale ready file (a container restarted in place keeps /tmp: not emitting until this
    run does) and the marker of an interrupted SIGTERM stop (the shard resumes), and prune the shard's own older
    snapshots (:mod:`spark_runtime.snapshot.retention`)."""
    cfg = io.config
    io.fence.claim()
    io.metrics.set_writer_epoch(io.fence.epoch)
    if isinstance(io.sink, DirectorySinkWriter):
        io.sink.epoch = io.fence.epoch
    check_recovery_log(io)
    for stale in (cfg.ready_file, cfg.heartbeat_file):
        if stale:
            Path(stale).unlink(missing_ok=True)
    io.paths.shard_dir.mkdir()
    marker = io.paths.drain_marker
    if marker.exists() and marker.read_text().startswith("stop"):
        log.info("shard %s: an earlier SIGTERM stop was interrupted; resuming", cfg.shard)
        marker.unlink()
    prune_own_snapshots(io.paths, cfg.snapshots_kept, io.fence.check)


def check_recovery_log(io: ShardIO) -> None:
    """A shard the operator has seen commit batch N (``expectedBatch``) refuses to start from a recovery log
    that ends before N, missing (a wrong volume, a lifecycle rule) or older: it would silently start over
    and lose or recount what batches up to N did. Raises :class:`EnvironmentProblem` ``RecoveryLogMissing``
    (exit 3, the reason on the TaskShard) unless the user allowed a fresh start."""
    cfg = io.config
    if cfg.expected_batch is None or cfg.allow_fresh_start:
        return
    found = last_committed_batch(io.paths.checkpoint)
    if found >= cfg.expected_batch:
        return
    where = "is missing" if found < 0 else f"ends at batch {found}"
    raise EnvironmentProblem(
        "RecoveryLogMissing",
        "expectedBatch",
        f"the recovery log {io.paths.checkpoint} {where}, but batch {cfg.expected_batch} was committed "
        "before (the TaskShard's status.lastCheckpoint): starting over would lose or recount what those "
        "batches did. Restore the storage, or annotate the TaskShard taskshard.io/allow-fresh-start=true to "
        "start it over from its source's start positions on purpose",
    )


CHECKPOINT_INCONSISTENT = "CheckpointInconsistent"
"""The reason of a recovery log whose commit log is ahead of its state (:func:`check_state_committed`)."""


def check_state_committed(io: ShardIO) -> None:
    """Before every query start (pod start and in-process restart): the last committed batch's state versions
    exist (:func:`spark_runtime.checkpoint.uncommitted_state`). Spark records a batch in its commit log even when
    a state store did not commit it (``STATE_STORE_COMMIT_VALIDATION_FAILED``: a batch that did not execute its
    stateful plan in full); resuming would fail on every start looking for the missing version. Raises
    :class:`EnvironmentProblem` ``CheckpointInconsistent`` naming the batch and the version (exit 3, the reason on
    the TaskShard; docs/design-contracts.md, "State check", says how to recover)."""
    gap = uncommitted_state(io.paths.checkpoint)
    if gap is None:
        return
    raise EnvironmentProblem(
        CHECKPOINT_INCONSISTENT,
        "status.lastCheckpoint",
        f"the recovery log {io.paths.checkpoint} is inconsistent: {gap.describe()}. Resuming would fail on every "
        f"start; nothing was processed. To replay batch {gap.batch} from its offsets, remove commits/{gap.batch} "
        f"(and offsets/ files above {gap.batch}) from the recovery log (docs/design-contracts.md, 'State check')",
    )


def settle_restore(io: ShardIO, run: RunState, child: ChildHandover | MergeHandover | None) -> None:
    """A split or merged child's restore (its parents' manifests, slices and positions, verified:
    :func:`spark_runtime.snapshot.restore.plan_restore`; on standby until the parents answer), its start positions,
    and a watermark floor no lower than the parents' final watermark; nothing for any other shard. The plan is
    recorded (fence-checked) in the shard's ``restore-plan.json``; a start after the shard's first commit takes it
    from there (:func:`spark_runtime.snapshot.restore.recorded_plan`), so a successor whose parents' snapshots
    were pruned by history retention still resumes."""
    run.restore = None
    if child is None:
        return
    committed = last_committed_batch(io.paths.checkpoint)
    record = io.paths.restore_plan
    manifests = child.manifests()  # on standby until the parents answer; a resumed catch-up's own state
    restore = recorded_plan(record, committed, manifests, io.s3, io.paths.restore_report_dir)
    if restore is not None:
        log.info("shard %s: resuming with the restore plan it recorded at its first start", io.config.shard)
    else:
        restore = plan_restore(
            io.config,
            run.plan,
            io.source,
            manifests,
            io.s3,
            io.paths.restore_report_dir,
            resumed=committed >= 0,
        )
        if not record.exists() or record.read_json() != restore.to_json():
            io.fence.check("recording its restore plan")
            record.write_json(restore.to_json())
    run.restore = restore
    run.start_positions = restore.start_positions
    if run.plan.event_time is not None:
        floor = max(int(p.manifest.get("watermarkMs") or 0) for p in restore.slices)
        run.plan = dataclasses.replace(run.plan, watermark_floor_ms=floor)


def settle_record_layout(io: ShardIO, run: RunState) -> None:
    """A Python processor's state layout, recorded before its first batch (:func:`spark_runtime.engine.record_layout`;
    a resumed shard keeps the one its checkpoint holds); nothing for a builtin processor."""
    if run.plan.kind != "python":
        return
    from spark_runtime.engine import record_layout

    chosen = record_layout(io.paths.state_layout, last_committed_batch(io.paths.checkpoint), run.plan.state_buckets)
    run.plan = dataclasses.replace(run.plan, layout=chosen.layout, state_buckets=chosen.buckets)


def settle_state_schema(io: ShardIO, run: RunState) -> None:
    """The Python processor's state schema, checked against the one its state was written with before anything
    runs (rules: :mod:`spark_runtime.engine.schema`): a resumed shard's against ``state-schema.json``, a restored
    child's (before its first batch) against its parents' manifests (:func:`plan_restore`); recorded, with the
    retired names, in ``state-schema.json``. Raises :class:`TemplateRefused` (``StateSchemaIncompatible``)."""
    from spark_runtime.engine.schema import SchemaIncompatible, StateSchema

    record = io.paths.state_schema
    recorded = StateSchema.from_json(record.read_json()) if record.exists() else None
    committed = last_committed_batch(io.paths.checkpoint)
    wanted = run.plan.schema
    assert wanted is not None
    if committed < 0:  # no state of its own yet: a fresh shard, or a child whose state is its parents' slices
        effective = run.restore.schema if run.restore is not None else wanted
    else:
        try:
            effective = wanted.evolve(recorded)
        except SchemaIncompatible as exc:
            raise TemplateRefused(
                STATE_SCHEMA_INCOMPATIBLE,
                "processor.python",
                f"{exc}; the shard keeps its state and stays stopped until the Task's template changes",
            ) from None
    if recorded is None or recorded.to_json() != effective.to_json():
        io.fence.check("recording its state schema")
        record.write_json(effective.to_json())
    run.plan = dataclasses.replace(run.plan, schema=effective)


def settle_time_mode(io: ShardIO, run: RunState) -> None:
    """The checkpoint's ``timeMode`` (:attr:`spark_runtime.pipeline.Plan.time_mode`), recorded in
    ``time-mode.json`` at the first start (a checkpoint without the record predates time: ``None``). Spark
    refuses another one on restart, after the query started; this refuses it before anything runs.
    Raises :class:`TemplateRefused` (``TimeModeChanged``)."""
    record = io.paths.time_mode
    committed = last_committed_batch(io.paths.checkpoint)
    recorded = record.read_json()["timeMode"] if record.exists() else ("None" if committed >= 0 else None)
    wanted = run.plan.time_mode
    if recorded is not None and recorded != wanted:
        raise TemplateRefused(
            TIME_MODE_CHANGED,
            "processor.python",
            f"this shard's state was written in Spark's timeMode {recorded}, and the processor's timers and the "
            f"Task's eventTime now ask for {wanted}, which Spark cannot change in a checkpoint; go back to the "
            "processor's former timers (and eventTime), or run the new processor as a new Task. The shard "
            "keeps its state and stays stopped until the Task's template changes",
        )
    if not record.exists():
        io.fence.check("recording its time mode")
        record.write_json({"timeMode": wanted})


def write_lineage(io: ShardIO, run: RunState) -> None:
    """``lineage.json``: the shard's range, its parents, the manifest it restored and where it writes (rewritten
    only when one of those changed, with a new ``createdAt``)."""
    cfg, restore = io.config, run.restore
    lineage = {
        "task": cfg.task,
        "shard": cfg.shard,
        "keyGroups": {"start": cfg.key_groups.start, "end": cfg.key_groups.end},
        "maxKeyGroups": cfg.max_key_groups,
        "parent": cfg.restore_from.parent if cfg.restore_from else None,
        "parents": [p.parent for p in cfg.parents],
        "restoreManifest": restore.manifest_uri if restore is not None else None,
        "parentBatchId": restore.slices[0].manifest["batchId"] if restore is not None else None,
        "sink": io.sink_description(),
    }
    path = io.paths.lineage
    if path.exists():
        old = path.read_json()
        if {k: old.get(k) for k in lineage} == lineage:
            return
    path.write_json({**lineage, "createdAt": utc_now()})


def describe_start(io: ShardIO, run: RunState, last_committed: int) -> str:
    """How a query start is logged: the Task, the range, the processor, the source, and whether the shard resumed,
    was restored or starts fresh."""
    cfg, restore = io.config, run.restore
    if last_committed >= 0:
        how = f"resumed after batch {last_committed}"
    else:
        how = f"restored from {restore.manifest_uri}" if restore is not None else "fresh"
    kg = cfg.key_groups
    return (
        f"task={cfg.task} keyGroups=[{kg.start}, {kg.end}) processor={run.plan.state_format} "
        f"source={io.source.kind} {how}"
    )


def stream_context(io: ShardIO, run: RunState, child: ChildHandover | MergeHandover | None) -> SourceContext:
    """What the source's stream is built with at each query start: the shard's range and record spec, where its
    dead letters go, its start positions, the trigger limits (``spark.taskshard.*`` conf), a catching-up child's
    ``catch-up.json``, a merged child's skip rule, and the next writer epoch's file (once it exists the source
    admits nothing: the runtime was fenced)."""
    cfg, conf, epoch = io.config, io.config.spark.conf, io.fence.epoch
    merged = child.state if child is not None and isinstance(child.state, MergeCatchUpState) else None
    return SourceContext(
        shard=cfg.shard,
        max_key_groups=cfg.max_key_groups,
        range_start=cfg.key_groups.start,
        range_end=cfg.key_groups.end,
        record_spec=run.plan.record_spec,
        dead_letter_dir=io.dead_letter_dir,
        drain_marker=io.paths.drain_marker,
        start_positions=run.start_positions,
        max_bytes_per_trigger=int(conf.get("spark.taskshard.maxBytesPerTrigger", "0")) or None,
        partition_bytes=int(conf.get("spark.taskshard.partitionBytes", str(32 * 1024 * 1024))),
        max_records_per_trigger=int(conf.get("spark.taskshard.maxRecordsPerTrigger", "0")) or None,
        grouping=cfg.key_grouping,
        read_partitions=cfg.partitions_to_read,
        catch_up_state=io.paths.catch_up if child is not None and child.state else None,
        held_boundary=merged.boundary if merged is not None else None,
        skip=run.restore.skip if run.restore is not None else None,
        fenced_by=io.paths.epoch(epoch + 1) if epoch is not None else None,
    )
