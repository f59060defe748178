"""What a running shard has done: its batches' progress, its committed positions, ``progress.json``.

Spark reports every micro-batch in the query's progress (``recentProgress``: rows, durations, the source's
observed metrics); its checkpoint holds each committed batch's source end positions (the offset log). This
module reads both for the shard runtime and keeps the counts a shard reports:

- :meth:`Progress.take_new_batches`: the progress events of batches not seen yet (idle triggers skipped), their
  observed source metrics (Kafka: rows, bytes, dead letters) added up, the live metrics fed;
- :meth:`Progress.positions_at`: the concrete source positions at the end of a committed batch (a split child
  and a drain hand exactly these on);
- :meth:`Progress.write`: ``progress.json`` (batch, positions, dead letters, source counts), which the operator
  shows and a catching-up child follows (:mod:`spark_runtime.handover`);
- :meth:`Progress.refresh_metrics`: the live metrics of every poll (the journal's lag in bytes among them).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_runtime.checkpoint import last_committed_batch, next_watermark_ms, read_offsets
from spark_runtime.metrics import JOURNAL_LAG_INTERVAL_SECONDS, TRIGGER_POLL_SECONDS, journal_lag
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.snapshot import utc_now
from spark_runtime.sources import NamesFixedPositions, ResolvesStartPositions
from spark_runtime.sources.journal import JournalSource
from spark_runtime.sources.seed import is_seed_offset

if TYPE_CHECKING:
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = ["Progress", "offsets_mismatch"]

log = logging.getLogger("taskshard.shard")

SPARK_BETWEEN_TRIGGERS = ("Waiting for data to arrive", "Waiting for next trigger")
"""``query.status["message"]`` between triggers; with ``isDataAvailable`` false, the last trigger found nothing new
in the sources (not at start: "Initializing sources")."""
S3_LIST_INTERVAL_SECONDS = 5.0
"""With storage on S3, how often a poll lists the commit log when no new batch was reported."""


class Progress:
    """The progress bookkeeping of one shard runtime: its I/O, its run state (the start positions, which
    :meth:`pin_start_positions` writes) and ``session()``, its SparkSession started on first use."""

    def __init__(self, io: ShardIO, state: RunState, session: Callable[[], Any]) -> None:
        self.io = io
        self.state = state
        self.session = session
        self.source_metrics = {"rowsRead": 0, "bytesRead": 0, "deadLetters": 0}
        """Observed per-batch source metrics (Kafka), added up over this process's batches."""
        self.rows_processed = 0
        self.batches_from: int | None = None
        """The last batch committed before this runtime's first query start (its later batches are its own)."""
        self._seen: set[int] = set()
        self._lag_at = float("-inf")
        self._lag_positions: tuple[int, dict[str, Any]] | None = None
        """(batch id, its committed positions) behind the journal's lag, read again when the batch changes."""
        self._lag_failed = False
        self._verified = False
        """Whether this runtime compared its first committed batch with the offset log (:meth:`verify_offset_log`)."""
        self._trigger_polled_at = 0.0
        self._listed_at = 0.0
        self._watermark_of = (-2, 0)
        """(batch id, the watermark after it), read again when the batch changes."""

    def reported(self, batch_id: int) -> bool:
        """Whether ``batch_id``'s progress (and so its source metrics) was counted by this runtime."""
        return batch_id in self._seen

    def add_source_metrics(self, batch_id: int, metrics: dict[str, Any]) -> None:
        """Count ``batch_id``'s source metrics once (from its progress event or a recount)."""
        self._seen.add(batch_id)
        for name in self.source_metrics:
            self.source_metrics[name] += int(metrics.get(name) or 0)

    def take_new_batches(self, query: Any) -> tuple[list[dict[str, Any]], int]:
        """The progress of batches that ran since the last call (idle triggers report the *next* batch id and
        are skipped), and how many dead letters their observed source metrics name."""
        batches: list[dict[str, Any]] = []
        dead = 0
        for p in query.recentProgress:
            data = json.loads(p.json if isinstance(p.json, str) else p.json())
            bid = int(data.get("batchId", -1))
            ran = bool(data.get("numInputRows")) or "addBatch" in (data.get("durationMs") or {})
            if not ran or bid in self._seen:
                continue
            batches.append(data)
            if not self._verified:
                self.verify_offset_log(data)
            self.io.metrics.on_batch(data)
            observed = (data.get("observedMetrics") or {}).get("taskshard_source") or {}
            self.add_source_metrics(bid, observed)
            if observed.get("deadLetters"):
                dead += int(observed["deadLetters"])
                log.warning(
                    "batch %s: %s invalid records this shard owns were skipped (total %d)",
                    bid,
                    observed["deadLetters"],
                    self.dead_letter_total(),
                    extra={"batch": bid},
                )
        return batches, dead

    def verify_offset_log(self, progress: dict[str, Any]) -> None:
        """After this runtime's first committed batch: the offset log entry of that batch must hold the end offsets
        its own query reported (its progress event, posted after the commit), else another writer of this shard
        wrote the log (a fenced runtime that planned a batch before it noticed; on S3, Spark's "no overwrite" of a
        log entry is a check, then a copy). Raises :class:`~spark_runtime.problems.EnvironmentProblem`
        ``OffsetLogMismatch``: the shard stops before it writes anything more, rather than go on from positions it
        did not choose."""
        self._verified = True
        bid = int(progress.get("batchId", -1))
        try:
            logged = read_offsets(self.io.paths.checkpoint, bid)
        except (OSError, ValueError):
            return  # gone (a later batch's cleanup) or unreadable: nothing to compare
        mismatch = offsets_mismatch([s.get("endOffset") for s in progress.get("sources") or []], logged)
        if mismatch is not None:
            raise EnvironmentProblem(
                "OffsetLogMismatch",
                "storage",
                f"storage: the offset log of batch {bid} ({self.io.paths.checkpoint}/offsets/{bid}) does not "
                f"hold the positions this runtime's query committed it with ({mismatch}): another runtime of shard "
                f"{self.io.config.shard} wrote it. The shard stops rather than continue from positions it did "
                "not choose; check for a second runtime of this shard (its writer epochs are in epochs/)",
            )

    def log_batches(self, batches: list[dict[str, Any]]) -> None:
        for data in batches:
            rows = int(data.get("numInputRows") or 0)
            self.rows_processed += rows
            log.info(
                "batch %s: rows=%d rate=%.0f/s duration=%dms deadLetters=%d",
                data.get("batchId"),
                rows,
                float(data.get("processedRowsPerSecond") or 0.0),
                int((data.get("durationMs") or {}).get("triggerExecution", 0)),
                self.dead_letter_total(),
                extra={"batch": data.get("batchId")},
            )

    def positions_at(self, batch_id: int) -> dict[str, Any]:
        """The source's end positions of committed ``batch_id`` (the start positions when -1)."""
        r = self.io
        if batch_id < 0:
            self.pin_start_positions()  # no-op once pinned, and for a child (its parent's positions)
            if self.state.start_positions is not None:
                return dict(self.state.start_positions)
            names = r.source.positions_names() if isinstance(r.source, NamesFixedPositions) else []
            return {name: 0 for name in names}
        for entry in read_offsets(r.paths.checkpoint, batch_id):
            if entry is not None and not is_seed_offset(entry) and r.source.owns_offset(entry):
                return dict(entry)
        raise RuntimeError(f"{r.paths.checkpoint}/offsets/{batch_id} has no {r.source.kind} offsets")

    def pin_start_positions(self) -> None:
        """A fresh shard of a source whose start depends on when it is asked (Kafka's ``earliest``/``latest``)
        resolves it once, persists it (``start-positions.json``) and starts its query exactly there; every later
        start reads the same file. So the positions of batch -1, which a drain before the first commit hands to
        the children, are concrete offsets, never "latest" as each child would see it. A split child already
        starts at its parent's positions."""
        r = self.io
        if self.state.start_positions is not None or not isinstance(r.source, ResolvesStartPositions):
            return
        pinned = r.paths.start_positions
        if pinned.exists():
            positions = pinned.read_json()
        else:
            positions = r.source.resolve_start_positions(self.session())
            r.source.validate_positions(positions)
            r.paths.shard_dir.mkdir()
            r.fence.check("start-positions.json")
            if pinned.create_exclusive_json(positions):
                log.info("shard %s: start positions resolved and pinned: %s", r.config.shard, positions)
            else:  # pinned by an earlier runtime of this shard in the meantime: those are the positions
                positions = pinned.read_json()
        self.state.start_positions = dict(positions)

    def dead_letter_total(self) -> int:
        """Every dead letter this shard counted: the source's files, the late records and, for Kafka, the counts
        its batches observed."""
        files = self.io.dead_letters.total if self.io.dead_letters is not None else 0
        late = self.io.late_letters.total if self.io.late_letters is not None else 0
        return files + late + int(self.source_metrics["deadLetters"])

    def commit_time(self, batch_id: int) -> float | None:
        """Unix time of committed ``batch_id``'s commit log entry (None: no batch, or unknown)."""
        if batch_id < 0:
            return None
        entry = self.io.paths.checkpoint / "commits" / str(batch_id)
        try:
            mtime = entry.fs.get_file_info(entry.path).mtime
        except Exception:  # advisory (a display value)
            return None
        return mtime.timestamp() if mtime is not None else None

    def write(self, batch_id: int) -> None:
        """``progress.json`` for committed ``batch_id`` (-1: none yet)."""
        r = self.io
        r.fence.check("progress.json")
        r.paths.progress.write_json(
            {
                "task": r.config.task,
                "shard": r.config.shard,
                "batchId": batch_id,
                "time": utc_now(),
                "positions": self.positions_at(batch_id),
                "deadLetters": self.dead_letter_total(),
                "source": dict(self.source_metrics),
            },
            fsync=False,
        )

    def poll(self, query: Any, last_committed: int, *, emitting: bool) -> int:
        """One poll of the running ``query`` (``emitting``: the shard writes to its sink): new dead letters and
        batches counted and logged, ``progress.json`` written when a batch committed since ``last_committed`` (or
        dead letters came), the live metrics refreshed. Returns the last committed batch."""
        dead_letters = self.io.dead_letters
        new_dead = dead_letters.refresh() if dead_letters is not None else 0
        if new_dead:
            total, where = self.dead_letter_total(), self.io.dead_letter_dir
            log.warning("%d new dead letters (total %d) in %s", new_dead, total, where)
        batches, dead = self.take_new_batches(query)
        new_dead += dead
        # A batch's progress is posted after its commit; on S3 the commit log is listed only then (or every few
        # seconds), not on every poll: a LIST request is not free.
        now = time.monotonic()
        if batches or new_dead or not self.io.storage.is_s3 or now - self._listed_at >= S3_LIST_INTERVAL_SECONDS:
            self._listed_at = now
            committed = last_committed_batch(self.io.paths.checkpoint)
            if committed > last_committed or new_dead:
                last_committed = committed
                self.write(committed)
        self.log_batches(batches)
        self.refresh_metrics(query, last_committed, emitting=emitting)
        return last_committed

    def refresh_metrics(self, query: Any, last_committed: int, *, emitting: bool) -> None:
        """The live metrics of every poll (a batch's own come from :meth:`take_new_batches`): the last commit, the
        dead letters, the watermark and late records, whether the shard emits, the journal's lag, and (every
        :data:`~spark_runtime.metrics.TRIGGER_POLL_SECONDS`) whether a trigger runs or the query idles."""
        m, late = self.io.metrics, self.io.late_letters
        m.on_commit(last_committed)
        m.set_dead_letters(self.dead_letter_total())
        if self.state.plan.event_time is not None:
            m.set_event_time(self.watermark_ms(last_committed), late.total if late is not None else 0)
        m.set_emitting(bool(query.isActive) and emitting)
        self.measure_journal_lag(last_committed)
        now = time.monotonic()
        if now - self._trigger_polled_at >= TRIGGER_POLL_SECONDS:
            self._trigger_polled_at = now
            status = query.status
            idle = status.get("message") in SPARK_BETWEEN_TRIGGERS and not status.get("isDataAvailable")
            kafka = self.io.config.source.kafka is not None
            m.on_trigger(bool(status.get("isTriggerActive")), idle_kafka=idle and kafka)
        m.refresh()

    def watermark_ms(self, last_committed: int) -> int:
        """The event-time watermark the batch after ``last_committed`` runs with (that commit's, never below the
        shard's floor)."""
        if last_committed != self._watermark_of[0]:
            self._watermark_of = (last_committed, next_watermark_ms(self.io.paths.checkpoint, last_committed))
        return max(self._watermark_of[1], self.state.plan.watermark_floor_ms)

    def measure_journal_lag(self, batch_id: int) -> None:
        """At most every :data:`~spark_runtime.metrics.JOURNAL_LAG_INTERVAL_SECONDS`: the journal's lag in bytes,
        each partition file's complete end minus committed ``batch_id``'s position. Advisory: a failure is
        logged once and the metric stays as it was."""
        r = self.io
        now = time.monotonic()
        if not isinstance(r.source, JournalSource) or now - self._lag_at < JOURNAL_LAG_INTERVAL_SECONDS:
            return
        self._lag_at = now
        try:
            if self._lag_positions is None or self._lag_positions[0] != batch_id:
                self._lag_positions = (batch_id, self.positions_at(batch_id))
            r.metrics.set_lag("bytes", journal_lag(r.source.path, self._lag_positions[1]))
        except Exception:
            if not self._lag_failed:
                log.warning("could not measure the journal's lag (the metric stays as it was)", exc_info=True)
            self._lag_failed = True


def offsets_mismatch(reported: list[Any], logged: list[Any]) -> str | None:
    """How the end offsets a query reported for a batch (its progress event's ``sources[].endOffset``, JSON text
    or objects, in source order) differ from the batch's offset log entry (:func:`read_offsets`), or None when
    they are the same."""
    if len(reported) != len(logged):
        return f"{len(reported)} sources reported, {len(logged)} logged"
    for i, (mine, theirs) in enumerate(zip(reported, logged, strict=True)):
        if isinstance(mine, str):
            try:
                mine = json.loads(mine)
            except ValueError:
                continue  # a source whose offset is not JSON: not comparable
        if mine is not None and theirs is not None and mine != theirs:
            return (
                f"source {i}: reported {json.dumps(mine, sort_keys=True)}, logged {json.dumps(theirs, sort_keys=True)}"
            )
    return None
