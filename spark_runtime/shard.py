"""One shard's life: start (fresh, restored from a parent's manifest, or resumed from its own recovery log),
process micro-batches, and drain.

Lifecycle::

    start ──> running ──(every key group has a ready child | drain())──> draining ──> drained (exit 0, final)
      │          │  └──(SIGTERM alone)──> stopping ──> stopped (exit 0; a restart resumes)  ▲
      │          └──(query fails)──> failed (exit 1; the pod restarts it from the recovery log)
      └──(drained.json exists: this shard drained before)────────────────────────────────┘ (re-report)

Splits are :mod:`spark_runtime.handover`'s: a split child whose ``restoreFrom.manifest`` names its parent's
drain summary starts on **standby** while the parent keeps processing. A child of a source that can cap its
reads (the journal) asks the parent for a pre-copy snapshot, restores it and catches up on its slice without
emitting; a child of any other source (Kafka) warms up and waits. Once every key group has a ready child the
parent drains finally and the children take over from its final positions. The runner only calls the hand-over
(:meth:`ShardRunner.follow_split` in its poll loop, :meth:`ShardRunner.write_snapshot` for the pre-copy, and the
emission rule in ``foreachBatch``). A SIGTERM on standby exits 0 (event ``stopped``, nothing processed).

A *final* drain (a split's hand-over) is sticky: the shard never processes again, because its children own its
key groups from then on. A SIGTERM on its own (pod deletion for a template roll, a node drain, an eviction) runs
the same steps 1-6 (a savepoint snapshot and manifest) but is not final: step 7 writes no ``drained.json`` and
removes the drain marker, so the next pod resumes from the recovery log (and a hand-over in progress goes on).

Recovery: the Spark checkpoint is the recovery log. A restart with the same config (after SIGKILL, OOM, node
loss) resumes from the last committed batch: an uncommitted batch is replayed with the offsets Spark logged for
it, against the state of the previous commit, and its sink file is rewritten with the same content.

Drain (:meth:`ShardRunner.drain`): :mod:`spark_runtime.drain` (the steps and what a crash in each leaves
behind). Snapshots: :mod:`spark_runtime.snapshot`. Batches, positions and ``progress.json``:
:mod:`spark_runtime.progress`. The runner itself is the supervisor: it prepares the start, starts the query
(and restarts it in-process from the recovery log after a transient failure), polls, and calls those in turn.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_runtime import faults
from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.config import ConfigError, ShardConfig
from spark_runtime.drain import Drain
from spark_runtime.fencing import WriterFenced
from spark_runtime.handover import ChildHandover, ParentHandover, StandbyCalls, StandbyStopped, own_drain_summary
from spark_runtime.live import METRICS_HOST_ENV
from spark_runtime.logs import set_phase as set_log_phase
from spark_runtime.merge import MergeHandover
from spark_runtime.metrics import TRIGGER_POLL_SECONDS
from spark_runtime.pipeline import build_output_frame, results_past_fence
from spark_runtime.problems import EnvironmentProblem, TemplateRefused
from spark_runtime.progress import Progress
from spark_runtime.protocol import (
    STATE_SCHEMA_INCOMPATIBLE,
    TIME_MODE_CHANGED,
    Emission,
    HandoverMode,
    StandbyStopSummary,
)
from spark_runtime.shard_state import open_shard
from spark_runtime.sink import DirectorySinkWriter
from spark_runtime.snapshot import utc_now
from spark_runtime.snapshot.export import SnapshotWriter
from spark_runtime.snapshot.restore import plan_restore
from spark_runtime.sources import (
    ChecksEnvironment,
    GuardsBatches,
    ReadsRanges,
    SourceContext,
)
from spark_runtime.state_map import StateMapper
from spark_runtime.storage import Loc
from spark_runtime.windows import WindowLateFinder, output_mode

__all__ = ["ShardFailed", "ShardRunner", "StandbyStopped", "summary_message"]

log = logging.getLogger("taskshard.shard")

SPARK_BETWEEN_TRIGGERS = ("Waiting for data to arrive", "Waiting for next trigger")
"""``query.status["message"]`` between triggers; with ``isDataAvailable`` false, the last trigger found nothing new
in the sources (not at start: "Initializing sources")."""
RESTART_BACKOFF_SECONDS = 2.0
IN_PROCESS_RESTARTS = 3
"""How often a failed query is restarted in-process (from its checkpoint) before the shard gives up (exit 1)."""
GUARD_INTERVAL_SECONDS = 10.0
"""How often ``poll()`` asks a guarding source (:class:`~spark_runtime.sources.GuardsBatches`) whether its mapping
still holds while no batch runs (Kafka ``assign`` never sees an added partition, so no batch would notice)."""
FENCE_POLL_SECONDS = 1.0
"""How often an idle runtime looks for a later writer epoch (a stat); a fenced one stops and exits."""
FENCE_POLL_SECONDS_S3 = 5.0
"""The same on S3 (a HEAD request)."""
S3_LIST_INTERVAL_SECONDS = 5.0
"""With storage on S3, how often ``poll()`` lists the commit log when no new batch was reported."""
TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""


class ShardFailed(RuntimeError):
    """The streaming query failed; the message holds Spark's error, or the processor's (``reason``
    ``ProcessorFailed``, ``field`` ``processor.python``)."""

    def __init__(self, message: str, reason: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


def summary_message(summary: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """The termination message: compact JSON of ``summary``, dropping ``positions`` (they are in the
    manifest) and then truncating ``error`` when it would not fit in ``limit`` bytes."""

    def dump(obj: dict[str, Any]) -> str:
        return json.dumps(obj, separators=(",", ":"), sort_keys=True)

    text = dump(summary)
    if len(text.encode()) <= limit:
        return text
    slim = {k: v for k, v in summary.items() if k != "positions"}
    if "positions" in summary:
        slim["positionsOmitted"] = True
    text = dump(slim)
    while len(text.encode()) > limit and slim.get("error"):
        error = str(slim["error"])
        slim["error"] = error[: max(0, len(error) - max(64, len(text.encode()) - limit))]
        text = dump(slim)
    return text


def _io_field(name: str) -> Any:
    """A read-only view of ``runner.io.<name>`` (:class:`~spark_runtime.shard_state.ShardIO`)."""
    return property(lambda runner: getattr(runner.io, name), doc=f"``io.{name}``")


def _state_field(name: str) -> Any:
    """A view of ``runner.state.<name>`` (:class:`~spark_runtime.shard_state.RunState`)."""
    return property(
        lambda runner: getattr(runner.state, name),
        lambda runner, value: setattr(runner.state, name, value),
        doc=f"``state.{name}``",
    )


class ShardRunner:
    """Runs one shard. ``run()`` blocks until drained; tests may use ``start()``/``poll()``/``drain()``. Its state is
    typed and grouped (:mod:`spark_runtime.shard_state`): ``io`` (fixed) and ``state`` (learnt while running),
    which its collaborators share; the attributes below are views of them."""

    config, s3, storage, paths, fence, source, sink = map(
        _io_field, ("config", "s3", "storage", "paths", "fence", "source", "sink")
    )
    sink_paths, dead_letter_dir, dead_letters, late_letters, metrics = map(
        _io_field, ("sink_paths", "dead_letter_dir", "dead_letters", "late_letters", "metrics")
    )
    plan, spark, query, restore, start_positions, source_context = map(
        _state_field, ("plan", "spark", "query", "restore", "start_positions", "source_context")
    )
    standby_seconds, rehearsal_seconds = map(_state_field, ("standby_seconds", "rehearsal_seconds"))

    def __init__(
        self,
        config: ShardConfig,
        spark: Any | None = None,
        *,
        available_now: bool = False,
        drain_timeout: float = 90.0,
        rehearse: bool = True,
        catch_up: bool | None = None,
    ) -> None:
        self.io, self.state = open_shard(config)
        self.state.spark = spark
        self.available_now = available_now
        self.rehearse = rehearse and config.rehearse
        self.summary: dict[str, Any] | None = None
        self.last_committed = -1
        self.restarts_left = IN_PROCESS_RESTARTS
        self.window_late: WindowLateFinder | None = None  # a builtin window's, set at its first batch
        self._query_name = f"taskshard-{config.shard}-{uuid.uuid4().hex[:6]}"
        self._checked = False
        self._fail_batch = faults.fail_batch()
        self._stop_problem: EnvironmentProblem | None = None
        """Set when the source's batch guard stopped the query (e.g. ``PartitionCountChanged``); never retried."""
        self._listed_at = self._trigger_polled_at = 0.0
        self._guarded_at = self._fence_polled_at = time.monotonic()
        self._watermark_of = (-2, 0)
        self._wire(drain_timeout, catch_up)

    def _wire(self, drain_timeout: float, catch_up: bool | None) -> None:
        """The collaborators, each given the typed state and the few callbacks it needs."""
        io, state = self.io, self.state
        self.progress = Progress(io, state, self.session)
        self.snapshots = SnapshotWriter(io, state, self.progress, self.session)
        if catch_up is None:  # time needs the restore hand-over (docs/split-protocol.md, "Time across hand-overs")
            catch_up = io.source.supports_catch_up and not state.plan.uses_time
        self.handover_mode = HandoverMode.CATCH_UP if catch_up else HandoverMode.RESTORE
        """How this shard takes over as a split child (``catch_up`` None: what its source supports)."""
        calls = StandbyCalls(self.warm_up, self.stop_requested, lambda: self.drain_reason)
        self.as_child: ChildHandover | MergeHandover | None = None
        if io.config.restore_from is not None:
            self.as_child = ChildHandover(io, state, self.handover_mode, self.progress.positions_at, calls)
        elif io.config.merge_from is not None:
            self.as_child = MergeHandover(io, state, calls)  # a merge always restores (spark_runtime.merge)
        self.as_parent = ParentHandover(io, self.as_child, self.snapshots.write)
        self.drainer = Drain(
            io, state, self.as_parent, self.progress, self.snapshots, self.poll_after_stop, drain_timeout
        )
        self.state_map = StateMapper.for_shard(io, state, self.session)
        """Counts the state rows per key group now and then (:mod:`spark_runtime.state_map`), for ``by: state``."""

    # ---------------------------------------------------------------- requests

    def request_drain(self, reason: str = "request", *, final: bool = True) -> None:
        """Ask for a drain (thread- and signal-safe); ``run()`` performs it at the next poll. ``final=False`` (a
        SIGTERM alone) stops at a batch boundary with a savepoint and leaves the shard resumable."""
        self.drainer.request(reason, final=final)

    def stop_requested(self) -> bool:
        """A drain or stop was requested in this process (SIGTERM, ready children, a caller)."""
        return self.drainer.requested_here()

    @property
    def drain_reason(self) -> str:
        return self.drainer.reason

    def drain_requested(self) -> bool:
        return self.drainer.requested()

    @property
    def source_metrics(self) -> dict[str, int]:
        """Observed per-batch source metrics (Kafka), added up over this process's batches."""
        return self.progress.source_metrics

    @property
    def rows_processed(self) -> int:
        return self.progress.rows_processed

    # ---------------------------------------------------------------- start

    @property
    def already_drained(self) -> bool:
        """A valid drain summary of this shard exists (:func:`spark_runtime.handover.own_drain_summary`)."""
        return own_drain_summary(self.paths) is not None

    @property
    def dead_letter_total(self) -> int:
        return self.progress.dead_letter_total()

    def check_environment(self) -> None:
        """Preflight of every start (:meth:`spark_runtime.shard_state.ShardIO.check_environment`)."""
        self.io.check_environment()

    def check_recovery_log(self) -> None:
        """A shard the operator has seen commit batch N (``expectedBatch``) refuses to start from a recovery log
        that ends before N, missing (a wrong volume, a lifecycle rule) or older: it would silently start over
        and lose or recount what batches up to N did. Raises :class:`EnvironmentProblem` ``RecoveryLogMissing``
        (exit 3, the reason on the TaskShard) unless the user allowed a fresh start."""
        cfg = self.config
        if cfg.expected_batch is None or cfg.allow_fresh_start:
            return
        found = last_committed_batch(self.paths.checkpoint)
        if found >= cfg.expected_batch:
            return
        where = "is missing" if found < 0 else f"ends at batch {found}"
        raise EnvironmentProblem(
            "RecoveryLogMissing",
            "expectedBatch",
            f"the recovery log {self.paths.checkpoint} {where}, but batch {cfg.expected_batch} was committed "
            "before (the TaskShard's status.lastCheckpoint): starting over would lose or recount what those "
            "batches did. Restore the storage, or annotate the TaskShard taskshard.io/allow-fresh-start=true to "
            "start it over from its source's start positions on purpose",
        )

    def prepare(self) -> bool:
        """Everything before Spark: the drained check, the restore checks, ``lineage.json``. Returns False for
        a shard that drained before (its summary is then in ``self.summary``). Idempotent."""
        self.check_environment()
        drained = own_drain_summary(self.paths)
        if drained is not None:
            self.summary = drained
            log.info(
                "shard %s drained before (manifest %s); not processing again",
                self.config.shard,
                self.summary.get("manifest"),
            )
            return False
        cfg = self.config
        self.fence.claim()  # before anything is written: a runtime still writing this shard is fenced from here on
        self.metrics.set_writer_epoch(self.fence.epoch)
        if isinstance(self.sink, DirectorySinkWriter):
            self.sink.epoch = self.fence.epoch  # its pending batches in a directory of this epoch's own
        self.check_recovery_log()
        if cfg.ready_file:  # a container restarted in place keeps /tmp: not emitting until this run does
            Path(cfg.ready_file).unlink(missing_ok=True)
        self.paths.shard_dir.mkdir()
        marker = self.paths.drain_marker
        if marker.exists() and marker.read_text().startswith("stop"):
            log.info("shard %s: an earlier SIGTERM stop was interrupted; resuming", cfg.shard)
            marker.unlink()
        self.restore = None
        if self.as_child is not None:  # a split or merged child: its parents' manifests, slices and positions
            self.restore = plan_restore(
                cfg,
                self.plan,
                self.source,
                self.as_child.manifests(),
                self.s3,
                self.paths.restore_report_dir,
                resumed=last_committed_batch(self.paths.checkpoint) >= 0,
            )
            self.start_positions = self.restore.start_positions
            if self.plan.event_time is not None:  # never below the parents' final watermark
                floor = max(int(p.manifest.get("watermarkMs") or 0) for p in self.restore.slices)
                self.plan = dataclasses.replace(self.plan, watermark_floor_ms=floor)
        if self.plan.kind == "python":
            self._settle_state_schema()
            self._settle_time_mode()
        self._write_lineage()
        return True

    def _settle_state_schema(self) -> None:
        """The Python processor's state schema, checked against the one its state was written with before anything
        runs (rules: :mod:`spark_runtime.engine.schema`): a resumed shard's against ``state-schema.json``, a restored
        child's (before its first batch) against its parents' manifests (:func:`plan_restore`); recorded, with the
        retired names, in ``state-schema.json``. Raises :class:`TemplateRefused` (``StateSchemaIncompatible``)."""
        from spark_runtime.engine.schema import SchemaIncompatible, StateSchema

        record = self.paths.state_schema
        recorded = StateSchema.from_json(record.read_json()) if record.exists() else None
        committed = last_committed_batch(self.paths.checkpoint)
        assert self.plan.schema is not None
        if committed < 0:  # no state of its own yet: a fresh shard, or a child whose state is its parents' slices
            effective = self.restore.schema if self.restore is not None else self.plan.schema
        else:
            try:
                effective = self.plan.schema.evolve(recorded)
            except SchemaIncompatible as exc:
                raise TemplateRefused(
                    STATE_SCHEMA_INCOMPATIBLE,
                    "processor.python",
                    f"{exc}; the shard keeps its state and stays stopped until the Task's template changes",
                ) from None
        if recorded is None or recorded.to_json() != effective.to_json():
            self.fence.check("recording its state schema")
            record.write_json(effective.to_json())
        self.plan = dataclasses.replace(self.plan, schema=effective)

    def _settle_time_mode(self) -> None:
        """The checkpoint's ``timeMode`` (:attr:`spark_runtime.pipeline.Plan.time_mode`), recorded in
        ``time-mode.json`` at the first start (a checkpoint without the record predates time: ``None``). Spark
        refuses another one on restart, after the query started; this refuses it before anything runs.
        Raises :class:`TemplateRefused` (``TimeModeChanged``)."""
        record = self.paths.time_mode
        committed = last_committed_batch(self.paths.checkpoint)
        recorded = record.read_json()["timeMode"] if record.exists() else ("None" if committed >= 0 else None)
        wanted = self.plan.time_mode
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
            self.fence.check("recording its time mode")
            record.write_json({"timeMode": wanted})

    # ---------------------------------------------------------------- standby (a split child, spark_runtime.handover)

    def warm_up(self, rehearse: bool, should_stop: Callable[[], bool]) -> None:
        """Standby work (:mod:`spark_runtime.handover`): the SparkSession, the source/sink preflight and, with
        ``rehearse``, one rehearsal of the restore plan (cut short once ``should_stop()``)."""
        self.session()
        self._preflight()
        if rehearse and self.rehearse:
            from spark_runtime.rehearsal import rehearse as run_rehearsal

            self.rehearsal_seconds = run_rehearsal(self.spark, self.config, self.plan, should_stop=should_stop)

    def _preflight(self) -> None:
        if not self._checked:
            for part in (self.source, self.sink):
                if isinstance(part, ChecksEnvironment):
                    part.check(self.spark)
            self._checked = True

    def start(self) -> None:
        """Start the streaming query (fresh, restored or resumed). No-op for an already drained shard, and for a
        shard whose final drain began before this start (a pod restarted mid-drain, e.g. after its query failed on
        a poison record): it drains from the last committed batch without processing anything again."""
        if not self.prepare():
            return
        if self.drainer.final_pending() and not self.drainer.back_out_of_earlier():
            log.warning(
                "shard %s: its final drain began before this start; draining from the last committed batch "
                "without starting the query",
                self.config.shard,
            )
            return
        while True:
            try:
                self._start_query()
                self._mark_emitting()
                return
            except EnvironmentProblem:
                raise  # the pod's restarts (with back-off) retry it; the status shows why
            except Exception as exc:  # planning runs Python workers too (the source's schema and offsets)
                if self.restarts_left <= 0:
                    raise
                self.restarts_left -= 1
                log.warning(
                    "starting the streaming query failed (%s); retrying (%d retries left)",
                    str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__,
                    self.restarts_left,
                )
                time.sleep(RESTART_BACKOFF_SECONDS)

    def _start_query(self) -> None:
        cfg = self.config
        self.fence.check("starting its query")  # also every in-process restart: Spark writes its offset log
        self.session()
        self._preflight()
        self.progress.pin_start_positions()
        conf = cfg.spark.conf
        ctx = SourceContext(
            shard=cfg.shard,
            max_key_groups=cfg.max_key_groups,
            range_start=cfg.key_groups.start,
            range_end=cfg.key_groups.end,
            record_spec=self.plan.record_spec,
            dead_letter_dir=self.dead_letter_dir,
            drain_marker=self.paths.drain_marker,
            start_positions=self.start_positions,
            max_bytes_per_trigger=int(conf.get("spark.taskshard.maxBytesPerTrigger", "0")) or None,
            partition_bytes=int(conf.get("spark.taskshard.partitionBytes", str(32 * 1024 * 1024))),
            max_records_per_trigger=int(conf.get("spark.taskshard.maxRecordsPerTrigger", "0")) or None,
            grouping=cfg.key_grouping,
            read_partitions=cfg.partitions_to_read,
            catch_up_state=self.paths.catch_up if self.as_child is not None and self.as_child.state else None,
            skip=self.restore.skip if self.restore is not None else None,
            fenced_by=self.paths.epoch(self.fence.epoch + 1) if self.fence.epoch is not None else None,
        )
        self.source_context = ctx
        events = self.source.stream(self.spark, ctx)
        restore = self.restore
        seed = restore.seed_options if restore is not None else None
        if self.plan.kind == "python":
            from spark_runtime.engine import record_layout

            chosen = record_layout(
                self.paths.state_layout, last_committed_batch(self.paths.checkpoint), self.plan.state_buckets
            )
            self.plan = dataclasses.replace(self.plan, layout=chosen.layout, state_buckets=chosen.buckets)
        out = build_output_frame(self.spark, cfg, self.plan, events, seed, restore.skip if restore else None)
        writer = (
            out.writeStream.outputMode(output_mode(self.plan.window))
            .queryName(self._query_name)
            .option("checkpointLocation", self.paths.checkpoint.uri())
            .foreachBatch(self._write_batch)
        )
        writer = (
            writer.trigger(availableNow=True)
            if self.available_now
            else writer.trigger(processingTime=cfg.spark.trigger_interval)
        )
        self.last_committed = last_committed_batch(self.paths.checkpoint)
        self.metrics.on_commit(self.last_committed, committed_at=self.progress.commit_time(self.last_committed))
        if self.progress.batches_from is None:
            self.progress.batches_from = self.last_committed
        resumed = self.last_committed >= 0
        self.query = writer.start()
        self.progress.write(self.last_committed)  # at once (-1 for a new shard), for status displays
        log.info(
            "shard %s started: task=%s keyGroups=[%d, %d) processor=%s source=%s %s",
            cfg.shard,
            cfg.task,
            cfg.key_groups.start,
            cfg.key_groups.end,
            self.plan.state_format,
            self.source.kind,
            f"resumed after batch {self.last_committed}"
            if resumed
            else (f"restored from {self.restore.manifest_uri}" if self.restore is not None else "fresh"),
        )

    def _guard_while_idle(self) -> None:
        """Every :data:`GUARD_INTERVAL_SECONDS`, the source's guard; a mapping that no longer holds stops the query
        and raises (the pod exits 3 with the reason), as it would before the next batch."""
        if not isinstance(self.source, GuardsBatches) or time.monotonic() - self._guarded_at < GUARD_INTERVAL_SECONDS:
            return
        self._guarded_at = time.monotonic()
        self._fence_polled_at = time.monotonic()
        try:
            self.source.before_batch(self.spark, self.last_committed + 1)
        except EnvironmentProblem as problem:
            self._stop_problem = problem
            self.stop()
            raise

    def _write_late(self, df: Any, batch_id: int) -> Any:
        """The batch's late records (rows with ``_late``, :mod:`spark_runtime.engine.stateful`) written to
        ``late-b<batch>.jsonl`` (:mod:`spark_runtime.late`: a replay of the batch rewrites the same file, counted
        once); returns the result rows. ``df`` is cached by the caller, so the stateful operator runs once."""
        from pyspark.sql import functions as F

        from spark_runtime.engine.step import LATE

        letters = [r[0] for r in df.where(F.col(LATE).isNotNull()).select(LATE).collect()]
        if letters and self.late_letters is not None:
            self.fence.check(f"batch {batch_id}'s late records")
            self.late_letters.write(batch_id, letters)
        return df.where(F.col(LATE).isNull()).drop(LATE)

    def _write_batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``: the source's guard (a mapping that no longer holds stops the shard before anything of
        the batch is written or committed), then the sink."""
        if self._fail_batch is not None and int(batch_id) == self._fail_batch:
            raise RuntimeError(f"fault injection: batch {batch_id} fails ({faults.FAIL_BATCH_ENV})")
        try:
            self.fence.check(f"batch {batch_id}'s output")
            faults.pause_in_batch(int(batch_id))  # fencing tests only (spark_runtime.faults)
            if isinstance(self.source, GuardsBatches):
                self.source.before_batch(self.spark, int(batch_id))
        except EnvironmentProblem as problem:
            self._stop_problem = problem
            raise
        cached = None
        if self.plan.kind == "python" and self.plan.event_time is not None:
            cached = df.persist()
            df = self._write_late(cached, int(batch_id))
        try:
            self._emit(df, int(batch_id))
        finally:
            if cached is not None:
                cached.unpersist()
        if self.plan.window is not None:
            self._write_window_late(int(batch_id))

    def _window_late_finder(self, ctx: SourceContext) -> WindowLateFinder:
        """A builtin window's late-record finder (:mod:`spark_runtime.windows`)."""
        if not isinstance(self.source, ReadsRanges):  # journal and Kafka both can
            raise ConfigError([f"processor.window: the {self.source.kind} source cannot read a batch's range again"])
        return WindowLateFinder(self.config, self.plan, self.source, ctx, self.positions_at)

    def _write_window_late(self, batch_id: int) -> None:
        """A builtin window batch's late records to ``late-b<batch>.jsonl`` (after its output: Spark's count of
        dropped rows is complete then; before the commit, so a replay rewrites the same file)."""
        if self.window_late is None:  # the stream's context exists once the query started
            assert self.source_context is not None
            self.window_late = self._window_late_finder(self.source_context)
        query = self.query or next(q for q in self.spark.streams.active if q.name == self._query_name)
        letters = self.window_late.letters(self.spark, query, batch_id)
        if letters and self.late_letters is not None:
            self.fence.check(f"batch {batch_id}'s late records")
            self.late_letters.write(batch_id, letters)

    def _emit(self, df: Any, batch_id: int) -> None:
        """The batch's results to the sink (a catching-up child's into nothing, or only those past its parent's
        final positions), then the fence check."""
        emission = self.as_child.emission(int(batch_id)) if self.as_child is not None else Emission.ALL
        if emission == Emission.NONE:
            # Catching up: the parent emitted this input (spark_runtime.handover). The batch still runs to the
            # end (Spark commits the state stores only of a DataFrame executed in full), into nothing.
            df.write.format("noop").mode("overwrite").save()
        else:
            if emission == Emission.FROM_FENCE and self.plan.kind == "builtin":
                df = self._results_past_fence(df, int(batch_id))
            self.sink(df, batch_id)
        try:
            self.fence.check(f"Spark commits batch {batch_id}")
        except EnvironmentProblem as problem:
            self._stop_problem = problem
            raise

    def _results_past_fence(self, df: Any, batch_id: int) -> Any:
        """A builtin aggregation's results of the batch that reaches its parent's final positions, kept for the
        keys with a record at or after them (the batch's range read again; a Python processor's held records
        produce no output in the first place: :func:`spark_runtime.engine.step.split_held`)."""
        assert self.source_context is not None and isinstance(self.source, ReadsRanges)
        start, end = self.positions_at(batch_id - 1), self.positions_at(batch_id)
        records = self.source.read_range(self.session(), self.source_context, start, end)
        return results_past_fence(self.config, df, records)

    def session(self) -> Any:
        """The shard's SparkSession, started on first use (``spark.master`` and :meth:`spark_conf`)."""
        if self.spark is None:
            from spark_runtime.kubernetes import driver_conf
            from spark_runtime.session import spark_session

            # executors on Kubernetes: the in-cluster API server, the pod's credentials and address
            master, pod_conf = driver_conf(self.config.spark.master, os.environ)
            self.spark = spark_session(master, {**pod_conf, **self.spark_conf()})
        return self.spark

    def spark_conf(self) -> dict[str, str]:
        """The session's conf: s3a settings for ``storage.s3`` (credentials from the environment), then the
        user's ``spark.conf`` (which wins)."""
        conf: dict[str, str] = {}
        if self.config.storage.s3 is not None:
            conf.update(self.s3.hadoop_conf())
        conf.update(self.config.spark.conf)
        return conf

    def _write_lineage(self) -> None:
        cfg = self.config
        lineage = {
            "task": cfg.task,
            "shard": cfg.shard,
            "keyGroups": {"start": cfg.key_groups.start, "end": cfg.key_groups.end},
            "maxKeyGroups": cfg.max_key_groups,
            "parent": cfg.restore_from.parent if cfg.restore_from else None,
            "parents": [p.parent for p in cfg.parents],
            "restoreManifest": self.restore.manifest_uri if self.restore is not None else None,
            "parentBatchId": self.restore.slices[0].manifest["batchId"] if self.restore is not None else None,
            "sink": self.io.sink_description(),
        }
        if self.paths.lineage.exists():
            old = self.paths.lineage.read_json()
            if {k: old.get(k) for k in lineage} == lineage:
                return
        self.paths.lineage.write_json({**lineage, "createdAt": utc_now()})

    # ---------------------------------------------------------------- running

    def poll(self, *, check_failure: bool = True) -> None:
        """Log new batches, update ``progress.json`` and the dead-letter count; raise :class:`ShardFailed`
        when the query failed (unless ``check_failure`` is false). A runtime fenced meanwhile (a later writer epoch
        exists: it learns so every :data:`FENCE_POLL_SECONDS` even while idle, or from a write's check) stops its
        query and raises :class:`~spark_runtime.fencing.WriterFenced`."""
        if self.query is None:
            return
        try:
            self._poll(check_failure)
        except WriterFenced:
            if self.query is not None and self.query.isActive:
                self.query.stop()  # writes nothing (a stop is not a drain)
            raise

    def _poll(self, check_failure: bool) -> None:
        now = time.monotonic()
        if now - self._fence_polled_at >= (FENCE_POLL_SECONDS_S3 if self.storage.is_s3 else FENCE_POLL_SECONDS):
            self._fence_polled_at = now
            self.fence.check("its next batch")  # a source that admits nothing once fenced leaves it idle
        if check_failure:
            exc = self.query.exception()
            if exc is not None:
                if self._stop_problem is not None:  # the source's guard stopped the batch: not transient
                    raise self._stop_problem
                self._raise_processor_failure(str(exc))
                if self.restarts_left <= 0:
                    raise ShardFailed(f"streaming query failed: {exc}")
                # Same as a pod restart, without a new JVM: resume from the recovery log (exact). Covers
                # transient failures such as a Python worker that did not connect back in time on a
                # saturated host; a deterministic failure repeats and is raised once the budget is spent.
                self.restarts_left -= 1
                log.warning(
                    "streaming query failed (%s); restarting it from the recovery log (%d restarts left)",
                    str(exc).splitlines()[0][:300],
                    self.restarts_left,
                )
                self.metrics.on_restart()
                time.sleep(RESTART_BACKOFF_SECONDS)
                self._start_query()
                return
        self._guard_while_idle()
        new_dead = self.dead_letters.refresh() if self.dead_letters is not None else 0
        if new_dead:
            log.warning("%d new dead letters (total %d) in %s", new_dead, self.dead_letter_total, self.dead_letter_dir)
        batches, dead = self.progress.take_new_batches(self.query)
        new_dead += dead
        # A batch's progress is posted after its commit; on S3 the commit log is listed only then (or every few
        # seconds), not on every poll: a LIST request is not free.
        now = time.monotonic()
        if batches or new_dead or not self.storage.is_s3 or now - self._listed_at >= S3_LIST_INTERVAL_SECONDS:
            self._listed_at = now
            committed = last_committed_batch(self.paths.checkpoint)
            if committed > self.last_committed or new_dead:
                self.last_committed = committed
                self.progress.write(committed)
        self.progress.log_batches(batches)
        self._update_metrics()

    def _raise_processor_failure(self, error: str) -> None:
        """A query that failed in the user's processor (deterministic: a replay fails the same way) fails the shard
        at once with the user's exception, the call's key groups and the batch; the Python traceback's last frames
        go to the log."""
        from spark_runtime.engine.api import PROCESSOR_FAILED, processor_failure

        failure = processor_failure(error)
        if failure is None:
            return
        start = error.rfind("Traceback (most recent call last)")
        if start >= 0:
            frames = error[start:].splitlines()
            end = next((i for i, line in enumerate(frames) if "ProcessorFailed: " in line), len(frames) - 1)
            log.error("the processor failed:\n%s", "\n".join(frames[max(1, end - 24) : end + 1]))
        batch = last_committed_batch(self.paths.checkpoint) + 1
        raise ShardFailed(f"batch {batch}: {failure}", reason=PROCESSOR_FAILED, field="processor.python")

    def _update_metrics(self) -> None:
        """The live metrics of every poll (a batch's own come from ``on_batch`` in the progress loop)."""
        m = self.metrics
        m.on_commit(self.last_committed)
        m.set_dead_letters(self.dead_letter_total)
        if self.plan.event_time is not None:
            m.set_event_time(self.watermark_ms(), self.late_letters.total if self.late_letters else 0)
        m.set_emitting(bool(self.query.isActive) and not (self.as_child is not None and self.as_child.catching_up))
        self.progress.measure_journal_lag(self.last_committed)
        now = time.monotonic()
        if now - self._trigger_polled_at >= TRIGGER_POLL_SECONDS:
            self._trigger_polled_at = now
            status = self.query.status
            idle = status.get("message") in SPARK_BETWEEN_TRIGGERS and not status.get("isDataAvailable")
            m.on_trigger(bool(status.get("isTriggerActive")), idle_kafka=idle and self.config.source.kafka is not None)
        m.refresh()

    def watermark_ms(self) -> int:
        """The event-time watermark the next batch runs with (the last commit's, never below the shard's floor)."""
        from spark_runtime.checkpoint import next_watermark_ms

        if self.last_committed != self._watermark_of[0]:
            self._watermark_of = (self.last_committed, next_watermark_ms(self.paths.checkpoint, self.last_committed))
        return max(self._watermark_of[1], self.plan.watermark_floor_ms)

    def positions_at(self, batch_id: int) -> dict[str, Any]:
        """The source's end positions of committed ``batch_id`` (the start positions when -1)."""
        return self.progress.positions_at(batch_id)

    def run(self, poll_interval: float = 0.25) -> dict[str, Any]:
        """Start, process until a drain is requested (or, with ``available_now``, until caught up), drain, and
        return the summary. Raises :class:`ShardFailed` when the query fails. Serves the live metrics meanwhile
        (port ``metricsPort``, 0: none; on ``$TASKSHARD_METRICS_HOST``, or every address when unset); a port
        that cannot be bound raises :class:`EnvironmentProblem` ``MetricsPortInUse`` before anything starts."""
        self.metrics.start_server(os.environ.get(METRICS_HOST_ENV) or "0.0.0.0", self.config.metrics_port)
        try:
            return self._run(poll_interval)
        finally:
            self.metrics.stop_server()

    def _run(self, poll_interval: float) -> dict[str, Any]:
        try:
            self.start()
        except StandbyStopped as stopped:
            cfg = self.config
            log.info("shard %s: %s", cfg.shard, stopped)
            self.summary = StandbyStopSummary(cfg.task, cfg.shard).to_json()
            return self.summary
        if self.summary is not None:
            return self.summary
        set_log_phase("running")
        while True:
            # A requested drain comes first: it needs no healthy query (it exports the last committed batch).
            if not self.drain_requested():
                self.poll()
                self.follow_split()
            if not self.drain_requested():
                self.count_state_map()
                if self.available_now and not self.query.isActive:
                    self.poll()
                    self.request_drain("caught up (availableNow)")
            if self.drain_requested():
                summary = self.drain()
                if summary is not None:
                    return summary
                set_log_phase("running")  # the drain backed out (a successor was fenced): go on
            time.sleep(poll_interval)

    def follow_split(self) -> None:
        """One step of a split in progress (:mod:`spark_runtime.handover`): as a catch-up child, follow the
        parent; as a parent, answer the children and ask for the final drain once they are all ready."""
        if self.as_child is not None:
            self.as_child.tick()
            self._mark_emitting()
        reason = self.as_parent.tick()
        if reason is not None:
            self.request_drain(reason, final=True)

    def count_state_map(self) -> None:
        """Start a count of the state map when one is due (:mod:`spark_runtime.state_map`): not while catching up
        as a split child, handing over as a parent, or draining."""
        busy = (self.as_child is not None and self.as_child.catching_up) or self.as_parent.handing_over
        self.state_map.tick(self.last_committed, allowed=not busy and not self.drain_requested())

    def _mark_emitting(self) -> None:
        """Create ``readyFile`` (the pod's readiness) once the query runs and writes to the sink."""
        path = self.config.ready_file
        if not path or self.query is None or (self.as_child is not None and self.as_child.catching_up):
            return
        ready = Path(path)
        if not ready.exists():
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.touch()
            log.info("shard %s emits: ready", self.config.shard)

    # ---------------------------------------------------------------- drain (spark_runtime.drain)

    def drain(self) -> dict[str, Any] | None:
        """Drain (:mod:`spark_runtime.drain`); returns the summary and keeps it in ``summary`` (None: a final drain
        for successors backed out, the shard goes on). Idempotent."""
        self.summary = self.drainer.run()
        return self.summary

    def write_snapshot(self, batch_id: int, *, in_drain: bool = False) -> tuple[dict[str, Any], Loc]:
        """The snapshot of committed ``batch_id``: its manifest and where it is (:mod:`spark_runtime.snapshot.export`);
        also a parent's pre-copy while its query runs. Idempotent."""
        return self.snapshots.write(batch_id, in_drain=in_drain)

    def poll_after_stop(self) -> None:
        try:
            self.poll(check_failure=False)
        except Exception:  # progress is advisory; the drain goes on
            log.exception("could not update progress after stop")

    def stop(self) -> None:
        """Stop the query without draining (tests; a crash-like stop)."""
        if self.query is not None and self.query.isActive:
            self.query.stop()
        if isinstance(self.sink, DirectorySinkWriter):  # the committed batches become visible, nothing else
            self.sink.publish_committed(last_committed_batch(self.paths.checkpoint))
