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
(:meth:`ShardRunner.follow_split` in its poll loop; the parent's side exports its pre-copy with the snapshot
writer, and :mod:`spark_runtime.batch_output` applies the child's emission rule in ``foreachBatch``). A SIGTERM on
standby exits 0 (event ``stopped``, nothing processed).

A *final* drain (a split's hand-over) is sticky: the shard never processes again, because its children own its
key groups from then on. A SIGTERM on its own (pod deletion for a template roll, a node drain, an eviction) runs
the same steps 1-6 (a savepoint snapshot and manifest) but is not final: step 7 writes no ``drained.json`` and
removes the drain marker, so the next pod resumes from the recovery log (and a hand-over in progress goes on).

Recovery: the Spark checkpoint is the recovery log. A restart with the same config (after SIGKILL, OOM, node
loss) resumes from the last committed batch: an uncommitted batch is replayed with the offsets Spark logged for
it, against the state of the previous commit, and its sink file is rewritten with the same content.

The runner is the supervisor of collaborators that share the shard's typed state (:mod:`spark_runtime.shard_state`)
and get a few callbacks each: what is settled before the query starts (:mod:`spark_runtime.preparation`), what a
batch writes (:mod:`spark_runtime.batch_output`), batches, positions, ``progress.json`` and the live metrics
(:mod:`spark_runtime.progress`), the drain (:mod:`spark_runtime.drain`: the steps and what a crash in each leaves
behind), snapshots (:mod:`spark_runtime.snapshot`), the hand-overs. The runner prepares the start, starts the query
(and restarts it in-process from the recovery log after a transient failure), polls, and calls those in turn.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_runtime import preparation
from spark_runtime.batch_output import BatchOutput
from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.config import ShardConfig
from spark_runtime.drain import Drain
from spark_runtime.fencing import WriterFenced
from spark_runtime.handover import ChildHandover, ParentHandover, StandbyCalls, StandbyStopped, own_drain_summary
from spark_runtime.live import METRICS_HOST_ENV
from spark_runtime.logs import set_phase as set_log_phase
from spark_runtime.merge import MergeHandover
from spark_runtime.pipeline import build_output_frame
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.progress import Progress
from spark_runtime.protocol import Emission, HandoverMode, StandbyStopSummary
from spark_runtime.shard_state import open_shard
from spark_runtime.sink import DirectorySinkWriter
from spark_runtime.snapshot.export import SnapshotWriter
from spark_runtime.sources import ChecksEnvironment
from spark_runtime.state_map import StateMapper
from spark_runtime.storage import Loc
from spark_runtime.windows import output_mode

__all__ = ["ShardFailed", "ShardRunner", "StandbyStopped", "summary_message"]

log = logging.getLogger("taskshard.shard")

RESTART_BACKOFF_SECONDS = 2.0
HEARTBEAT_SECONDS = 5.0
"""The heartbeat file (``heartbeatFile``) is touched at most this often while the poll loop runs."""
IN_PROCESS_RESTARTS = 3
"""How often a failed query is restarted in-process (from its checkpoint) before the shard gives up (exit 1)."""
FENCE_POLL_SECONDS = 1.0
"""How often an idle runtime looks for a later writer epoch (a stat); a fenced one stops and exits."""
FENCE_POLL_SECONDS_S3 = 5.0
"""The same on S3 (a HEAD request)."""
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


def _processor_failure(error: str, checkpoint: Loc) -> ShardFailed | None:
    """A query that failed in the user's processor (deterministic: a replay fails the same way) fails the shard at
    once with the user's exception, the call's key groups and the batch; the Python traceback's last frames go to
    the log. None for any other failure."""
    from spark_runtime.engine.api import PROCESSOR_FAILED, processor_failure

    failure = processor_failure(error)
    if failure is None:
        return None
    start = error.rfind("Traceback (most recent call last)")
    if start >= 0:
        frames = error[start:].splitlines()
        end = next((i for i, line in enumerate(frames) if "ProcessorFailed: " in line), len(frames) - 1)
        log.error("the processor failed:\n%s", "\n".join(frames[max(1, end - 24) : end + 1]))
    batch = last_committed_batch(checkpoint) + 1
    return ShardFailed(f"batch {batch}: {failure}", reason=PROCESSOR_FAILED, field="processor.python")


def _emits_all(batch_id: int) -> Emission:
    """The emission rule of a shard that is no one's successor (or no longer waits for its parents)."""
    return Emission.ALL


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
        self._query_name = f"taskshard-{config.shard}-{uuid.uuid4().hex[:6]}"
        self._checked = False
        self._fence_polled_at = time.monotonic()
        self._beat_at = 0.0
        self._published_through = -1
        self._wire(drain_timeout, catch_up)

    def _wire(self, drain_timeout: float, catch_up: bool | None) -> None:
        """The collaborators, each given the typed state and the few callbacks it needs."""
        io, state = self.io, self.state
        self.progress = Progress(io, state, self.session)
        self.snapshots = SnapshotWriter(io, state, self.progress, self.session)
        if catch_up is None:  # time and TTL need the restore hand-over (ExecutionPlan.hands_over_by_restore)
            catch_up = io.source.supports_catch_up and not state.plan.hands_over_by_restore
        self.handover_mode = HandoverMode.CATCH_UP if catch_up else HandoverMode.RESTORE
        """How this shard takes over as a split child (``catch_up`` None: what its source supports)."""
        calls = StandbyCalls(self.warm_up, self.stop_requested, lambda: self.drainer.reason)
        self.as_child: ChildHandover | MergeHandover | None = None
        if io.config.restore_from is not None:
            self.as_child = ChildHandover(io, state, self.handover_mode, self.progress.positions_at, calls)
        elif io.config.merge_from is not None:
            self.as_child = MergeHandover(io, state, self.handover_mode, self.progress.positions_at, calls)
        self.as_parent = ParentHandover(io, self.as_child, self.snapshots.write)
        self.drainer = Drain(
            io, state, self.as_parent, self.progress, self.snapshots, self.poll_after_stop, drain_timeout
        )
        self.state_map = StateMapper.for_shard(io, state, self.session)
        """Counts the state rows per key group now and then (:mod:`spark_runtime.state_map`), for ``by: state``."""
        emission = self.as_child.emission if self.as_child is not None else _emits_all
        self.output = BatchOutput(io, state, emission, self.progress.positions_at, self.session, self._query_name)
        """The query's ``foreachBatch`` (:mod:`spark_runtime.batch_output`)."""

    # ---------------------------------------------------------------- requests

    def request_drain(self, reason: str = "request", *, final: bool = True) -> None:
        """Ask for a drain (thread- and signal-safe); ``run()`` performs it at the next poll. ``final=False`` (a
        SIGTERM alone) stops at a batch boundary with a savepoint and leaves the shard resumable."""
        self.drainer.request(reason, final=final)

    def stop_requested(self) -> bool:
        """A drain or stop was requested in this process (SIGTERM, ready children, a caller)."""
        return self.drainer.requested_here()

    def drain_requested(self) -> bool:
        return self.drainer.requested()

    # ---------------------------------------------------------------- start

    @property
    def already_drained(self) -> bool:
        """A valid drain summary of this shard exists (:func:`spark_runtime.handover.own_drain_summary`)."""
        return own_drain_summary(self.paths) is not None

    def check_recovery_log(self) -> None:
        """:func:`spark_runtime.preparation.check_recovery_log`."""
        preparation.check_recovery_log(self.io)

    def prepare(self) -> bool:
        """Everything before Spark: the drained check, the restore checks, ``lineage.json``. Returns False for
        a shard that drained before (its summary is then in ``self.summary``). Idempotent."""
        self.io.check_environment()
        drained = own_drain_summary(self.paths)
        if drained is not None:
            self.summary = drained
            log.info(
                "shard %s drained before (manifest %s); not processing again",
                self.config.shard,
                self.summary.get("manifest"),
            )
            return False
        preparation.claim_shard(self.io)
        preparation.settle_restore(self.io, self.state, self.as_child)
        if self.plan.kind == "python":
            preparation.settle_state_schema(self.io, self.state)
            preparation.settle_time_mode(self.io, self.state)
        preparation.write_lineage(self.io, self.state)
        return True

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
        ctx = preparation.stream_context(self.io, self.state, self.as_child)
        self.source_context = ctx
        events = self.source.stream(self.spark, ctx)
        restore = self.restore
        seed = restore.seed_options if restore is not None else None
        preparation.settle_record_layout(self.io, self.state)
        out = build_output_frame(
            self.spark,
            cfg,
            self.plan,
            events,
            seed,
            restore.skip if restore else None,
            restore.boundary if restore else None,
        )
        writer = (
            out.writeStream.outputMode(output_mode(self.plan.window))
            .queryName(self._query_name)
            .option("checkpointLocation", self.paths.checkpoint.uri())
            .foreachBatch(self.output.write)
        )
        writer = (
            writer.trigger(availableNow=True)
            if self.available_now
            else writer.trigger(processingTime=cfg.spark.trigger_interval)
        )
        preparation.check_state_committed(self.io)  # every start: a commit log ahead of the state stops here
        self.last_committed = last_committed_batch(self.paths.checkpoint)
        self.metrics.on_commit(self.last_committed, committed_at=self.progress.commit_time(self.last_committed))
        if self.progress.batches_from is None:
            self.progress.batches_from = self.last_committed
        self.query = writer.start()
        self.progress.write(self.last_committed)  # at once (-1 for a new shard), for status displays
        log.info(
            "shard %s started: %s", cfg.shard, preparation.describe_start(self.io, self.state, self.last_committed)
        )

    def _guard_while_idle(self) -> None:
        """The source's guard while no batch runs (:meth:`BatchOutput.guard_idle
        <spark_runtime.batch_output.BatchOutput.guard_idle>`); a mapping that no longer holds stops the query and
        raises (the pod exits 3 with the reason), as it would before the next batch."""
        try:
            self.output.guard_idle(self.last_committed + 1)
        except EnvironmentProblem:
            self.stop()
            raise

    def session(self) -> Any:
        """The shard's SparkSession, started on first use
        (:meth:`spark_runtime.shard_state.ShardIO.start_session`)."""
        if self.spark is None:
            self.spark = self.io.start_session()
        return self.spark

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
                if self.output.stop_problem is not None:  # the source's guard stopped the batch: not transient
                    raise self.output.stop_problem
                failed = _processor_failure(str(exc), self.paths.checkpoint)
                if failed is not None:
                    raise failed
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
        catching_up = self.as_child is not None and self.as_child.catching_up
        self.last_committed = self.progress.poll(self.query, self.last_committed, emitting=not catching_up)
        if isinstance(self.sink, DirectorySinkWriter) and self.last_committed > self._published_through:
            self.sink.publish_through(self.last_committed)  # visible now, not when the next batch starts
            self._published_through = self.last_committed

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
            self._beat()
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
                self._end_heartbeat()  # a drain's export is bounded by the pod's grace period, not the probe
                summary = self.drain()
                if summary is not None:
                    return summary
                set_log_phase("running")  # the drain backed out (a successor was fenced): go on
            time.sleep(poll_interval)

    def _beat(self) -> None:
        """The poll loop runs: the heartbeat gauge now, the heartbeat file (``heartbeatFile``, the liveness probe's)
        at most every :data:`HEARTBEAT_SECONDS`."""
        now = time.time()
        self.metrics.beat(now)
        path = self.config.heartbeat_file
        if path and now - self._beat_at >= HEARTBEAT_SECONDS:
            self._beat_at = now
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()

    def _end_heartbeat(self) -> None:
        """A drain or stop begins: no heartbeat file (the liveness probe passes without one), so a long export is
        never restarted mid-way; the next beat, should the drain back out, writes it again."""
        self._beat_at = 0.0
        if self.config.heartbeat_file:
            Path(self.config.heartbeat_file).unlink(missing_ok=True)

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
        if self.query is not None and not (self.as_child is not None and self.as_child.catching_up):
            self.io.mark_ready()

    # ---------------------------------------------------------------- drain (spark_runtime.drain)

    def drain(self) -> dict[str, Any] | None:
        """Drain (:mod:`spark_runtime.drain`); returns the summary and keeps it in ``summary`` (None: a final drain
        for successors backed out, the shard goes on). Idempotent."""
        self.summary = self.drainer.run()
        return self.summary

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
